"""Decode (few rows per group) block-scaled matmul: stream each weight once at full rate.

The MoE decode regime (T <= 128 tokens, a few rows per expert) and the dense matmul at small
M are memory bound: the floor is reading the FP4/FP8 weights and their scales once. The
tensor-core kernels tile 64 rows per CTA and waste most of it there; this kernel instead
walks the weights with 16-byte loads (4 per lane, issued a window ahead) and does the few
rows' dot products with exact f16x2 FMAs (FP4) or FP32 FMAs (MXFP8) against activations
decoded once per CTA into shared memory. See :mod:`blockscale.ops._decode_ir` for the kernel
and why it meets the fp32 bound of tests/test_matmul_common.py.

* Grouped (SEMANTICS §5, D8, D10): the portable grouped kernel's arguments plus
  ``group_list``; grid ``(ceil(N/32), len(group_list))``: CTA (x, y) computes columns
  ``[32x, 32x+32)`` of group ``group_list[y]``'s rows. The host passes the non-empty groups
  when ``expert_start`` is a numpy array (decode: most of the E groups are empty), else all;
  groups with id -1 write zeros (D8).
* Dense (§4.1): the portable dense kernel's arguments (no epilogue); one group.

Variants (``DecodeSpec.variant``, the ``variant=`` keyword of the direct calls):
``"simt"`` (above; every format), ``"mma_x8"`` / ``"mma_x8n2"`` (MXFP8: swap-AB ``mma.sync``
on E4M3 -> f16 operands, one / two n8-tiles a pass; the dispatch's MXFP8 kernels but for dense
M = 1, :func:`mx8_variant`; :mod:`blockscale.ops._decode_mx8_ir`)
and ``"mma"`` (FP4: swap-AB ``mma.sync`` with the weights as
the MMA's M side, 64 columns per 128-thread CTA, weights streamed a 256-byte step ahead
through registers into shared memory; cost per weight byte independent of the rows, result
bit-identical to the portable kernel; :mod:`blockscale.ops._decode_mma_ir`), its variants
"mma2", "mma_p" (cheaper E2M1 -> f16 decode, ~19 % fewer instructions per step, the same
values), "mma_p5" ("mma_p" at 5 CTAs per SM; grouped) and "mma_psk" ("mma_p" with K split
over grid.z), the conflict-free "mma_c*" family and its per-tile-overhead variants
"mma_c8t" / "mma_c8s2" / "mma_c8s4" / "mma_c8d2", the persistent grouped "mma_c8w" /
"mma_c8r" / "mma_c8r4" (one wave of CTAs walking work units; the last two with a TMA ring of
weights), see :data:`VARIANTS`; the dispatch-only
:data:`LEAN_AUTO` (the dense default) runs the lean NVFP4 kernels "mma_leanb_t<T>_n<NT>"
(:func:`lean_variant`; :mod:`blockscale.ops._decode_lean_ir`) where they take the case, else
the one-shot ones; the dispatch-only
:data:`AUTO_VARIANT` picks among "mma_c8t" / "mma_c8s2" / "mma_c8s4" by the grid. The
dispatch runs ``BLOCKSCALE_DECODE_VARIANT`` (default :data:`DEFAULT_VARIANT`, grouped
:data:`GROUPED_DEFAULT_VARIANT`) for FP4; with "mma_p", grids of at most
:func:`split_k_max_ctas` CTAs run "mma_psk" (default 0: off).

Split K ("mma_psk"): split z of S sums its K steps from zero, writes fp32 partials to a
workspace, and the CTA arriving last at a tile (an atomic counter per tile) adds them in
split order 0..S-1 (deterministic) and resets the counter. The host side does no memset per
call: the partials come from the stream-ordered allocator (every split writes all
of its partials before any is read), the counters from a buffer zeroed once per (device,
stream) and left at zero by every launch (:func:`split_k_counters`).

Dispatch: registered first in ``matmul_grouped.FAST_PATHS`` and ``matmul.FAST_PATHS``. The
grouped runner takes the decode kernel when the largest group has <= :data:`MAX_ROWS` rows
(known when ``expert_start`` is a numpy array; for a device array, when T <= MAX_ROWS), else
it hands over to the next fast path (the sm_90a tensor-core kernel) or the portable kernel;
the dense one when M <= MAX_ROWS. ``BLOCKSCALE_DECODE=0`` disables both. FP4 needs
K % 32 == 0 and MXFP8 K % 16 == 0 (16-byte weight rows). Importing this module does not
import MLIR.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import matmul as _matmul
from blockscale.ops import matmul_grouped as _grouped

KERNEL_SOURCES = ("blockscale.ops._decode_ir", "blockscale.ops._decode_mma_ir",
                  "blockscale.ops._matmul_ir", "blockscale.ops._mma_ir",
                  "blockscale.ops._decode_shot_ir", "blockscale.ops._decode_lean_ir",
                  "blockscale.ops._decode_solo_ir", "blockscale.ops._decode_mx8_ir")
#: targets the dispatch uses it on (the IR is portable to every 32-lane target)
TARGETS = ("sm_90a",)
IR_TARGETS = ("sm_90a", "sm_100a")
#: largest group (rows) the decode kernel takes: <= 4 passes of 4 rows over the weights
MAX_ROWS = 16
ENV_SWITCH = "BLOCKSCALE_DECODE"
THREADS = 256
#: register cap (nvvm.maxnreg): 2 CTAs of 256 threads per SM
MAX_REGISTERS = 128
#: output columns per CTA (_decode_ir.COLS)
COLS = 32
#: kernel variants: "simt" (FMAs per row, every format), "mma" (FP4: swap-AB mma.sync, the
#: weights as the MMA's M side, one 16 KB step in flight per CTA; _decode_mma_ir), "mma2"
#: (the same, two steps in flight: 32 KB per CTA, 3 CTAs per SM), "mma_p" ("mma" with the
#: prmt decode: E2M1 -> f16 in ~1.4 ALU ops an element instead of
#: ~1.9, NVFP4 weight scales by cvt.rn.f16x2.e4m3x2; the same values: bit-identical),
#: "mma_p5" ("mma_p" under 96 registers: 5 CTAs (20 warps) per SM instead of 4, ~35 L1
#: spill reloads per step; for latency hiding: the mma kernels issue at ~1.7 IPC per SM),
#: "mma_psk" ("mma_p" with K split over grid.z: fp32 partials, summed in split order by the
#: last CTA; :func:`split_k_p` splits; cached counters). The split "mma" ("mma_sk") was
#: removed: slower than "mma" everywhere (run H) and than "mma_psk" (run L: NVFP4 gpt-oss
#: T=1 0.0483 vs 0.0386 ms, DeepSeek-V3 T=1 0.089 vs 0.0767 ms).
#: "mma_c" ("mma_p" with conflict-free shared stores and 8-byte weight scale loads), "mma_c8"
#: ("mma_c" in passes of 8 rows: one n-tile, no spills at 128 registers; groups of 9-16 rows
#: stream the weights twice), "mma_c85" / "mma_c86" ("mma_c8" under 96 / 80 registers: 5 / 6
#: CTAs per SM, grouped; 6 / 22 spill reloads per step); _decode_mma_ir._Staging
#: "mma_c8t" ("mma_c8" with the last K step peeled off the loop: no prefetch past the end,
#: unit pairs past the row end skipped; K = 2880: 5.625 steps computed, not 6)
#: "mma_c8t1" (FP4, grouped: "mma_c8t"'s step and tail in passes of one row each, 8 blocks
#: on the MMA's N side on a block-diagonal B: one FFMA fold per accumulator and 8 blocks
#: instead of one a block; _decode_solo_ir; within the fp32 bound, not the portable kernel's
#: bits; the dispatch runs it where every group holds one row, :func:`one_row_groups`)
#: "mma_c8s2" / "mma_c8s4" ("mma_c8t" over 2 / 4 column slices per CTA in turn, the next
#: slice's first step fetched during the current slice's last step: 128 / 256 columns a CTA),
#: "mma_c8d2" ("mma_c8t" with two steps in flight, 168 registers: 3 CTAs per SM; for grids
#: under one wave)
#: "mma_c8w" (grouped: "mma_c8t" in persistent CTAs walking (group, 64-column tile, 8-row
#: pass) work units, the next unit's first step fetched during the current unit's last
#: step; one wave of CTAs; _decode_stream_ir), "mma_c8r" / "mma_c8r4" ("mma_c8w" with the
#: weights streamed through a shared ring of 3 / 4 stages by cp.async.bulk, 2 / 3 steps
#: ahead across units; 3 / 2 CTAs per SM)
#: "mma_shot" / "mma_shot7k" / "mma_shot16" / "mma_shot32" (16 columns a CTA (32 for
#: "mma_shot32"), the CTA's whole weight slice and the pass's activation rows copied by
#: cp.async.bulk at once into shared memory, the 4 warps (8) on K slices, their fp32
#: partials added in warp order: deterministic, not bit-identical to the portable kernel;
#: K <= :data:`SHOT_KCAP`, passes of :data:`SHOT_TOKENS` rows; _decode_shot_ir)
VARIANTS = ("simt", "mma", "mma2", "mma_p", "mma_p5", "mma_psk", "mma_c", "mma_c8", "mma_c85",
            "mma_c86", "mma_c8t", "mma_c8t1", "mma_c8s2", "mma_c8s4", "mma_c8d2", "mma_c8w",
            "mma_c8r", "mma_c8r4", "mma_shot", "mma_shot7k", "mma_shot16", "mma_shot32",
            "mma_shot6", "mma_shot1", "mma_x8", "mma_x8n2")
#: the MXFP8 tensor-core variants ("mma_x8": swap-AB mma.sync on E4M3 -> f16 operands, 64
#: columns a CTA, passes of 8 rows, K steps of 256; "mma_x8n2": passes of 16 rows, 2 n8-tiles
#: sharing each weight fragment, 168 registers; _decode_mx8_ir) and their n-tiles
MX8_VARIANTS = ("mma_x8", "mma_x8n2")
MX8_NTILES = {"mma_x8": 1, "mma_x8n2": 2}
#: the lean dense variants "mma_leanb_t<T>_n<NT>" (NVFP4, dense, M <= T; _decode_lean_ir):
#: the tokens on the MMA's M side, NT n8-tiles of weight rows a CTA (8 NT columns), the block
#: scales folded into f16 operands, the CTA's rows copied into shared memory by cp.async.bulk
#: (a copy a row and round, an mbarrier a round: warp w takes unit 16 j + w of round j, so
#: every warp computes while later rounds land; :func:`lean_rounds`), 16 warps on K units of
#: 64 codes (128 registers), K <= LEAN_KCAP; "mma_leanb_t<T>_n<NT>_k7168" the same with rows
#: of K <= LEAN_LONG_KCAP (DeepSeek-V3's K = 7168; NT <= 5: the rows of a CTA fit 227 KB).
#: (The "b" is the bulk copies: session 14's first form "mma_lean_*" loaded the rows into
#: registers; slower everywhere, removed.)
LEAN_TOKENS = (8, 16)
LEAN_NTILES = (2, 3, 4, 5, 6, 8)
LEAN_LONG_NTILES = (2, 3, 4, 5)
LEAN_WARPS = 16
LEAN_KCAP = 3072
LEAN_LONG_KCAP = 7168
#: the SMs of the H200 (the lean grids give every CTA its own SM)
SMS = 132
#: K codes of a lean unit (a lane's 16 codes are one NVFP4 block; _decode_lean_ir.UNIT)
UNIT_CODES = 64


def lean_name(tokens: int, ntiles: int, kcap: int = LEAN_KCAP) -> str:
    """The lean variant of ``tokens`` M-tile rows, ``ntiles`` n8-tiles and shared rows of K
    <= ``kcap``."""
    return f"mma_leanb_t{tokens}_n{ntiles}" + ("" if kcap == LEAN_KCAP else f"_k{kcap}")


LEAN_VARIANTS = tuple([lean_name(t, n) for t in LEAN_TOKENS for n in LEAN_NTILES]
                      + [lean_name(t, n, LEAN_LONG_KCAP) for t in LEAN_TOKENS
                         for n in LEAN_LONG_NTILES])
VARIANTS += LEAN_VARIANTS


def lean_shape(variant: str) -> tuple[int, int]:
    """(tokens, n-tiles) of a lean variant name."""
    t, n = variant.removeprefix("mma_leanb_t").split("_k")[0].split("_n")
    return int(t), int(n)


def lean_kcap(variant: str) -> int:
    """The largest K of a lean variant's shared rows (:data:`LEAN_KCAP` without a ``_k``
    suffix)."""
    _, sep, cap = variant.partition("_k")
    return int(cap) if sep else LEAN_KCAP


#: the one-shot variants' largest K (their shared weight rows hold K / 2 bytes): "mma_shot"
#: 4 CTAs per SM (gpt-oss, dense N=5760 K=2944), "mma_shot7k" 2 of 256 threads (DeepSeek-V3
#: K = 7168; 8 warps on K eighths: 16 warps per SM),
#: "mma_shot16" 3 (two n-tiles a pass: one A decode for 16 rows; dense M = 9..16),
#: "mma_shot32" 2 of 256 threads (32 columns, 8 warps on K eighths, each B fragment's decode
#: serving two M-tiles: ~20 % fewer instructions a weight byte; for the MoE grids),
#: "mma_shot6" 3 of 192 threads ("mma_shot" on 6 warps, K sixths, under 112 registers: 18
#: warps on an SM of 3 CTAs instead of 12; for the dense M = 1 grid of 360 CTAs),
#: "mma_shot1" ("mma_shot" with one copy per whole row: :data:`SHOT_SLICED`)
SHOT_KCAP = {"mma_shot": 3072, "mma_shot7k": 7168, "mma_shot16": 3072, "mma_shot32": 3072,
             "mma_shot6": 3072, "mma_shot1": 3072}
#: the one-shot variants' rows per pass (activation rows in shared memory)
SHOT_TOKENS = {"mma_shot": 8, "mma_shot7k": 8, "mma_shot16": 16, "mma_shot32": 8,
               "mma_shot6": 8, "mma_shot1": 8}
#: the one-shot variants' warps (K slices) per CTA
SHOT_WARPS = {"mma_shot": 4, "mma_shot7k": 8, "mma_shot16": 4, "mma_shot32": 8,
              "mma_shot6": 6, "mma_shot1": 4}
#: the one-shot variants copying each row in warp K slices, an mbarrier per slice (the warps
#: start on their slice as it lands; 4-8 copies a row) rather than whole rows on one mbarrier
#: ("mma_shot1" is "mma_shot" with whole rows; the multi-wave MoE variants take whole rows)
SHOT_SLICED = {"mma_shot": True, "mma_shot7k": False, "mma_shot16": True, "mma_shot32": False,
               "mma_shot6": True, "mma_shot1": False}
#: the shared-memory staging of each "mma_c*" variant (_decode_mma_ir._Staging)
STAGING = {"mma_c": "cf", "mma_c8": "cf8", "mma_c85": "cf8", "mma_c86": "cf8", "mma_c8t": "cf8",
           "mma_c8t1": "cf8", "mma_c8s2": "cf8", "mma_c8s4": "cf8", "mma_c8d2": "cf8",
           "mma_c8w": "cf8", "mma_c8r": "cf8", "mma_c8r4": "cf8"}
#: the variants with the last K step peeled (_decode_mma_ir.emit_decode_mma's ``tail``)
TAIL_VARIANTS = ("mma_c8t", "mma_c8t1", "mma_c8s2", "mma_c8s4", "mma_c8d2", "mma_c8w",
                 "mma_c8r", "mma_c8r4")
#: the variants of a pass a row on _decode_solo_ir's step (grouped only)
SOLO_VARIANTS = ("mma_c8t1",)
#: column slices of 64 per CTA (_decode_mma_ir.emit_decode_mma's ``slices``)
SLICES = {"mma_c8s2": 2, "mma_c8s4": 4}
#: grouped-only variants (more CTAs per SM) -> the variant the dense dispatch runs instead
DENSE_EQUIVALENT = {"mma_p5": "mma_p", "mma_c85": "mma_c8", "mma_c86": "mma_c8",
                    "mma_c8w": "mma_c8t", "mma_c8r": "mma_c8t", "mma_c8t1": "mma_c8t",
                    "mma_c8r4": "mma_c8t"}
#: the persistent (work-unit walking) variants: grouped only, grid (P, 1, 1), scalars
#: ``list_len``, ``group_list`` = :func:`row_blocks` (_decode_stream_ir); their CTAs per SM
#: (one wave of P =
#: min(units, CTAs per SM x 132): 128 registers; the rings' shared memory)
STREAM_VARIANTS = ("mma_c8w", "mma_c8r", "mma_c8r4")
STREAM_PER_SM = {"mma_c8w": 4, "mma_c8r": 3, "mma_c8r4": 2}
#: the ring variants' weight stages (_decode_mma_ir.emit_decode_mma's ``ring``)
RING = {"mma_c8r": 3, "mma_c8r4": 4}
#: the persistent variants' CTA cap: None (STREAM_PER_SM x 132) or an int (tests, benchmarks)
STREAM_CTAS: int | None = None
#: the split-K variants (grid.z = splits; workspace and counters arguments)
SPLIT_VARIANTS = ("mma_psk",)
#: threads and output columns per CTA of each variant
VARIANT_THREADS = {"simt": THREADS, "mma": 128, "mma2": 128, "mma_p": 128, "mma_p5": 128,
                   "mma_psk": 128, **dict.fromkeys(STAGING, 128),
                   **{v: 32 * w for v, w in SHOT_WARPS.items()},
                   **dict.fromkeys(LEAN_VARIANTS, 32 * LEAN_WARPS),
                   **dict.fromkeys(MX8_VARIANTS, 128)}
VARIANT_COLS = {"simt": COLS, "mma": 64, "mma2": 64, "mma_p": 64, "mma_p5": 64, "mma_psk": 64,
                **dict.fromkeys(STAGING, 64), **{v: 64 * j for v, j in SLICES.items()},
                **dict.fromkeys(SHOT_KCAP, 16), "mma_shot32": 32,
                **{v: 8 * lean_shape(v)[1] for v in LEAN_VARIANTS},
                **dict.fromkeys(MX8_VARIANTS, 64)}
#: register cap (nvvm.maxnreg) per variant: simt 2 x 256 threads, mma 4 x 128, mma2 3 x 128,
#: mma_p5 5 x 128 (5 x 42 KB of shared memory: fits the H200's 228 KB)
VARIANT_REGISTERS = {"simt": 128, "mma": 128, "mma2": 168, "mma_p": 128, "mma_p5": 96,
                     "mma_psk": 128, "mma_c": 128, "mma_c8": 128, "mma_c85": 96,
                     "mma_c86": 80, "mma_c8t": 128, "mma_c8t1": 128, "mma_c8s2": 128,
                     "mma_c8s4": 128,
                     "mma_c8d2": 168, "mma_c8w": 128, "mma_c8r": 128, "mma_c8r4": 128,
                     **dict.fromkeys(SHOT_KCAP, 128), "mma_shot6": 112,
                     **dict.fromkeys(LEAN_VARIANTS, 128),
                     "mma_x8": 128, "mma_x8n2": 168}
#: mma_psk: split K until the grid has about two waves of CTAs (4 per SM of 132 SMs, twice)
SPLIT_K_P_CTAS = 2 * 4 * 132
#: mma_psk: at least this many K steps (512 FP4 elements) per split (one step is loaded
#: while the previous one is computed: a split of one step has nothing to overlap)
SPLIT_K_MIN_STEPS = 2
#: dispatch: with variant "mma_p", grids (column slices x groups) of at most this many CTAs
#: run "mma_psk" when :func:`split_k_p` gives >= 2 splits; 0: never (the default until it
#: is measured faster). ``BLOCKSCALE_DECODE_SPLIT_K`` (an int) overrides it.
SPLIT_K_MAX_CTAS = 0
SPLIT_K_ENV = "BLOCKSCALE_DECODE_SPLIT_K"
#: BLOCKSCALE_DECODE_VARIANT: the variant the dispatch uses for FP4 (MXFP8: MX8_VARIANT_ENV)
VARIANT_ENV = "BLOCKSCALE_DECODE_VARIANT"
#: the MXFP8 variant of the dispatch (BLOCKSCALE_DECODE_MX8_VARIANT = "simt" | one of
#: MX8_VARIANTS | MX8_AUTO overrides it)
MX8_VARIANT_ENV = "BLOCKSCALE_DECODE_MX8_VARIANT"
#: a dispatch-only MXFP8 choice (:func:`mx8_variant`): grouped "mma_x8"; dense "simt" at M =
#: 1, "mma_x8" up to 8 rows, "mma_x8n2" above. H200 runs DS / DT, ms: gpt-oss-120b gate_up simt
#: -> mma_x8 T=1 0.0433 -> 0.0293, T=16 0.466 -> 0.280, T=128 2.287 -> 0.661 (76.6 % of copy;
#: torch FP8 grouped 0.788); DeepSeek-V3 T=1 0.113 -> 0.080, T=16 1.430 -> 0.919 (81.7 %);
#: the grouped mma_x8n2 (3 CTAs an SM) slower at T=16 / 128 (0.331 / 0.774) even where groups
#: hold 9-16 rows (two passes of mma_x8), and 4 n-tiles (32 rows a pass, groups up to 64
#: rows) 2.046 ms at T=1024 against the tiled mma.sync kernel's 2.137: not kept. Dense 5760 x
#: 2880: M=1 simt 0.0176 / mma_x8 0.0197 (90 CTAs: the SIMT kernel's 180 hide more latency),
#: M=8 0.0514 / 0.0197, M=16 0.0956 / 0.0319 / mma_x8n2 0.0208
MX8_AUTO = "mma_x8a"
DEFAULT_MX8_VARIANT = MX8_AUTO
DENSE_MX8_SIMT_MAX_M = 1
#: a dispatch-only choice (BLOCKSCALE_DECODE_VARIANT / DEFAULT_VARIANT): "mma_c8t",
#: "mma_c8s2" or "mma_c8s4" by the grid's 64-column tiles (:func:`slices_variant`)
AUTO_VARIANT = "mma_c8a"
#: CTAs resident at once (4 per SM, 132 SMs): slices_variant's wave unit
WAVE_CTAS = 4 * 132
#: measured on the H200 (run D, 2026-11-30, gpt-oss-120b gate_up NVFP4, simt -> mma):
#: T=1 0.0344 -> 0.0324 ms, T=16 0.334 -> 0.262 ms, T=128 1.59 -> 0.70 ms; DeepSeek-V3
#: T=128 4.78 -> 2.07 ms (mma2 was slower than mma everywhere). Run J (2026-11-30), mma ->
#: mma_p: gpt-oss NVFP4 T=1 0.0326 -> 0.0311, T=16 0.263 -> 0.247, T=128 0.697 -> 0.659 ms;
#: DeepSeek-V3 NVFP4 T=128 2.08 -> 1.95 ms; dense M=1 / 16 (N=5760 K=2880) 0.0181 -> 0.0156 /
#: 0.0276 -> 0.0240 ms (mma_p5 and, run H, the removed split "mma_sk" were slower than mma).
#: Run P (2026-11-30), mma_p -> mma_c8 (conflict-free staging, 8-row passes, no spills):
#: gpt-oss NVFP4 T=1 0.0307 -> 0.0222, T=16 0.250 -> 0.168, T=128 0.656 -> 0.421 ms (65 % of
#: copy); DeepSeek-V3 NVFP4 T=16 0.722 -> 0.495 (79 %), T=128 1.95 -> 1.35 ms; MXFP4 gpt-oss
#: T=128 0.558 -> 0.440; dense M=1 0.0156 -> 0.0116, M=16 0.0240 -> 0.0182 ms (mma_c 0.0180;
#: mma_c85 / mma_c86, capped at 96 / 80 registers, slower than mma_c8). Session 8 (run AP,
#: H200, dense N=5760 K=2880, weight sets rotated past the L2, ms): the one-shot kernels,
#: NVFP4 M=1 mma_shot 0.0125 / mma_shot1 0.0119 vs mma_c8t 0.0145, M=16 mma_shot16 0.0165 vs
#: 0.0214; MXFP4 M=1 0.0114 / 0.0112 vs 0.0152, M=16 0.0156 vs 0.0230 (run AB, K=7168: mma_shot7k
#: M=1 0.0164 vs 0.0257, M=16 0.0255 vs 0.0416; ncu, run AO: mma_c8's 90 CTAs run one warp a
#: scheduler, its K chain 4.6 k instructions long). So the dense dispatch runs "mma_shot"
#: (:func:`shot_variant` by K and rows; :data:`SHOT_FALLBACK` past every one-shot K cap):
#: deterministic and within the fp32 bound, not bit-identical to the portable kernel
#: Session 14 (run CS, H200, weight sets rotated past the L2, ms): the lean kernels at N =
#: 5760 K = 2880, M = 1 / 4 / 8 / 9 / 16, t*_n6: 0.0116 / 0.0110 / 0.0115 / 0.0113 / 0.0119
#: (their removed register form 0.0121 / 0.0116 / 0.0124 / 0.0120 / 0.0127; the one-shot
#: kernels 0.0126 / 0.0132 / 0.0144 / 0.0163 / 0.0173); N = 4096 K = 2048 t*_n4 0.0085 /
#: 0.0082 / 0.0087 / 0.0085 / 0.0093 (one-shot 0.0090 / 0.0094 / 0.0100 / 0.0108 / 0.0120).
#: So the dense NVFP4 dispatch runs :func:`lean_variant`'s kernel where it takes the case
#: (the dispatch-only :data:`LEAN_AUTO`), else the one-shot kernels. Session 15 (run CY), the
#: ``_k7168`` rows against "mma_shot7k" (the one-shot pick there), M = 1 / 8 / 16: N = 4096
#: K = 7168 t*_n4 0.0148 / 0.0147 / 0.0157 vs 0.0167 / 0.0181 / 0.0262 (cuBLAS bf16 ~0.022,
#: FP8 rowwise ~0.023); N = 2048 K = 7168 t*_n2 0.0106 / 0.0109 / 0.0119 vs 0.0118 / 0.0127 /
#: 0.0180; N = 4096 K = 4096 n4 0.0106 / 0.0115 / 0.0115 vs 0.0114 / 0.0137 / 0.0178
LEAN_AUTO = "mma_lean"
DEFAULT_VARIANT = LEAN_AUTO
#: the dense dispatch's variant where no one-shot kernel holds K (K > 7168)
SHOT_FALLBACK = "mma_c8"
#: the grouped (MoE) decode's default: run Q (2026-11-30, H200), mma_c8 -> mma_c8t (the last K
#: step peeled): gpt-oss NVFP4 T=1 0.0222 -> 0.0215, T=16 0.164 -> 0.157, T=128 0.417 -> 0.398
#: ms (70 % of copy); MXFP4 T=128 0.437 -> 0.404. Dense keeps mma_c8 (M=1 0.0117 vs 0.0123,
#: M=16 0.0183 vs 0.0194); the sliced s2 / s4 and the two-step d2 were slower everywhere
GROUPED_DEFAULT_VARIANT = "mma_c8t"


@dataclasses.dataclass(frozen=True)
class DecodeSpec(FormatSpec):
    """What one decode kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8".
        mode: "grouped" (MoE, bf16 output) or "dense".
        out_dtype: "bfloat16" | "float32" ("bfloat16" only for grouped).
        row_scales: grouped: whether the kernel reads ``a_row_scales``.
        target: a 32-lane GPUTarget name (sm_90a, sm_100a).
        variant: "simt" or "mma" (FP4 only), see :data:`VARIANTS`.
        sigma_out: grouped: the weights are σ-permuted (row 2i gate i, row 2i + 1 up i, as
            :func:`blockscale.ops.grouped_matmul_swiglu` takes them) and the output is stored
            un-permuted (gate columns, then up columns), the fused op's chained path.
    """

    fmt: str
    mode: str = "grouped"
    out_dtype: str = "bfloat16"
    row_scales: bool = False
    target: str = "sm_90a"
    variant: str = "simt"
    sigma_out: bool = False

    op: ClassVar[str] = "block_scaled_matmul_decode"

    @property
    def block(self) -> tuple[int, int, int]:
        return (VARIANT_THREADS[self.variant], 1, 1)

    @property
    def dynamic_shared_bytes(self) -> int:
        """The ring variants' TMA stages (16 KB each; the other buffers are static) and 1 KB
        for the stages' 1024-byte alignment after the static bytes (so also > 48 KB: the
        CUDA runtime opts in, static + dynamic being > 48 KB in any case)."""
        if self.variant in SHOT_KCAP:  # all the one-shot variants' shared buffers
            return shot_layout(self.fmt, self.variant)["total"]
        if self.variant in LEAN_VARIANTS:  # the rows and the mbarriers
            t, nt = lean_shape(self.variant)
            kcap = lean_kcap(self.variant)
            return bulk_layout(kcap, nt, t, lean_rounds(kcap, LEAN_WARPS))["total"]
        ring = RING.get(self.variant, 0)
        return ring * 64 * 256 + 1024 if ring else 0

    @property
    def cols(self) -> int:
        """Output columns per CTA."""
        return VARIANT_COLS[self.variant]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.mode, ("grouped", "dense"), "mode")
        H.check_choice(self.out_dtype, ("bfloat16",) if self.mode == "grouped"
                       else ("bfloat16", "float32"), "out_dtype")
        if self.row_scales and self.mode != "grouped":
            raise ValueError("row_scales is for the grouped mode only")
        if self.sigma_out and self.mode != "grouped":
            raise ValueError("sigma_out is for the grouped mode only")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, IR_TARGETS, "target")
        H.check_choice(self.variant, VARIANTS, "variant")
        if self.variant in MX8_VARIANTS and self.fmt != "mxfp8":
            raise ValueError(f"variant {self.variant!r} is for mxfp8 only, got {self.fmt}")
        if self.variant not in ("simt", *MX8_VARIANTS) and not self.format.is_fp4:
            raise ValueError(f"variant {self.variant!r} needs an FP4 format (nvfp4, mxfp4), "
                             f"got {self.fmt}")
        if self.variant in LEAN_VARIANTS and (self.fmt != "nvfp4" or self.mode != "dense"):
            raise ValueError(f"variant {self.variant!r} is for the dense mode and nvfp4 only, "
                             f"got mode {self.mode!r}, {self.fmt}")
        if self.variant in SOLO_VARIANTS and self.mode != "grouped":
            raise ValueError(f"variant {self.variant!r} is for the grouped mode only, got mode "
                             f"{self.mode!r}")
        if self.variant in STREAM_VARIANTS and self.mode != "grouped":
            raise ValueError(f"variant {self.variant!r} is for the grouped mode only, got "
                             f"mode {self.mode!r}")

    @property
    def kernel_name(self) -> str:
        out = H.out_tag(self.out_dtype)
        rs = "_rowsc" if self.row_scales else ""
        var = "" if self.variant == "simt" else f"_{self.variant}"
        sig = "_sig" if self.sigma_out else ""
        return f"bs_decode_{self.mode}_{self.fmt}_{out}{rs}{var}{sig}"

    def args(self) -> tuple[KernelArg, ...]:
        """The portable kernel's parameters; grouped adds ``group_list`` (int32 ``[grid.y]``:
        the groups the CTAs of row y of the grid work on, e.g. only the non-empty ones)."""
        if self.mode == "grouped":
            args = list(_grouped.GroupedMatmulSpec(self.fmt, "tcgen5d", "bfloat16",
                                                   self.row_scales, self.target).args())
            at = [a.name for a in args].index("expert_ids") + 1
            args = args[:at] + [KernelArg("group_list", "buffer", "int32")] + args[at:]
        else:
            args = list(_matmul.MatmulSpec(self.fmt, self.out_dtype, "tcgen5d", None,
                                           self.target).args())
        if self.variant in STREAM_VARIANTS:  # group_list's length (row blocks)
            args.append(KernelArg("list_len", "scalar", "i32"))
        if self.variant in RING:  # the TMA map over the weights (_decode_mma_ir.ring_map_arg)
            args.append(KernelArg("w_map", "tensormap", self.format.elem_dtype.name,
                                  tensor="w", box=(128, 64), swizzle="128b"))
        if self.variant in SPLIT_VARIANTS:  # fp32 partials [rows][splits][n], int32 [tiles]
            args += [KernelArg("workspace", "buffer", "float32", "inout"),
                     KernelArg("counters", "buffer", "int32", "inout")]
        return tuple(args)


def bulk_row_stride(kcap: int) -> int:
    """The lean kernels' shared row (bytes): ``kcap / 2`` rounded up to 32, plus 32 where
    needed so that it is 32 or 96 mod 128: a half warp's ``LDS.64`` (4 rows x 32 bytes) then
    hits 32 distinct banks."""
    rb = -(-kcap // 64) * 32
    return rb + (32 if rb % 128 in (0, 64) else 0)


def lean_rounds(kcap: int, warps: int) -> int:
    """The copy rounds of a lean kernel with shared rows of ``kcap`` and ``warps`` warps:
    one 64-code unit a warp a round (3 for K <= 3072 on 16 warps, 7 for K <= 7168)."""
    return -(-kcap // UNIT_CODES // warps)


def bulk_layout(kcap: int, ntiles: int, tokens: int, rounds: int) -> dict[str, int]:
    """Byte offsets of the lean kernels' dynamic shared memory: "rows" (the CTA's 8 ntiles
    weight rows, then its ``tokens`` activation rows, :func:`bulk_row_stride` bytes each;
    after the MMAs the warps' f32 partials reuse it), "bars" (an mbarrier per copy round),
    "total"."""
    rows = (8 * ntiles + tokens) * bulk_row_stride(kcap)
    return {"rows": 0, "bars": rows, "total": rows + 8 * rounds}


def shot_row_stride(kcap: int) -> int:
    """The one-shot variants' shared row (bytes): ``kcap / 2``, plus 16 when that is an even
    number of 16-byte chunks (an odd count: conflict-free fragment reads)."""
    rb = kcap // 2
    return rb + (16 if (rb // 16) % 2 == 0 else 0)


def shot_f32_scales(fmt: str, kcap: int) -> bool:
    """Whether a one-shot kernel stages NVFP4 weight scales decoded to f32 (kcap <= 4096: 12
    KB a 16-row tile) rather than as raw E4M3 bytes decoded per use."""
    return fmt == "nvfp4" and kcap <= 4096


def shot_layout(fmt: str, variant: str) -> dict[str, int]:
    """Byte offsets of a one-shot kernel's shared buffers, all in its dynamic shared memory
    (static + dynamic > 48 KB needs the runtime's opt-in, which it gives above 48 KB of
    dynamic memory): "rows" (the weight rows, then the activation rows, of
    :func:`shot_row_stride` bytes), "bars" (an mbarrier per warp), "sb" (weight scales),
    "sa" (activation scales), "red" (warps 1..'s partials), each 16-byte aligned; "total"."""
    kcap, tokens, warps = SHOT_KCAP[variant], SHOT_TOKENS[variant], SHOT_WARPS[variant]
    cols = VARIANT_COLS[variant]
    nv = fmt == "nvfp4"
    pairs = kcap // 32
    sizes = (("rows", (cols + tokens) * shot_row_stride(kcap)), ("bars", 8 * warps),
             ("sb", pairs * cols * (8 if shot_f32_scales(fmt, kcap) else 2 if nv else 4)),
             ("sa", pairs * tokens * 4),
             ("red", (warps - 1) * 32 * 16 * (cols // 16) * (tokens // 8)))
    out, at = {}, 0
    for name, size in sizes:
        out[name] = at
        at += -(-size // 16) * 16
    out["total"] = at
    return out


def shot_variant(k: int, rows: int = 1) -> str | None:
    """The one-shot variant for K and ``rows`` (the largest group's): "mma_shot16" for 9..16
    rows when it holds K, else the 8-row variant with the smallest :data:`SHOT_KCAP` that
    holds K, or None."""
    if 8 < rows <= 16 and k <= SHOT_KCAP["mma_shot16"]:
        return "mma_shot16"
    fits = [v for v, cap in sorted(SHOT_KCAP.items(), key=lambda x: x[1])
            if k <= cap and SHOT_TOKENS[v] == 8 and VARIANT_COLS[v] == 16]
    return fits[0] if fits else None


def lean_takes_k(k: int, kcap: int = LEAN_LONG_KCAP) -> bool:
    """Whether lean kernels with shared rows of ``kcap`` (default: the longest) take K: a
    multiple of 64 (whole units), <= ``kcap``."""
    return 0 < k <= kcap and k % UNIT_CODES == 0


def lean_fits(variant: str, k: int, m: int) -> bool:
    """Whether the lean ``variant``'s shared rows hold K and its M-tile the ``m`` rows (the
    conditions :func:`check_variant_shape` reports)."""
    return lean_takes_k(k, lean_kcap(variant)) and m <= lean_shape(variant)[0]


def lean_variant(m: int, n: int, k: int) -> str | None:
    """The lean variant for a dense (M, N, K), or None where none takes it (K not a multiple
    of 64 or past :data:`LEAN_LONG_KCAP`, M > 16, K > :data:`LEAN_KCAP` where no
    :data:`LEAN_LONG_NTILES` count gives every CTA its own SM): 8 or 16 tokens by M, and the
    fewest n-tiles that give every CTA its own SM (``ceil(N / 8 NT) <= SMS``; NT = 8 past
    that for K <= :data:`LEAN_KCAP`); the ``_k7168`` rows for longer K."""
    if not lean_takes_k(k) or not 0 < m <= max(LEAN_TOKENS):
        return None
    tokens = min(t for t in LEAN_TOKENS if m <= t)
    if k > LEAN_KCAP:
        nt = next((j for j in LEAN_LONG_NTILES if -(-n // (8 * j)) <= SMS), None)
        return None if nt is None else lean_name(tokens, nt, LEAN_LONG_KCAP)
    nt = next((j for j in LEAN_NTILES if -(-n // (8 * j)) <= SMS), LEAN_NTILES[-1])
    return lean_name(tokens, nt)


def check_variant_shape(variant: str, k: int, m: int = 0) -> None:
    """ValueError when a one-shot ``variant``'s shared rows cannot hold K, or a lean
    variant's cannot (or its M-tile the ``m`` rows)."""
    if variant in LEAN_VARIANTS:
        tokens, kcap = lean_shape(variant)[0], lean_kcap(variant)
        if not lean_takes_k(k, kcap):
            raise ValueError(f"k must be a multiple of {UNIT_CODES} and <= {kcap} for "
                             f"variant {variant!r}, got {k}")
        if m > tokens:
            raise ValueError(f"m must be <= {tokens} for variant {variant!r}, got {m}")
    cap = SHOT_KCAP.get(variant)
    if cap is not None and k > cap:
        raise ValueError(f"k must be <= {cap} for variant {variant!r} (its shared weight rows "
                         f"hold {cap // 2} bytes), got {k}")


def grid(n: int, groups: int, cols: int = COLS) -> tuple[int, int, int]:
    """(column slices of ``cols``, groups, 1)."""
    return (max(1, -(-n // cols)), max(1, groups), 1)


def build(spec: DecodeSpec) -> Any:
    """The ``mlir.ir.Module`` of the decode kernel for ``spec`` (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._decode_ir as D
    import blockscale.ops._decode_mma_ir as DM
    import blockscale.ops._matmul_ir as mir
    from blockscale.compiler import ir as bir
    from blockscale.layouts import SF_ATOM_ROWS

    fmt = spec.format
    if spec.variant == "simt":
        emit = D.emit_decode
    elif spec.variant in MX8_VARIANTS:
        import blockscale.ops._decode_mx8_ir as DX

        def emit(*args: Any, **kw: Any) -> None:
            DX.emit_decode_mx8(*args, **kw, ntiles=MX8_NTILES[spec.variant])
    elif spec.variant in SHOT_KCAP:
        import blockscale.ops._decode_shot_ir as DS1

        def emit(*args: Any, **kw: Any) -> None:
            DS1.emit_decode_shot(*args, **kw, kcap=SHOT_KCAP[spec.variant],
                                 tokens=SHOT_TOKENS[spec.variant],
                                 mtiles=spec.cols // 16, warps=SHOT_WARPS[spec.variant],
                                 layout=shot_layout(spec.fmt, spec.variant),
                                 sliced=SHOT_SLICED[spec.variant])
    elif spec.variant in LEAN_VARIANTS:
        import blockscale.ops._decode_lean_ir as DL
        tokens, ntiles = lean_shape(spec.variant)

        def emit(*args: Any, **kw: Any) -> None:
            DL.emit_decode_lean(*args, **kw, ntiles=ntiles, tokens=tokens,
                                kcap=lean_kcap(spec.variant),
                                warps=LEAN_WARPS)
    elif spec.variant in SPLIT_VARIANTS:
        def emit(*args: Any, **kw: Any) -> None:
            DM.emit_decode_mma_split_k(*args, **kw, workspace=kb.arg("workspace"),
                                       counters=kb.arg("counters"))
    else:
        def emit(*args: Any, **kw: Any) -> None:
            DM.emit_decode_mma(*args, **kw, depth=2 if spec.variant in ("mma2", "mma_c8d2") else 1,
                               decode="lop3" if spec.variant in ("mma", "mma2") else "prmt",
                               staging=STAGING.get(spec.variant, "v1"),
                               tail=spec.variant in TAIL_VARIANTS,
                               slices=SLICES.get(spec.variant, 1),
                               ring=RING.get(spec.variant, 0),
                               solo=spec.variant in SOLO_VARIANTS)
    cols = spec.cols
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        from mlir import ir as mlir_ir
        kb.func.attributes["nvvm.maxnreg"] = mlir_ir.IntegerAttr.get(
            bir.i32(), VARIANT_REGISTERS[spec.variant])
        f32 = bir.f32()
        k = bir.as_index(kb.arg("k"))
        n_count = bir.as_index(kb.arg("n"))
        if spec.mode == "dense":
            m_count = bir.as_index(kb.arg("m"))
            alpha = kb.arg("alpha")

            def store(v: Any, m: Any, n: Any) -> None:
                mir.store_output(arith.mulf(v, alpha), kb.arg("c"),
                                 bir.add(bir.mul(m, n_count), n), spec.out_dtype)

            emit(kb, fmt, start=bir.const(0), end=m_count,
                          expert=bir.const(0, bir.i32()), n_count=n_count, k=k,
                          a_srow=lambda m: m, store=store)
            return kb.module
        if spec.variant in STREAM_VARIANTS:
            import blockscale.ops._decode_stream_ir as DS
            emit(kb, fmt, start=None, end=None, expert=None, n_count=n_count, k=k,
                 a_srow=None, store=None, units=DS.Units(kb, n_count, spec.row_scales))
            return kb.module
        def out_col(n: Any) -> Any:
            """Weight row n's output column (``sigma_out``: σ-permuted rows un-permuted)."""
            if not spec.sigma_out:
                return n
            return bir.add(bir.mul(bir.urem(n, 2), bir.udiv(n_count, 2)), bir.udiv(n, 2))

        g = bir.as_index(bir.load(kb.arg("group_list"), bir.block_idx("y")))
        es = kb.arg("expert_start")
        start = bir.as_index(bir.load(es, g))
        end = bir.as_index(bir.load(es, bir.add(g, 1)))
        # the group's id loads with its bounds and both decide the one branch (one L2 round
        # trip after g's, not two more behind nested branches: the CTA's prologue is a
        # chain of dependent loads before its first weight fetch)
        expert = bir.load(kb.arg("expert_ids"), g)
        nonempty = bir.ult(start, end)
        active = bir.logical_and(nonempty, arith.cmpi(arith.CmpIPredicate.sge, expert,
                                                      bir.const(0, bir.i32())))
        br = bir.if_(active, [])
        with br.then():
            e = bir.as_index(expert)
            scale = bir.load(kb.arg("expert_scales"), e)
            tile0 = bir.add(bir.udiv(start, SF_ATOM_ROWS),
                            bir.as_index(bir.load(kb.arg("a_scale_offsets"), g)))
            srow0 = bir.sub(bir.mul(tile0, SF_ATOM_ROWS), start)

            def store_g(v: Any, m: Any, n: Any) -> None:
                v = arith.mulf(v, scale)
                if spec.row_scales:  # D10: times the expert scale, then the row scale
                    v = arith.mulf(v, arith.extf(f32, bir.load(kb.arg("a_row_scales"), m)))
                mir.store_output(v, kb.arg("c"), bir.add(bir.mul(m, n_count), out_col(n)),
                                 "bfloat16")

            emit(kb, fmt, start=start, end=end, expert=expert, n_count=n_count,
                 k=k, a_srow=lambda m: bir.add(srow0, m), store=store_g)
            br.yield_()
        with br.else_():  # D8: an unused group's rows are zeros (an empty group: none)
            n0 = bir.mul(bir.block_idx("x"), cols)
            rows = bir.select(nonempty, bir.sub(end, start), bir.const(0))
            tid = bir.thread_idx("x")
            if spec.variant in SPLIT_VARIANTS:  # split 0 writes the zeros
                rows = bir.select(bir.eq(bir.block_idx("z"), 0), rows, bir.const(0))
            with bir.for_range(tid, bir.mul(rows, cols), spec.block[0]) as zl:
                m = bir.add(start, bir.udiv(zl.iv, cols))
                n = bir.add(n0, bir.urem(zl.iv, cols))
                with bir.when(bir.ult(n, n_count)):
                    mir.store_output(bir.const(0.0, f32), kb.arg("c"),
                                     bir.add(bir.mul(m, n_count), out_col(n)), "bfloat16")
            br.yield_()
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def enabled() -> bool:
    """False when BLOCKSCALE_DECODE=0."""
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off")


def k_supported(fmt: Format, k: int) -> bool:
    """K > 0 and 16-byte weight rows (the kernel's 16-byte loads)."""
    return k > 0 and (k % 32 == 0 if fmt.is_fp4 else k % 16 == 0)


def max_group_rows(expert_start: Any, t: int) -> int:
    """The largest group's rows: exact for a numpy ``expert_start``, else T (an upper
    bound)."""
    if isinstance(expert_start, np.ndarray) and expert_start.size >= 2:
        return int(np.max(np.diff(expert_start.astype(np.int64))))
    return t


def group_list(expert_start: Any, num_groups: int) -> np.ndarray:
    """The groups the decode grid covers (int32): the non-empty ones when ``expert_start`` is
    on the host (MoE decode: a few of E groups hold rows; an empty group's CTAs would cost
    a launch slot each), else all of them."""
    if isinstance(expert_start, np.ndarray):
        nonempty = np.nonzero(np.diff(expert_start.astype(np.int64)) > 0)[0]
        return nonempty.astype(np.int32)
    return np.arange(num_groups, dtype=np.int32)


def solo_pick(variant: str, expert_start: Any, groups: np.ndarray) -> bool:
    """Whether the grouped dispatch runs "mma_c8t1" instead of its ``variant``: the default
    "mma_c8t" (no BLOCKSCALE_DECODE_VARIANT) where every group of ``groups`` holds one row."""
    return variant == "mma_c8t" and VARIANT_ENV not in os.environ \
        and one_row_groups(expert_start, groups)


def grouped_variant(fmt: Format, k: int, expert_start: Any, num_groups: int) -> str:
    """The decode variant the grouped dispatch picks for these groups (before its per-grid
    split-K and slices choices, which keep the results): :func:`dispatch_variant`, a
    one-shot name resolved for K, :func:`mx8_variant`'s grouped pick, or "mma_c8t1"
    (:func:`solo_pick`)."""
    v = _grouped_base_variant(fmt, k)
    v = "mma_c8t" if v == AUTO_VARIANT else v
    if v == MX8_AUTO:
        return mx8_variant(MAX_ROWS, grouped=True)
    return SOLO_VARIANTS[0] if solo_pick(v, expert_start, group_list(expert_start, num_groups)) \
        else v


def _grouped_base_variant(fmt: Format, k: int) -> str:
    """The grouped dispatch's variant before its per-grid choices: :func:`dispatch_variant`
    with a one-shot name resolved for K (:data:`AUTO_VARIANT` kept)."""
    return _shot_or_default(dispatch_variant(fmt, grouped=True), k, GROUPED_DEFAULT_VARIANT)


def mx8_variant(rows: int, grouped: bool = False) -> str:
    """The kernel of :data:`MX8_AUTO` for ``rows`` (dense M; grouped: any group of <=
    :data:`MAX_ROWS` rows): grouped "mma_x8"; dense "simt" up to :data:`DENSE_MX8_SIMT_MAX_M`
    rows, "mma_x8" up to 8, else "mma_x8n2" (measured: see :data:`MX8_AUTO`)."""
    if grouped:
        return "mma_x8"
    return "simt" if rows <= DENSE_MX8_SIMT_MAX_M else "mma_x8" if rows <= 8 else "mma_x8n2"


def one_row_groups(expert_start: Any, groups: np.ndarray) -> bool:
    """Whether every group of ``groups`` holds exactly one row (a numpy ``expert_start``;
    False for one in device memory: its rows are not read back)."""
    if not isinstance(expert_start, np.ndarray) or expert_start.size < 2:
        return False
    return bool((np.diff(expert_start.astype(np.int64))[groups] == 1).all())


def split_k_p(ctas: int, k: int) -> int:
    """mma_psk: the K splits for a grid of ``ctas`` CTAs (per split) and K (FP4): as many as
    keep the grid within :data:`SPLIT_K_P_CTAS` CTAs (two waves: no third, partial one) and
    give each split >= :data:`SPLIT_K_MIN_STEPS` K steps (so 1 below 4 steps), none empty,
    the steps spread evenly."""
    steps = max(1, -(-(k // 2) // 256))
    want = max(1, min(steps // SPLIT_K_MIN_STEPS, SPLIT_K_P_CTAS // max(1, ctas)))
    return -(-steps // -(-steps // want))


def split_k_max_ctas() -> int:
    """The dispatch's split-K threshold: ``BLOCKSCALE_DECODE_SPLIT_K`` (an int >= 0), else
    :data:`SPLIT_K_MAX_CTAS` (ValueError for a bad value)."""
    v = os.environ.get(SPLIT_K_ENV)
    if v is None:
        return SPLIT_K_MAX_CTAS
    try:
        out = int(v)
    except ValueError:
        out = -1
    if out < 0:
        raise ValueError(f"{SPLIT_K_ENV}: expected an int >= 0 (grid CTAs), got {v!r}")
    return out


def split_variant(variant: str, ctas: int, k: int) -> str:
    """The variant the dispatch launches for a grid of ``ctas`` CTAs: "mma_psk" for "mma_p"
    when ``ctas <= split_k_max_ctas()`` and :func:`split_k_p` gives >= 2 splits, else
    ``variant``."""
    if variant == "mma_p" and ctas <= split_k_max_ctas() and split_k_p(ctas, k) > 1:
        return "mma_psk"
    return variant


#: (id(device), stream) -> (device, int32 counters, zero between launches): see
#: :func:`split_k_counters`
_COUNTERS: dict[tuple[int, int], tuple[Any, Any]] = {}
_COUNTERS_LOCK = threading.Lock()


def split_k_counters(device: Any, stream: int, tiles: int) -> Any:
    """An int32 counter buffer of >= ``tiles`` zeros for a split-K launch on ``stream``.

    Zeroed once per (device, stream) and reused: every launch leaves it at zero (the CTA that
    reduces a tile resets its counter; groups without work never touch theirs), and launches
    on one stream run one after another, so the next launch finds zeros. Each stream has its
    own buffer: kernels on two streams may run at the same time, and sharing would mix their
    counts. A buffer too small is replaced (the old one is freed in the order of its
    stream). During CUDA graph capture a fresh zeroed buffer is used instead (its memset is
    captured: a graph may be replayed on another stream than the one captured)."""
    capturing = getattr(device, "is_capturing", None)
    if capturing is not None and capturing(stream):
        return device.zeros((max(1, tiles),), np.int32, stream)
    key = (id(device), stream)
    with _COUNTERS_LOCK:
        hit = _COUNTERS.get(key)
        if hit is not None and hit[0] is device and hit[1].shape[0] >= tiles:
            return hit[1]
        buf = device.zeros((max(1024, tiles),), np.int32, stream)
        _COUNTERS[key] = (device, buf)
        return buf


def _with_split_k(spec: DecodeSpec, grid3: tuple[int, int, int], rows: int, n: int, k: int,
                  buffers: dict[str, Any], host: bool,
                  device: Any) -> tuple[tuple[int, int, int], dict[str, Any]]:
    """Split variants: grid.z = the splits, plus the workspace and counters. On a GPU: the
    workspace from the stream-ordered allocator (no memset: every split writes its partials
    before the reducing CTA reads them) and the counters of :func:`split_k_counters`, on the
    launch stream (the one the op's output is allocated on); all-numpy inputs: numpy buffers
    (copied with them); a device without launch streams: fresh, zeroed counters. Other
    variants: unchanged."""
    if spec.variant not in SPLIT_VARIANTS:
        return grid3, buffers
    tiles = grid3[0] * grid3[1]
    s = split_k_p(tiles, k)
    ws = max(1, rows * s * n)
    if host:
        extra = {"workspace": np.empty(ws, np.float32), "counters": np.zeros(tiles, np.int32)}
    elif hasattr(device, "launch_stream"):
        stream = device.launch_stream(buffers.values())
        extra = {"workspace": device.alloc((ws,), np.float32, stream),
                 "counters": split_k_counters(device, stream, tiles)}
    else:
        extra = {"workspace": device.alloc((ws,), np.float32),
                 "counters": device.zeros((tiles,), np.int32)}
    return (grid3[0], grid3[1], s), {**buffers, **extra}


def _launch_grouped(spec: DecodeSpec, t: int, n: int, num_groups: int,
                    buffers: dict[str, Any], scalars: dict[str, Any], device: Any,
                    auto_split: bool = False, auto_slices: bool = False,
                    auto_solo: bool = False) -> Any:
    """Launch ``spec`` over the groups of :func:`group_list`; ``auto_split`` (the dispatch):
    "mma_p" becomes :func:`split_variant`'s choice for the grid; ``auto_solo`` (the dispatch's
    default variant): FP4 "mma_c8t" becomes the one-row pass kernel "mma_c8t1" where every
    group of the grid holds one row (runs DG-DH: T = 1 -4 to -7.5 %); ``auto_slices``
    (:data:`AUTO_VARIANT`): the variant is :func:`slices_variant`'s for the grid."""
    groups = group_list(buffers["expert_start"], num_groups)
    if groups.size == 0:  # no rows at all (t == 0 is handled by the caller)
        groups = np.zeros(1, np.int32)
    if auto_slices:
        spec = _grouped_spec(spec, slices_variant(grid(n, 1, 64)[0] * int(groups.size)))
    if auto_solo and solo_pick(spec.variant, buffers["expert_start"], groups):
        spec = _grouped_spec(spec, SOLO_VARIANTS[0])
    if auto_split and spec.variant == "mma_p":
        v = split_variant("mma_p", grid(n, 1, spec.cols)[0] * int(groups.size), scalars["k"])
        if v != spec.variant:
            spec = _grouped_spec(spec, v)
    host = all(isinstance(v, np.ndarray) for v in buffers.values())
    if spec.variant in STREAM_VARIANTS:
        rows = row_blocks(buffers["expert_start"], num_groups, t)
        units = int(rows.size) * grid(n, 1, 64)[0]
        buffers = {**buffers, "group_list": rows if host else device.to_device(rows)}
        return H.launch(spec, (max(1, min(units, stream_ctas(spec.variant))), 1, 1), (t, n),
                        "bfloat16",
                        buffers, {**scalars, "list_len": int(rows.size),
                                  **({"w_map": (scalars["k"] // 2,
                                                int(np.prod(buffers["w"].shape))
                                                // max(1, scalars["k"] // 2))}
                                     if spec.variant in RING else {})},
                        device, empty=t == 0 or n == 0)
    buffers = {**buffers, "group_list": groups if host else device.to_device(groups)}
    g3, buffers = _with_split_k(spec, grid(n, int(groups.size), spec.cols), t, n,
                                scalars["k"], buffers, host, device)
    return H.launch(spec, g3, (t, n), "bfloat16", buffers, scalars, device,
                    empty=t == 0 or n == 0)


def stream_ctas(variant: str) -> int:
    """The CTA cap of a persistent variant: :data:`STREAM_CTAS` when set, else one wave
    (:data:`STREAM_PER_SM` x 132 SMs)."""
    return STREAM_CTAS if STREAM_CTAS is not None else STREAM_PER_SM[variant] * 132


def row_blocks(expert_start: Any, num_groups: int, t: int) -> np.ndarray:
    """The persistent variants' ``group_list``: one int32 entry ``p * num_groups + g`` per
    8-row block p of group g (rows ``[start + 8 p, + 8)``). A numpy ``expert_start``: the
    blocks that hold rows, group by group; else every group's ``ceil(min(T, 16) / 8)``
    blocks (those past a group's end do nothing), block 0 of every group first. Every
    entry is a live unit per 64-column tile on the host path, so CTAs striding over the
    units share the work evenly (run T: units (group, tile, pass) with the pass fastest
    gave CTA c only passes c % 2 at T = 128, half the CTAs idle)."""
    if isinstance(expert_start, np.ndarray) and expert_start.size >= 2:
        counts = np.diff(expert_start.astype(np.int64))
        g = np.repeat(np.arange(counts.size), -(-counts // 8))
        p = np.concatenate([np.arange(-(-c // 8)) for c in counts]) if counts.size else g
        out = (p * num_groups + g).astype(np.int32)
        return out if out.size else np.zeros(1, np.int32)  # (no rows: one empty block)
    blocks = max(1, -(-min(t, MAX_ROWS) // 8))
    return np.arange(blocks * num_groups, dtype=np.int32)


def slices_variant(tiles: int) -> str:
    """:data:`AUTO_VARIANT`'s kernel for a grid of ``tiles`` 64-column tiles (column slices
    x groups): one slice per CTA below 4 waves of :data:`WAVE_CTAS` ("mma_c8t": small grids
    need every CTA), 2 below 16 waves, else 4 (fewer load prologues per weight byte)."""
    if tiles < 4 * WAVE_CTAS:
        return "mma_c8t"
    return "mma_c8s2" if tiles < 16 * WAVE_CTAS else "mma_c8s4"


def dispatch_variant(fmt: Format, grouped: bool = False) -> str:
    """The variant the dispatch runs for ``fmt``: ``BLOCKSCALE_DECODE_VARIANT`` (else
    :data:`DEFAULT_VARIANT`, :data:`GROUPED_DEFAULT_VARIANT` for the grouped op) for FP4,
    ``BLOCKSCALE_DECODE_MX8_VARIANT`` (else :data:`DEFAULT_MX8_VARIANT`) for MXFP8
    (ValueError for an unknown name; :data:`AUTO_VARIANT` is resolved per launch)."""
    if not fmt.is_fp4:
        v = os.environ.get(MX8_VARIANT_ENV, DEFAULT_MX8_VARIANT)
        H.check_choice(v, ("simt", *MX8_VARIANTS, MX8_AUTO), MX8_VARIANT_ENV)
        return v
    v = os.environ.get(VARIANT_ENV, GROUPED_DEFAULT_VARIANT if grouped else DEFAULT_VARIANT)
    H.check_choice(v, (*VARIANTS, AUTO_VARIANT, LEAN_AUTO), VARIANT_ENV)
    if grouped and (v == LEAN_AUTO or v in LEAN_VARIANTS):  # (dense-only kernels)
        v = GROUPED_DEFAULT_VARIANT
    return v


def _shot_or_default(variant: str, k: int, default: str, rows: int = 1) -> str:
    """A one-shot ``variant`` (BLOCKSCALE_DECODE_VARIANT): "mma_shot" is :func:`shot_variant`'s
    choice for K and ``rows``; another one-shot name itself when it holds K, else that
    choice; ``default`` when no one-shot kernel holds K. Other variants pass through."""
    if variant not in SHOT_KCAP:
        return variant
    if variant != "mma_shot" and k <= SHOT_KCAP[variant]:
        return variant
    return shot_variant(k, rows) or default


def grouped_fast_path(target: str, fmt: Format, t: int, n: int, k: int, num_groups: int,
                      row_scales: bool) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul_grouped.FAST_PATHS` hook (registered first)."""
    if target not in TARGETS or not enabled() or t == 0 or n == 0 or not k_supported(fmt, k):
        return None
    variant = _grouped_base_variant(fmt, k)
    auto = variant == AUTO_VARIANT
    spec = DecodeSpec(fmt.name, "grouped", "bfloat16", row_scales, target,
                      "mma_c8t" if auto else mx8_variant(MAX_ROWS, grouped=True)
                      if variant == MX8_AUTO else variant)

    def run(buffers: dict[str, Any], scalars: dict[str, Any], device: Any) -> Any:
        if max_group_rows(buffers["expert_start"], t) <= MAX_ROWS:
            return _launch_grouped(spec, t, n, num_groups, buffers, scalars, device,
                                   auto_split=True, auto_slices=auto, auto_solo=True)
        for fast in _grouped.FAST_PATHS:  # hand over to the tiled kernels
            if fast is grouped_fast_path:
                continue
            runner = fast(target, fmt, t, n, k, num_groups, row_scales)
            if runner is not None:
                return runner(buffers, scalars, device)
        portable = _grouped.GroupedMatmulSpec(fmt.name, "tcgen5d", "bfloat16", row_scales,
                                              target)
        return H.launch(portable, _grouped.grid(t, n), (t, n), "bfloat16", buffers, scalars,
                        device)
    return run


@functools.lru_cache(maxsize=256)
def _grouped_spec(spec: DecodeSpec, variant: str) -> DecodeSpec:
    """``spec`` with ``variant`` (built once per combination: host cost)."""
    return dataclasses.replace(spec, variant=variant)


@functools.lru_cache(maxsize=256)
def _dense_spec(fmt_name: str, out_dtype: str, target: str, variant: str) -> DecodeSpec:
    """The dense DecodeSpec of the dispatch (built once per combination: host cost)."""
    return DecodeSpec(fmt_name, "dense", out_dtype, False, target, variant)


def dense_fast_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
                    epilogue: Any) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul.FAST_PATHS` hook: M <= MAX_ROWS, no epilogue."""
    if target not in TARGETS or not enabled() or epilogue is not None or m == 0 or n == 0 \
            or m > MAX_ROWS or not k_supported(fmt, k):
        return None
    variant = dispatch_variant(fmt)
    if variant == MX8_AUTO:
        variant = mx8_variant(m)
    if variant == LEAN_AUTO or variant in LEAN_VARIANTS:  # (else the one-shot pick)
        lean = lean_variant(m, n, k) if fmt.name == "nvfp4" else None
        if variant == LEAN_AUTO:
            variant = lean or "mma_shot"
        elif lean is None or not lean_fits(variant, k, m):  # the named kernel does not take it
            variant = "mma_shot"
    variant = _shot_or_default(variant, k, SHOT_FALLBACK, m)
    if variant == AUTO_VARIANT:
        variant = slices_variant(grid(n, 1, 64)[0])
    # mma_p5 / mma_c85 / mma_c86 are bundled for the grouped kernels only: dense grids run
    # their IR at 4 CTAs/SM
    variant = split_variant(DENSE_EQUIVALENT.get(variant, variant), grid(n, 1, 64)[0], k)
    spec = _dense_spec(fmt.name, out_dtype, target, variant)

    def run(a: Any, b: Any, sfa: Any, sfb: Any, alpha: float, extra: dict[str, Any],
            device: Any) -> Any:
        alpha = H.finite_f32(alpha, "alpha")
        H.check_epilogue_inputs((), extra, m, n)
        buffers = {"a": a, "b": b, "sfa": sfa, "sfb": sfb}
        g3, buffers = _with_split_k(spec, grid(n, 1, spec.cols), m, n, k, buffers,
                                    all(isinstance(v, np.ndarray) for v in buffers.values()),
                                    device)
        return H.launch(spec, g3, (m, n), out_dtype, buffers,
                        {"m": m, "n": n, "k": k, "alpha": alpha}, device)
    return run


def grouped_matmul_decode(hidden: Any, weight: Any, a_scales: Any, b_scales: Any,
                          expert_start: Any, a_scale_offsets: Any, expert_ids: Any,
                          expert_scales: Any, fmt: Format | str, *, k: int | None = None,
                          a_row_scales: Any = None, device: Any = None,
                          target: str = "sm_90a", variant: str = "simt") -> Any:
    """The decode kernel called directly (no dispatch; any group size), checked like
    :func:`blockscale.ops.matmul_grouped.grouped_matmul_block_scaled`; ``variant``: one of
    :data:`VARIANTS` ("mma": FP4 only). ValueError for operands in device memory that are
    not 16-byte aligned (:func:`~blockscale.ops._matmul_host.require_aligned`)."""
    fmt = Format.from_name(fmt)
    DecodeSpec(fmt.name, variant=variant)  # ValueError for a bad variant / format pair
    # (the grouped dispatch skips its fast paths, i.e. this hook, for misaligned operands)
    H.require_aligned(hidden=hidden, weight=weight, a_scales=a_scales, b_scales=b_scales)

    def hook(tgt: str, f: Format, t: int, n: int, kk: int, g: int, rs: bool) -> Any:
        def run(buffers: dict[str, Any], scalars: dict[str, Any], dev: Any) -> Any:
            if not k_supported(f, kk):
                raise ValueError(f"k must be a positive multiple of {32 if f.is_fp4 else 16} "
                                 f"for the decode kernel ({f.name}), got {kk}")
            check_variant_shape(variant, kk)
            spec = DecodeSpec(f.name, "grouped", "bfloat16", rs, tgt, variant)
            return _launch_grouped(spec, t, n, g, buffers, scalars, dev)
        return run

    saved = list(_grouped.FAST_PATHS)
    _grouped.FAST_PATHS[:] = [hook]
    try:
        return _grouped.grouped_matmul_block_scaled(
            hidden, weight, a_scales, b_scales, expert_start, a_scale_offsets, expert_ids,
            expert_scales, fmt, k=k, a_row_scales=a_row_scales, device=device, target=target)
    finally:
        _grouped.FAST_PATHS[:] = saved


def block_scaled_matmul_decode(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                               k: int | None = None, alpha: float = 1.0,
                               out_dtype: str = "bfloat16", device: Any = None,
                               target: str = "sm_90a", variant: str = "simt") -> Any:
    """The dense decode kernel called directly (no dispatch; any M); ``variant``: one of
    :data:`VARIANTS` ("mma": FP4 only). ValueError for operands in device memory that are
    not 16-byte aligned (:func:`~blockscale.ops._matmul_host.require_aligned`)."""
    fmt = Format.from_name(fmt)
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    H.require_aligned(a=a, b=b, sfa=sfa, sfb=sfb)  # the 16-byte loads
    if not k_supported(fmt, d.k):
        raise ValueError(f"k must be a positive multiple of {32 if fmt.is_fp4 else 16} for "
                         f"the decode kernel ({fmt.name}), got {d.k}")
    check_variant_shape(variant, d.k, d.m)
    dev, tgt = H.device_and_target(device, target)
    spec = DecodeSpec(fmt.name, "dense", out_dtype, False, tgt, variant)
    buffers = {"a": a, "b": b, "sfa": sfa, "sfb": sfb}
    g3, buffers = _with_split_k(spec, grid(d.n, 1, spec.cols), d.m, d.n, d.k, buffers,
                                all(isinstance(v, np.ndarray) for v in buffers.values()), dev)
    return H.launch(spec, g3, (d.m, d.n), out_dtype, buffers,
                    {"m": d.m, "n": d.n, "k": d.k, "alpha": H.finite_f32(alpha, "alpha")}, dev,
                    empty=d.m == 0 or d.n == 0)


def kernel(spec: DecodeSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def bundle_specs(target: str = "sm_90a") -> list[DecodeSpec]:
    """Every decode spec the dispatch and the GPU tests use on ``target``."""
    if target not in TARGETS:
        return []
    specs = [DecodeSpec(f, "grouped", "bfloat16", False, target)
             for f in ("nvfp4", "mxfp4", "mxfp8")]
    specs.append(DecodeSpec("nvfp4", "grouped", "bfloat16", True, target))
    specs += [DecodeSpec(f, "dense", o, False, target)
              for f in ("nvfp4", "mxfp4", "mxfp8") for o in ("bfloat16", "float32")]
    # the tensor-core variant (FP4)
    for v in ("mma", "mma2", "mma_p", "mma_p5", "mma_psk", *STAGING, *SHOT_KCAP):  # (FP4)
        specs += [DecodeSpec(f, "grouped", "bfloat16", False, target, v)
                  for f in ("nvfp4", "mxfp4")]
        specs.append(DecodeSpec("nvfp4", "grouped", "bfloat16", True, target, v))
        if v not in DENSE_EQUIVALENT:  # (more CTAs per SM: for the MoE grids)
            specs += [DecodeSpec(f, "dense", o, False, target, v)
                      for f in ("nvfp4", "mxfp4") for o in ("bfloat16", "float32")]
    specs += [DecodeSpec("nvfp4", "dense", o, False, target, v)
              for v in LEAN_VARIANTS for o in ("bfloat16", "float32")]
    # MXFP8 on the tensor cores (the dispatch's default for MXFP8; dense M <= 16: 1 or 2
    # n-tiles), grouped also with sigma_out (the fused SwiGLU op's chained path)
    specs += [DecodeSpec("mxfp8", "grouped", "bfloat16", False, target, v, sigma_out=sg)
              for v in MX8_VARIANTS for sg in ((False, True) if v == "mma_x8" else (False,))]
    specs += [DecodeSpec("mxfp8", "dense", o, False, target, v)
              for v in MX8_VARIANTS for o in ("bfloat16", "float32")]
    # the fused grouped matmul + SwiGLU's chained path where the dispatch runs "mma_c8t1"
    specs += [DecodeSpec(f, "grouped", "bfloat16", rs, target, v, sigma_out=True)
              for v in SOLO_VARIANTS for f, rs in (("nvfp4", False), ("nvfp4", True),
                                                   ("mxfp4", False))]
    return specs


if grouped_fast_path not in _grouped.FAST_PATHS:
    _grouped.FAST_PATHS.insert(0, grouped_fast_path)
if dense_fast_path not in _matmul.FAST_PATHS:
    _matmul.FAST_PATHS.insert(0, dense_fast_path)

_core.register_op_module(__name__)

__all__ = [
    "AUTO_VARIANT",
    "MAX_ROWS",
    "SPLIT_K_MAX_CTAS",
    "DecodeSpec",
    "block_scaled_matmul_decode",
    "build",
    "bundle_specs",
    "dense_fast_path",
    "grid",
    "grouped_fast_path",
    "grouped_matmul_decode",
    "kernel",
    "shot_variant",
    "slices_variant",
    "split_k_counters",
    "split_k_p",
    "split_variant",
]
