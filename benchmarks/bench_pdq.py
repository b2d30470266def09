"""A/B of the warp-specialized producer-dequant sm_90a matmuls (issues #9, #10), on the GPU.

Dense (``ops/matmul_pdq.py``) at M x 5760 x 2944: the two-phase pair (kstep 64, the reference:
same bf16 operands and HGMMA order, so the rows below must be byte-equal to it) against the
producer-dequant kernel with A from the phase-1 workspace or packed, with / without the
producer's prefetch. Grouped (``ops/matmul_grouped_pdq.py``) at gpt-oss-120b gate_up (E=128,
top-4, N=5760, K=2880) and T tokens: the grouped wgmma kernel at 128 x 256 (lut / k64 / fold:
byte-equal reference; and its dispatch default variant) against the grouped producer-dequant
kernel, checked against the float64 product on sampled rows (bench_moe's check) and for byte
equality with the lut / k64 / fold kernel. Times replay the recorded launches (both phases
where there are two).

Fused (``--suite fused``, issue #10): the fused SwiGLU op (σ-permuted weights) against the
chained dispatch (grouped matmul on the un-permuted weights + ``fused_silu_quantize``), with
the grouped pdq kernel and with ``BLOCKSCALE_SM90_GROUPED_PDQ=0`` (grouped wgmma); the fused
rows must equal their chained row byte for byte.

Usage: ``python benchmarks/bench_pdq.py [--m 8192,1024] [--t 1024,4096] [--fmt nvfp4,mxfp4]
[--suite dense,grouped,fused] [--impls SUBSTR,...] [--shape gpt-oss-120b|deepseek-v3]`` (only
the rows whose label contains one of the substrings, or is one given as ``=LABEL``, plus the
references; ``--shape``: the
grouped / fused suites' gate_up shape); kernels from the bundle (``make gpu-bundle``). The
"ws" rows take A from the grouped phase-1 workspace (issue #10; both launches timed).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.bench_moe import (
    GATE_UP,
    check_grouped_matmul,
    grouped_activation_scales,
    make_weights,
    route,
    sample_rows,
)
from benchmarks.common import (
    bundle_device,
    random_data,
    random_scales,
    timed_launches,
)

#: dense (label, kwargs of block_scaled_matmul_pdq); None: the two-phase reference, a dict
#: under "twophase": more kwargs of the two-phase pair
DENSE_IMPLS = (("twophase k64", None),
               ("twophase k64 staged", {"twophase": {"store": "staged"}}),
               ("twophase k64 staged 192", {"twophase": {"store": "staged", "bn": 192}}),
               ("pdq ws pf", {"a_source": "workspace", "prefetch": True}),
               ("pdq ws nopf", {"a_source": "workspace", "prefetch": False}),
               ("pdq packed pf", {"a_source": "packed", "prefetch": True}),
               ("pdq packed nopf", {"a_source": "packed", "prefetch": False}),
               ("pdq ws pf staged", {"a_source": "workspace", "prefetch": True,
                                     "store": "staged"}),
               ("pdq packed pf staged", {"a_source": "packed", "prefetch": True,
                                         "store": "staged"}),
               # 128 x 192 tiles: one producer warpgroup, two (512 threads)
               ("pdq ws pf staged 192", {"store": "staged", "bn": 192}),
               ("pdq packed pf staged 192", {"a_source": "packed", "store": "staged",
                                             "bn": 192}),
               ("pdq ws pf p2 192", {"producers": 2, "bn": 192}),
               ("pdq ws pf staged p2 192", {"store": "staged", "producers": 2, "bn": 192}),
               ("pdq packed pf p2 192", {"a_source": "packed", "producers": 2, "bn": 192}),
               ("pdq packed pf staged p2 192", {"a_source": "packed", "store": "staged",
                                                "producers": 2, "bn": 192}),
               # prefetch distance 2 (loads after the proxy fence)
               ("pdq ws pf staged d2", {"store": "staged", "depth": 2}),
               ("pdq packed pf staged d2", {"a_source": "packed", "store": "staged",
                                            "depth": 2}),
               ("pdq ws pf staged p2 192 d2", {"store": "staged", "producers": 2, "bn": 192,
                                               "depth": 2}),
               ("pdq packed pf staged p2 192 d2", {"a_source": "packed", "store": "staged",
                                                   "producers": 2, "bn": 192, "depth": 2}))
#: the L2 prefetch distances of the coalesced items' rows (:func:`extra_specs` bundles them)
L2_AHEAD = (2, 4)
#: grouped (label, kind, kwargs)
GROUPED_IMPLS = (("wgmma 128x256 lut k64", "wgmma", {"tiles": (128, 256), "dequant": "lut",
                                                     "kstep": 64, "scaling": "fold"}),
                 ("wgmma 128x256 default", "wgmma", {"tiles": (128, 256)}),
                 ("grouped pdq nopf", "pdq", {"prefetch": False}),
                 ("grouped pdq pf", "pdq", {"prefetch": True}),
                 ("grouped pdq pf staged", "pdq", {"prefetch": True, "store": "staged"}),
                 ("grouped pdq pf p2 192", "pdq", {"prefetch": True, "producers": 2,
                                                   "bn": 192}),
                 ("grouped pdq pf staged p2 192", "pdq", {"prefetch": True, "store": "staged",
                                                          "producers": 2, "bn": 192}),
                 ("grouped pdq pf staged p2 192 d2", "pdq", {"prefetch": True,
                                                             "store": "staged", "producers": 2,
                                                             "bn": 192, "depth": 2}),
                 # the fused SwiGLU op's σ store (columns un-permuted before the checks)
                 ("grouped pdq pf staged sigma", "pdq", {"prefetch": True, "store": "staged",
                                                         "sigma_out": True}),
                 ("grouped pdq pf sigma", "pdq", {"prefetch": True, "sigma_out": True}),
                 # A from the grouped phase-1 workspace (timed with its phase-1 launch)
                 ("grouped pdq pf staged ws", "pdq", {"prefetch": True, "store": "staged",
                                                      "a_source": "workspace"}),
                 ("grouped pdq pf staged sigma ws", "pdq", {"prefetch": True,
                                                            "store": "staged",
                                                            "sigma_out": True,
                                                            "a_source": "workspace"}),
                 ("grouped phase 1 ws", "p1", {}),
                 # step t + 1's A copy issued at the start of step t (its latency overlaps the
                 # dequantization of step t)
                 ("grouped pdq pf staged ws skip ae", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "a_early": True}),
                 ("grouped pdq pf staged sigma ws skip ae", "pdq",
                  {"prefetch": True, "store": "staged", "sigma_out": True,
                   "a_source": "workspace", "skip": True, "a_early": True}),
                 ("grouped pdq staged ws skip tma ae", "pdq",
                  {"store": "staged", "a_source": "workspace", "skip": True, "b_source": "tma",
                   "a_early": True}),
                 # 192 x 192 items (three consumer warpgroups: a group of <= 192 rows is one
                 # item, so each expert's weights are dequantized once at T=4096)
                 ("grouped pdq pf staged ws 192x192", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 192,
                   "bn": 192}),
                 ("grouped pdq pf staged sigma ws 192x192", "pdq",
                  {"prefetch": True, "store": "staged", "sigma_out": True,
                   "a_source": "workspace", "bm": 192, "bn": 192}),
                 # ... on f16 operands (NVFP4 only: the table-free E5M2 decode)
                 ("grouped pdq pf staged ws 192x192 f16", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 192,
                   "bn": 192, "dtype": "f16"}),
                 ("grouped pdq pf staged ws 192x192 pr", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 192,
                   "bn": 192, "pair": True}),
                 ("grouped pdq pf staged ws 192x192 f16 pr", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 192,
                   "bn": 192, "dtype": "f16", "pair": True}),
                 ("grouped pdq pf staged sigma ws 192x192 f16 pr", "pdq",
                  {"prefetch": True, "store": "staged", "sigma_out": True,
                   "a_source": "workspace", "bm": 192, "bn": 192, "dtype": "f16",
                   "pair": True}),
                 ("grouped pdq pf staged sigma ws 192x192 f16", "pdq",
                  {"prefetch": True, "store": "staged", "sigma_out": True,
                   "a_source": "workspace", "bm": 192, "bn": 192, "dtype": "f16"}),
                 # 256 x 128 items with B by TMA (their producer step waited on its loads)
                 ("grouped pdq staged ws 256x128 tma", "pdq",
                  {"store": "staged", "a_source": "workspace", "bm": 256, "bn": 128,
                   "unroll": 2, "b_source": "tma"}),
                 ("grouped pdq staged sigma ws 256x128 tma", "pdq",
                  {"store": "staged", "sigma_out": True, "a_source": "workspace", "bm": 256,
                   "bn": 128, "unroll": 2, "b_source": "tma"}),
                 # B's packed bytes and scale atoms by TMA into a shared ring (no global load
                 # in flight at the producer's proxy fence)
                 ("grouped pdq staged ws skip tma", "pdq",
                  {"store": "staged", "a_source": "workspace", "skip": True, "b_source": "tma"}),
                 ("grouped pdq staged sigma ws skip tma", "pdq",
                  {"store": "staged", "sigma_out": True, "a_source": "workspace", "skip": True,
                   "b_source": "tma"}),
                 # two producer warpgroups (8 warps: 2 a scheduler) at 128 x 192, A from the
                 # workspace: does a second producer warp per scheduler hide the decode latency?
                 ("grouped pdq pf staged ws p2 192", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "producers": 2,
                   "bn": 192}),
                 # 128-row items: a warpgroup past the group's end issues no wgmma
                 ("grouped pdq pf staged ws skip", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True}),
                 ("grouped pdq pf staged sigma ws skip", "pdq",
                  {"prefetch": True, "store": "staged", "sigma_out": True,
                   "a_source": "workspace", "skip": True}),
                 ("grouped pdq pf staged ws skip pr", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "pair": True}),
                 ("grouped pdq pf staged ws skip f16 pr", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "dtype": "f16", "pair": True}),
                 ("grouped pdq staged ws skip tma f16", "pdq",
                  {"store": "staged", "a_source": "workspace", "skip": True, "b_source": "tma",
                   "dtype": "f16"}),
                 ("grouped pdq pf staged ws skip f16", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "dtype": "f16"}),
                 ("grouped pdq pf staged sigma ws skip f16", "pdq",
                  {"prefetch": True, "store": "staged", "sigma_out": True,
                   "a_source": "workspace", "skip": True, "dtype": "f16"}),
                 # 256 x 128 items (two workspace tiles, 128 weight rows a step)
                 # (the producer loop unrolled by 2, the dispatch's; "u1": not)
                 ("grouped pdq pf staged ws 256x128", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 256,
                   "bn": 128, "unroll": 2}),
                 ("grouped pdq pf staged sigma ws 256x128", "pdq",
                  {"prefetch": True, "store": "staged", "sigma_out": True,
                   "a_source": "workspace", "bm": 256, "bn": 128, "unroll": 2}),
                 ("grouped pdq pf staged ws 256x128 u1", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 256,
                   "bn": 128}),
                 ("grouped pdq pf ws 256x128", "pdq",
                  {"prefetch": True, "a_source": "workspace", "bm": 256, "bn": 128,
                   "unroll": 2}),
                 # prefetch distance 2 (loads issued after the producer's proxy fence)
                 ("grouped pdq pf staged ws 256x128 d2", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 256,
                   "bn": 128, "unroll": 2, "depth": 2}),
                 ("grouped pdq pf staged ws skip d2", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "depth": 2}),
                 # the dispatch's items with warp-coalesced producer loads (a warp reads
                 # whole k64 steps of 16 / 8 rows: full sectors)
                 ("grouped pdq pf staged ws skip co", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "coalesce": True}),
                 ("grouped pdq pf staged ws skip pr co", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "pair": True, "coalesce": True}),
                 ("grouped pdq pf staged ws skip f16 pr co", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "dtype": "f16", "pair": True, "coalesce": True}),
                 ("grouped pdq pf staged ws 192x192 co", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 192,
                   "bn": 192, "coalesce": True}),
                 ("grouped pdq pf staged ws 192x192 f16 co", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "bm": 192,
                   "bn": 192, "dtype": "f16", "coalesce": True}),
                 # ... and step t + L's B rows brought into L2 at step t (prefetch.global.L2)
                 *((f"grouped pdq pf staged ws {it} co l2p{d}", "pdq",
                    {"prefetch": True, "store": "staged", "a_source": "workspace",
                     "coalesce": True, "l2_ahead": d, **kw})
                   for d in L2_AHEAD for it, kw in (
                       ("skip", {"skip": True}), ("skip pr", {"skip": True, "pair": True}),
                       ("skip f16 pr", {"skip": True, "dtype": "f16", "pair": True}),
                       ("192x192", {"bm": 192, "bn": 192}))),
                 # the band split: the coalesced skip items for the groups outside (128, 192]
                 # rows, their 192 x 192 twins for those inside (two launches, one output)
                 ("grouped pdq pf staged ws skip pr co band", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "pair": True, "coalesce": True, "band": "split"}),
                 ("grouped pdq pf staged ws skip f16 pr co band", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "dtype": "f16", "pair": True, "coalesce": True, "band": "split"}),
                 # ... the pair by programmatic dependent launch
                 ("grouped pdq pf staged ws skip pr co band pdl", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "pair": True, "coalesce": True, "band": "split", "pdl": True}),
                 ("grouped pdq pf staged ws skip f16 pr co band pdl", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "dtype": "f16", "pair": True, "coalesce": True, "band": "split",
                   "pdl": True}),
                 # ... and both kernels on the dynamic schedule (an option, not yet dispatched)
                 ("grouped pdq pf staged ws skip pr co band pdl dyn", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "pair": True, "coalesce": True, "band": "split", "pdl": True,
                   "schedule": "dynamic"}),
                 ("grouped pdq pf staged ws skip f16 pr co band pdl dyn", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "dtype": "f16", "pair": True, "coalesce": True, "band": "split",
                   "pdl": True, "schedule": "dynamic"}),
                 ("grouped pdq pf staged ws skip co l2p2 band", "pdq",
                  {"prefetch": True, "store": "staged", "a_source": "workspace", "skip": True,
                   "coalesce": True, "l2_ahead": 2, "band": "split"}),
                 # the register-A kernel (NVFP4: the weights converted into the wgmma's A
                 # registers by the consumers; matmul_grouped_rs), its depths and stages
                 ("grouped rs", "rs", {}),
                 ("grouped rs d1", "rs", {"depth": 1}),
                 ("grouped rs d3", "rs", {"depth": 3}),
                 ("grouped rs s6", "rs", {"stages": 6}),
                 ("grouped rs s8", "rs", {"stages": 8}),
                 ("grouped rs w3", "rs", {"wgs": 3}),
                 ("grouped rs w3 s6", "rs", {"wgs": 3, "stages": 6}))
#: fused SwiGLU suite (label, fused op?, BLOCKSCALE_SM90_GROUPED_PDQ, the pdq dispatch's A
#: source, item height and skip: matmul_grouped_pdq.A_SOURCE_ENV / BM_ENV / SKIP_ENV): the
#: dispatch's chained path (grouped matmul + fused_silu_quantize) is the reference the fused
#: rows of its family must equal
FUSED_IMPLS = (("chained pdq + silu-quantize", False, "1", "packed", "128", "0"),
               ("fused (pdq sigma + silu-quantize)", True, "1", "packed", "128", "0"),
               ("chained wgmma + silu-quantize", False, "0", "packed", "128", "0"),
               ("fused (wgmma sigma + silu-quantize)", True, "0", "packed", "128", "0"),
               ("chained pdq ws + silu-quantize", False, "1", "workspace", "128", "0"),
               ("fused (pdq ws sigma + silu-quantize)", True, "1", "workspace", "128", "0"),
               ("chained pdq ws skip + silu-quantize", False, "1", "workspace", "128", "1"),
               ("fused (pdq ws skip sigma + silu-quantize)", True, "1", "workspace", "128",
                "1"),
               ("chained pdq ws 256x128 + silu-quantize", False, "1", "workspace", "256", "0"),
               ("fused (pdq ws 256x128 sigma + silu-quantize)", True, "1", "workspace",
                "256", "0"))


def extra_specs(target: str = "sm_90a") -> list[Any]:
    """The grouped rows' L2-prefetch kernels (``make gpu-bundle`` bundles them): the
    dispatch's coalesced items (NVFP4 f16 paired skip, MXFP4 paired skip and 192 x 192,
    MXFP8 skip and 192 x 192; plain store) at each :data:`L2_AHEAD`."""
    from blockscale.ops import matmul_grouped_pdq as GP

    if target != "sm_90a":
        return []
    fmts = {"skip": ("mxfp8",), "skip pr": ("mxfp4",), "skip f16 pr": ("nvfp4",),
            "192x192": ("mxfp4", "mxfp8")}
    out = []
    for label, _, kw in GROUPED_IMPLS:
        if " l2p" in label and "band" not in kw:  # (the band rows: the dispatch's kernels)
            item = label.split(" ws ", 1)[1].split(" co ")[0]
            out += [GP.GroupedPdqSpec(f, False, target, **kw) for f in fmts[item]]
    return out


def _select(impls: tuple, only: Sequence[str] | None) -> tuple:
    """The reference (first) row and those whose label contains one of ``only`` (one
    starting with "=": the label itself)."""
    if not only:
        return impls

    def picked(label: str) -> bool:
        return any(label == x[1:] if x.startswith("=") else x in label for x in only)

    return impls[:1] + tuple(i for i in impls[1:] if picked(i[0]))


def bench_dense(dev: Any, m_values: Sequence[int], fmts: Sequence[str], n: int = 5760,
                k: int = 2944, log: Any = print, only: Sequence[str] | None = None
                ) -> list[tuple[str, str, float | None, str]]:
    from blockscale.formats import Format
    from blockscale.layouts import interleave
    from blockscale.ops import matmul_pdq as P
    from blockscale.ops import matmul_twophase as TP

    out = []
    rng = np.random.default_rng(1)
    for f in fmts:
        fmt = Format.from_name(f)
        b = dev.to_device(random_data(rng, fmt, (n, fmt.data_cols(k))))
        sfb = dev.to_device(interleave(random_scales(rng, fmt, (n, fmt.kblocks(k)))))
        for m in m_values:
            a = dev.to_device(random_data(rng, fmt, (m, fmt.data_cols(k))))
            sfa = dev.to_device(interleave(random_scales(rng, fmt, (m, fmt.kblocks(k)))))
            case, ref = f"{f} {m}x{n}x{k}", None
            ops = (a, b, sfa, sfb, fmt)
            for label, kw in _select(DENSE_IMPLS, only):
                try:
                    if kw is None or "twophase" in kw:
                        tw = (kw or {}).get("twophase", {})
                        got, ms, _ = timed_launches(dev, lambda ops=ops, tw=tw:
                                                    TP.block_scaled_matmul_twophase(
                                                        *ops, kstep=64, device=dev, **tw))
                    else:
                        got, ms, _ = timed_launches(dev, lambda ops=ops, kw=kw:
                                                    P.block_scaled_matmul_pdq(
                                                        *ops, device=dev, **kw))
                    host = np.asarray(dev.to_host(got)).view(np.uint16)
                    if ref is None:
                        ref, text = host, "reference"
                    else:
                        same = np.array_equal(host, ref)
                        text = "== twophase" if same else \
                            f"DIFFERS from twophase ({np.mean(host != ref):.2%} of outputs)"
                except Exception as e:  # noqa: BLE001 - missing kernel, launch failure
                    ms, text = None, f"error: {type(e).__name__}: {str(e)[:80]}"
                rate = f"{2.0 * m * n * k / ms / 1e9:7.1f} TFLOP/s" if ms else ""
                log(f"  {case:28} {label:28} {f'{ms:8.3f} ms' if ms else '       -   '} "
                    f"{rate} {text}")
                out.append((case, label, ms, text))
    return out


def bench_grouped(dev: Any, t_values: Sequence[int], fmts: Sequence[str],
                  log: Any = print, only: Sequence[str] | None = None,
                  shape_name: str = "gpt-oss-120b"
                  ) -> list[tuple[str, str, float | None, str]]:
    from blockscale.formats import Format
    from blockscale.ops import matmul_grouped_pdq as GP
    from blockscale.ops import matmul_grouped_rs as GR
    from blockscale.ops import matmul_grouped_wgmma as gw

    out = []
    shape = next(s for s in GATE_UP if s.name == shape_name)
    rng = np.random.default_rng(1)
    for f in fmts:
        fmt = Format.from_name(f)
        w = make_weights(dev, rng, fmt, shape.experts, shape.n, shape.k)
        for t in t_values:
            r = route(rng, t, shape.experts, shape.top_k)
            a = random_data(rng, fmt, (r.rows, fmt.data_cols(shape.k)))
            a_sc2d, a_sc5 = grouped_activation_scales(rng, fmt, r, shape.k)
            a_dev, sc_dev = dev.to_device(a), dev.to_device(a_sc5)
            args = (a_dev, w.data_dev, sc_dev, w.scales_dev, r.expert_start, r.scales_offset,
                    r.expert_ids, w.expert_scales, w.fmt)
            case, ref = f"{shape.name} {f} T={t} ({r.rows} rows)", None
            for label, kind, kw in _select(GROUPED_IMPLS, only):
                # f16 operands, and the paired 192-row items, are bundled for NVFP4 only
                nvfp4_only = kw.get("dtype") == "f16" or (kw.get("pair") and kw.get("bm") == 192) \
                    or kind == "rs"
                if nvfp4_only and f != "nvfp4":
                    continue
                if kind == "p1":  # the grouped phase 1 alone (part of the "ws" rows' time)
                    out.append(_time_phase1(dev, label, case, args, shape.k, log))
                    continue
                try:
                    fn = {"wgmma": gw.grouped_matmul_block_scaled_wgmma,
                          "rs": GR.grouped_matmul_block_scaled_rs}.get(
                              kind, GP.grouped_matmul_block_scaled_pdq)
                    got, ms, _ = timed_launches(dev, lambda fn=fn, kw=kw, args=args: fn(
                        *args, k=shape.k, device=dev, **kw))
                    host = np.asarray(dev.to_host(got))
                    if kw.get("sigma_out"):  # gate | up columns back to the weight rows' order
                        host = _unsigma_cols(host)
                    rows = sample_rows(rng, r.rows, 6)
                    ok, text = check_grouped_matmul(host[rows], a, a_sc2d, rows, r, w)
                    if ref is None:
                        ref = host.view(np.uint16)
                    elif kind == "pdq":
                        same = np.array_equal(host.view(np.uint16), ref)
                        text += " == wgmma lut k64" if same else " DIFFERS from wgmma lut k64"
                    elif kind == "rs":  # another fp32 order: the largest difference
                        r16 = ref.view(ml_dtypes.bfloat16).astype(np.float32)
                        diff = np.abs(host.astype(np.float32) - r16).max()
                        text += f" max|d| {diff / max(np.abs(r16).max(), 1e-30):.1e} of max"
                    ms = ms if ok else None
                except Exception as e:  # noqa: BLE001 - missing kernel, launch failure
                    ms, text = None, f"error: {type(e).__name__}: {str(e)[:80]}"
                rate = f"{2.0 * r.rows * shape.n * shape.k / ms / 1e9:7.1f} TFLOP/s" \
                    if ms else ""
                log(f"  {case:42} {label:38} {f'{ms:8.3f} ms' if ms else '       -   '} "
                    f"{rate} {text[:70]}")
                out.append((case, label, ms, text))
    return out


def _time_phase1(dev: Any, label: str, case: str, args: tuple, k: int,
                 log: Any) -> tuple[str, str, float | None, str]:
    """The grouped phase 1 alone (``matmul_grouped_p1.dequantize_grouped_a``)."""
    from blockscale.ops import matmul_grouped_p1 as G1

    a, _w, sc, _sw, es, offs, ids, _esc, fmt = args
    try:
        _, ms, _ = timed_launches(dev, lambda: G1.dequantize_grouped_a(
            a, sc, es, offs, ids, fmt, k=k, device=dev))
        text = "phase 1 alone (in the ws rows)"
    except Exception as e:  # noqa: BLE001 - missing kernel, launch failure
        ms, text = None, f"error: {type(e).__name__}: {str(e)[:80]}"
    log(f"  {case:42} {label:38} {f'{ms:8.3f} ms' if ms else '       -   '} {text}")
    return case, label, ms, text


def _unsigma_cols(x: np.ndarray) -> np.ndarray:
    """Columns ``gate | up`` (σ store) back to the σ order (2i gate i, 2i + 1 up i)."""
    out = np.empty_like(x)
    half = x.shape[1] // 2
    out[:, 0::2], out[:, 1::2] = x[:, :half], x[:, half:]
    return out


def bench_fused(dev: Any, t_values: Sequence[int], fmts: Sequence[str], log: Any = print,
                only: Sequence[str] | None = None, shape_name: str = "gpt-oss-120b"
                ) -> list[tuple[str, str, float | None, str]]:
    """gpt-oss-120b gate_up + SiLU quantize: ``grouped_matmul_swiglu`` on σ-permuted weights
    against the chained dispatch (``grouped_matmul_block_scaled`` on the un-permuted weights,
    then ``fused_silu_quantize``), with the grouped pdq kernel and with
    BLOCKSCALE_SM90_GROUPED_PDQ=0 (the grouped wgmma kernel); fused rows byte-checked
    against the chained row of the same kernel family."""
    import os

    from benchmarks.bench_moe import ExpertWeights
    from benchmarks.common import interleave_stack
    from blockscale.formats import Format
    from blockscale.ops import fused_silu_quantize, grouped_matmul_block_scaled
    from blockscale.ops import matmul_grouped_pdq as GP
    from blockscale.ops import matmul_grouped_wgmma as gw
    from blockscale.ops.matmul_swiglu import grouped_matmul_swiglu

    out = []
    shape = next(s for s in GATE_UP if s.name == shape_name)
    rng = np.random.default_rng(2)
    for f in fmts:
        fmt = Format.from_name(f)
        ws = make_weights(dev, rng, fmt, shape.experts, shape.n, shape.k)  # σ-permuted rows
        d = shape.n // 2
        un = np.concatenate([ws.data[:, 0::2], ws.data[:, 1::2]], axis=1)
        un_s2 = np.concatenate([ws.scales2d[:, 0::2], ws.scales2d[:, 1::2]], axis=1)
        wu = ExpertWeights(fmt, un, un_s2, dev.to_device(un),
                           dev.to_device(interleave_stack(un_s2)), ws.expert_scales, shape.k)
        isc = None if fmt.is_mx else rng.uniform(0.5, 2.0, shape.experts).astype(np.float32)
        for t in t_values:
            r = route(rng, t, shape.experts, shape.top_k)
            a = random_data(rng, fmt, (r.rows, fmt.data_cols(shape.k)))
            _a2d, a_sc5 = grouped_activation_scales(rng, fmt, r, shape.k)
            a_dev, sc_dev = dev.to_device(a), dev.to_device(a_sc5)
            grp = (r.expert_start, r.scales_offset, r.expert_ids)
            case, refs = f"{shape.name} {f} T={t} ({r.rows} rows, D={d})", {}

            def chained(wu: Any = wu, a_dev: Any = a_dev, sc_dev: Any = sc_dev,
                        grp: tuple = grp, tiles: int = a_sc5.shape[0], isc: Any = isc,
                        fmt: Any = fmt) -> Any:
                gu = grouped_matmul_block_scaled(a_dev, wu.data_dev, sc_dev, wu.scales_dev,
                                                 *grp, wu.expert_scales, fmt, k=shape.k,
                                                 device=dev)
                return fused_silu_quantize(gu, fmt, *grp, isc, num_scale_tiles=tiles,
                                           device=dev)

            def fused(ws: Any = ws, a_dev: Any = a_dev, sc_dev: Any = sc_dev, grp: tuple = grp,
                      isc: Any = isc, fmt: Any = fmt) -> Any:
                return grouped_matmul_swiglu(a_dev, ws.data_dev, sc_dev, ws.scales_dev, *grp,
                                             ws.expert_scales, isc, fmt, k=shape.k, device=dev)

            for label, is_fused, pdq, a_src, bm, skip in _select(FUSED_IMPLS, only):
                old = {v: os.environ.get(v) for v in (gw.PDQ_ENV_SWITCH, GP.A_SOURCE_ENV,
                                                      GP.BM_ENV, GP.SKIP_ENV)}
                os.environ[gw.PDQ_ENV_SWITCH] = pdq
                os.environ[GP.A_SOURCE_ENV] = a_src
                os.environ[GP.BM_ENV] = bm
                os.environ[GP.SKIP_ENV] = skip
                family = (pdq, a_src, bm, skip)
                try:
                    (data, scales), ms, _ = timed_launches(dev, fused if is_fused else chained)
                    got = b"".join(np.ascontiguousarray(np.asarray(dev.to_host(x)))
                                   .view(np.uint8).tobytes() for x in (data, scales))
                    if is_fused:
                        want = refs.get(family)
                        text = "no chained row" if want is None else \
                            ("== chained" if got == want else "DIFFERS from chained")
                    else:
                        refs[family] = got
                        first = refs.get(("1", "packed", "128", "0")) if pdq == "1" else None
                        text = "reference" if first is None or first is got else \
                            ("== chained pdq" if got == first else "DIFFERS from chained pdq")
                except Exception as e:  # noqa: BLE001 - missing kernel, launch failure
                    ms, text = None, f"error: {type(e).__name__}: {str(e)[:80]}"
                finally:
                    for v, was in old.items():
                        if was is None:
                            os.environ.pop(v, None)
                        else:
                            os.environ[v] = was
                log(f"  {case:46} {label:44} {f'{ms:8.3f} ms' if ms else '       -   '} "
                    f"{text}")
                out.append((case, label, ms, text))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="8192,1024")
    p.add_argument("--t", default="1024,4096")
    p.add_argument("--fmt", default="nvfp4,mxfp4")
    p.add_argument("--suite", default="dense,grouped")
    p.add_argument("--impls", default="", help="label substrings (comma-separated)")
    p.add_argument("--shape", default="gpt-oss-120b",
                   help="grouped / fused: " + " | ".join(s.name for s in GATE_UP))
    ns = p.parse_args(argv)
    dev = bundle_device()
    fmts, suites = ns.fmt.split(","), ns.suite.split(",")
    only = [x for x in ns.impls.split(",") if x]
    rows = []
    if "dense" in suites:
        rows += bench_dense(dev, [int(x) for x in ns.m.split(",")], fmts, only=only)
    if "grouped" in suites:
        rows += bench_grouped(dev, [int(x) for x in ns.t.split(",")], fmts, only=only,
                              shape_name=ns.shape)
    if "fused" in suites:
        rows += bench_fused(dev, [int(x) for x in ns.t.split(",")], fmts, only=only,
                            shape_name=ns.shape)
    return 0 if all(ms is not None for _, _, ms, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
