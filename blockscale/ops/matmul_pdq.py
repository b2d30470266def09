"""Warp-specialized "producer-dequant" sm_90a block-scaled matmul (NVFP4, MXFP4; issue #9).

Same contract as :func:`blockscale.ops.matmul_twophase.block_scaled_matmul_twophase` (SEMANTICS
§4.1: 5-D scales, fp32 accumulation, ``alpha`` on the accumulator, bf16 / f32 output, an
optional fused :class:`~blockscale.ops.matmul_epilogue.Epilogue`; K % 32 == 0).

Kernels: phase 1 of the two-phase pair for A only (:class:`~blockscale.ops.matmul_twophase.
DequantSpec`, tile 128: the activations' bf16 workspace), then :class:`PdqMatmulSpec`: the
two-phase kernel's consumers (two warpgroups of ``m64n256k16`` bf16 wgmmas over a shared
stage ring, full / empty mbarriers) plus a producer warpgroup that fills each stage with A
by ``cp.async.bulk`` from the workspace and B dequantized from the PACKED weights in
registers (:mod:`blockscale.ops._pdq_ir`). B never goes through global memory as bf16: at
8192 x 5760 x 2944 the workspaces shrink from 82.9 MB (written and read) to 48 MB (A).

Numerics: the same stage bytes and k16 wgmma order as the two-phase kernel (kstep 64, bm 128),
so bit-identical to it in the interpreter; on the GPU within the stated bound.

Not in any dispatch (issue #9: the lead measures it first). Importing this module does not
import MLIR.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import matmul as _matmul
from blockscale.ops import matmul_twophase as TP
from blockscale.ops._staged_store_ir import check_store
from blockscale.ops.matmul_epilogue import Epilogue

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._pdq_ir", "blockscale.ops._twophase_ir",
                  "blockscale.ops._staged_store_ir",
                  "blockscale.ops._wgmma_ir", "blockscale.ops._mma_ir",
                  "blockscale.ops.matmul_epilogue", "blockscale.ops._matmul_ir",
                  "blockscale.ops.matmul_sm90")
TARGETS = ("sm_90a",)
FORMATS = ("nvfp4", "mxfp4")
#: the CTA tile (2 consumer warpgroups of m64n256), K elements per step (= _pdq_ir.KSTEP)
BM, BN, KSTEP = 128, 256, 64
#: the CTA's threads: 2 consumer warpgroups + the producer warpgroup (= _pdq_ir.threads(BM))
THREADS = 384
#: producer warpgroups (= _pdq_ir.PRODUCERS): 2 gives 512 threads, 128 registers a thread,
#: so the 128 x 192 tile (96 accumulator registers; ptxas keeps code after setmaxnreg.inc to
#: the entry count, so m64n256's 128 accumulators do not fit)
PRODUCERS = (1, 2)
#: the C tile widths (= _pdq_ir.BNS)
BNS = (256, 192)
#: loop structures (= _pdq_ir.LOOPS)
LOOPS = ("split", "lockstep")
#: where the stages' A comes from: the phase-1 workspace (bulk copies) or the packed rows
#: (dequantized by the producer)
A_SOURCES = ("workspace", "packed")
#: the epilogue: "direct" (matmul_sm90.store_tile by the consumers) or "staged" (the tile
#: into the free ring, one bulk copy per row: _staged_store_ir, every thread of the CTA
#: after the role branches; N * element bytes % 16 == 0)
STORES = ("direct", "staged")
#: shared stages: 48 KiB each (A 16 + B 32); 4 fill 196,672 bytes (bn 192: 40 KiB, 5 stages)
MAX_STAGES = 4


def max_stages(bn: int = BN, bm: int = BM) -> int:
    """The most ring stages of (bm + bn) x 64 bf16 in the 227 KiB of shared memory."""
    return (227 * 1024 - 64) // ((bm + bn) * 2 * KSTEP + 16)


def ring_bytes(stages: int, bn: int = BN, bm: int = BM) -> int:
    """The ring (``stages`` x (bm + bn) rows x 64 bf16) and its ``2 stages`` mbarriers."""
    return stages * (bm + bn) * 2 * KSTEP + 16 * stages


@dataclasses.dataclass(frozen=True)
class PdqMatmulSpec(FormatSpec):
    """The producer-dequant kernel (after phase 1 of A).

    Attributes:
        fmt: "nvfp4" | "mxfp4".
        out_dtype: "bfloat16" | "float32".
        epilogue: an optional fused :class:`Epilogue`.
        target: "sm_90a".
        stages: shared stages (2 .. :func:`max_stages`); None: the most.
        prefetch: the producer loads step t + 1's packed B before dequantizing step t
            (loop-carried registers); False: load, then dequantize.
        loop: :data:`LOOPS`: "split", each role its own K loop (the GPU design: the
            producer's registers are free of the accumulators; the lock-step interpreter
            runs it only while the K steps fit in the ring, ``ceil(K / 64) < stages``);
            "lockstep", one loop running both roles per iteration (any K in the
            interpreter; the producer's path also holds the accumulators: 168-register
            cap, spills).
        a_source: :data:`A_SOURCES`: "workspace", A's bf16 workspace (phase 1) copied by
            ``cp.async.bulk``; "packed", the producer dequantizes A's packed rows too (no
            phase 1: 384 rows a step for the producer instead of 256).
        store: :data:`STORES` (the staged tile must fit in the ring: f32 output needs
            3 stages).
        producers: :data:`PRODUCERS`: 2, two producer warpgroups (512 threads; the row
            halves of a step dealt over 256 threads: ``_pdq_ir._units``); needs bn 192.
        bn: :data:`BNS`, the C tile's columns (the consumers' m64nBN wgmmas).
        depth: prefetch distance: 1, step t + 1's packed rows loaded before step t's
            conversion; 2, step t + 2's loaded after step t's proxy fence (MEMBAR.ALL.CTA
            then waits for the stores only; needs the prefetch).
    """

    fmt: str
    out_dtype: str = "bfloat16"
    epilogue: Epilogue | None = None
    target: str = "sm_90a"
    stages: int | None = None
    prefetch: bool = True
    loop: str = "split"
    a_source: str = "workspace"
    store: str = "direct"
    producers: int = 1
    bn: int = BN
    depth: int = 1

    op: ClassVar[str] = "block_scaled_matmul_pdq"

    def __post_init__(self) -> None:
        _matmul.check_spec_fields(self)
        object.__setattr__(self, "target", TP._check_format(self.fmt, self.target))
        H.check_choice(self.bn, BNS, "bn")
        most = max_stages(self.bn)
        if self.stages is None:
            object.__setattr__(self, "stages", most)
        if type(self.stages) is not int or not 2 <= self.stages <= most:
            raise ValueError(f"stages must be an int in [2, {most}] at bn={self.bn}, got "
                             f"{self.stages!r}")
        if not isinstance(self.prefetch, bool):
            raise TypeError(f"prefetch must be a bool, got {type(self.prefetch).__name__}")
        H.check_choice(self.loop, LOOPS, "loop")
        H.check_choice(self.a_source, A_SOURCES, "a_source")
        H.check_choice(self.store, STORES, "store")
        if self.store == "staged":
            check_staged_fits(self.out_dtype, self.stages, self.bn)
        check_producers(self.producers, self.bn)
        check_depth(self.depth, self.prefetch)

    @property
    def block(self) -> tuple[int, int, int]:
        """The CTA: :data:`THREADS` + 128 a second producer warpgroup."""
        return (THREADS + 128 * (self.producers - 1), 1, 1)

    @property
    def dynamic_shared_bytes(self) -> int:
        """The ring (``stages`` x (BM + bn) rows x 64 bf16) and its ``2 stages`` mbarriers."""
        return ring_bytes(self.stages, self.bn)

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        pf = "" if self.prefetch else "_nopf"
        lp = "" if self.loop == "split" else f"_{self.loop}"
        pa = "_pa" if self.a_source == "packed" else ""
        st = "_st" if self.store == "staged" else ""
        pr = f"_p{self.producers}" if self.producers > 1 else ""
        pr += "_d2" if self.depth == 2 else ""
        return (f"bs_pdq_{self.fmt}_{BM}x{self.bn}_k{KSTEP}_s{self.stages}_"
                f"{H.out_tag(self.out_dtype)}{pa}{pf}{lp}{st}{pr}{ep}")

    def args(self) -> tuple[KernelArg, ...]:
        """wa (A's workspace bytes; a_source "packed": a, sfa), b, sfb (packed B and its 5-D
        scales), c, epilogue inputs, m, n, k, alpha."""
        base = _matmul.MatmulSpec(self.fmt, self.out_dtype, "tcgen5d", self.epilogue,
                                  self.target).args()
        if self.a_source == "packed":
            return base
        return (KernelArg("wa", "buffer", "uint8"),
                *(a for a in base if a.name not in ("a", "sfa")))


def check_staged_fits(out_dtype: str, stages: int, bn: int = BN, bm: int = BM) -> None:
    """ValueError when the staged bm x bn output tile does not fit in ``stages`` ring
    stages."""
    from blockscale.ops import _staged_store_ir as S

    need, ring = S.stage_bytes(out_dtype, bm, bn), stages * (bm + bn) * 2 * KSTEP
    if need > ring:
        raise ValueError(f"store 'staged' needs {need} bytes of the ring, but "
                         f"stages={stages} give {ring}")


def check_producers(producers: Any, bn: int) -> None:
    """ValueError for producer warpgroups not in :data:`PRODUCERS`, or two at bn 256 (512
    threads have 128 registers each: no room for m64n256's 128 accumulators)."""
    if type(producers) is not int or producers not in PRODUCERS:
        raise ValueError(f"producers must be one of {list(PRODUCERS)}, got {producers!r}")
    if producers > 1 and bn != 192:
        raise ValueError(f"producers={producers} needs bn=192 (512 threads: 128 registers "
                         f"a thread), got bn={bn}")


def check_depth(depth: Any, prefetch: bool) -> None:
    """ValueError for a prefetch distance other than 1 or 2 (2 with the prefetch)."""
    if type(depth) is not int or depth not in (1, 2) or (depth == 2 and not prefetch):
        raise ValueError(f"depth must be 1 or 2 (2 needs prefetch=True), got {depth!r} "
                         f"(prefetch={prefetch})")


def grid(m: int, n: int, bn: int = BN) -> tuple[int, int, int]:
    """One CTA per 128 x bn tile of C (1-D, rasterized in the kernel)."""
    return TP.grid(m, n, BM, bn=bn)


def build(spec: PdqMatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of ``spec``'s kernel (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._pdq_ir as P
    import blockscale.ops._staged_store_ir as S
    import blockscale.ops._twophase_ir as T
    import blockscale.ops._wgmma_ir as X
    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import tma
    from blockscale.ops import matmul_sm90 as _sm90
    from blockscale.ops._matmul_ir import tcgen_row_offset

    if (P.KSTEP, P.BN, P.threads(BM, spec.producers), T.BM, P.LOOPS, P.PRODUCERS, P.BNS) != (
            KSTEP, BN, spec.block[0], BM, LOOPS, PRODUCERS, BNS):
        raise AssertionError("matmul_pdq's constants disagree with _pdq_ir's")
    bn = spec.bn
    if T.shared_bytes(KSTEP, spec.stages, BM, bn) != spec.dynamic_shared_bytes:
        raise AssertionError("matmul_pdq's shared bytes disagree with _twophase_ir's")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        m_count, n_count, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
        mt, nt = T.raster_tile(bir.ceil_div(m_count, BM), bir.ceil_div(n_count, bn))
        m0, n0 = bir.mul(mt, BM), bir.mul(nt, bn)
        block = 16 if spec.fmt == "nvfp4" else 32
        d1 = bir.ceil_div(bir.ceil_div(k, block), 4)
        src = P.PackedRows(kb.arg("b"), kb.arg("sfb"), n0, bir.sub(n_count, n0), k,
                           lambda r: tcgen_row_offset(bir.add(n0, r), d1), bn)
        if spec.a_source == "packed":
            a_op = P.PackedRows(kb.arg("a"), kb.arg("sfa"), m0, bir.sub(m_count, m0), k,
                                lambda r: tcgen_row_offset(bir.add(m0, r), d1), BM)
        else:
            a_op = kb.arg("wa")
        fix = X.accumulator_scale("lut", spec.fmt, "fold")

        def scale(v: Any, m: Any, n: Any) -> Any:
            if fix != 1.0:  # exact power of two first, then alpha (as the two-phase kernel)
                v = arith.mulf(v, bir.const(fix, bir.f32()))
            return _sm90._alpha(v, kb.arg("alpha"))

        def store(acc: Any, wg: Any, writers: Any) -> None:
            if spec.store == "staged":  # every thread; the consumers write the stage
                smem = tma.extern_shared_buffer(kb, T.shared_bytes(KSTEP, spec.stages, BM, bn))
                S.store_tile_staged(spec, kb, T.accumulator_tiles(acc, bn), X.warp_coords(wg),
                                    smem, m0, n0, m_count, n_count, scale, BM, bn, writers)
                return
            _sm90.store_tile(spec, kb, T.accumulator_tiles(acc, bn), X.warp_coords(wg), m0, n0,
                             m_count, n_count, scale)

        P.emit_mainloop(kb, a_op, m0, src, k, spec.fmt, spec.stages, store, BM,
                        spec.prefetch, spec.loop, all_threads=spec.store == "staged",
                        producers=spec.producers, bn=bn, depth=spec.depth)
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def block_scaled_matmul_pdq(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                            k: int | None = None, alpha: float = 1.0,
                            out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                            epilogue_inputs: dict[str, Any] | None = None,
                            stages: int | None = None, prefetch: bool = True,
                            loop: str = "split", a_source: str = "workspace",
                            store: str = "direct", producers: int = 1, bn: int = BN,
                            depth: int = 1, device: Any = None) -> Any:
    """The producer-dequant kernel called directly (no dispatch), e.g. by tests and
    benchmarks. Arguments as :func:`blockscale.ops.matmul_twophase.
    block_scaled_matmul_twophase` (5-D scales) plus ``stages``, ``prefetch``, ``loop``,
    ``a_source``, ``store``, ``producers``, ``bn`` and ``depth`` (:class:`PdqMatmulSpec`). Allocates A's bf16 workspace
    (``2 k_pad M_pad`` bytes) per call. Raises ValueError for a format other than NVFP4 /
    MXFP4, K % 32 != 0, or a staged store of rows not 16-byte aligned."""
    fmt = Format.from_name(fmt)
    if fmt.name not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt.name!r}")
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    if d.k % 32:
        raise ValueError(f"the producer-dequant kernel takes k % 32 == 0, got k={d.k}")
    dev, tgt = H.device_and_target(device, "sm_90a")
    spec = PdqMatmulSpec(fmt.name, out_dtype, epilogue, tgt, stages, prefetch, loop, a_source,
                         store, producers, bn, depth)
    check_store(spec.store, spec.out_dtype, d.n)
    alpha = H.finite_f32(alpha, "alpha")
    extra = dict(epilogue_inputs or {})
    H.check_epilogue_inputs(spec.epilogue.inputs if spec.epilogue else (), extra, d.m, d.n)
    ops = {"a": a, "b": b, "sfa": sfa, "sfb": sfb}
    if d.m == 0 or d.n == 0:
        return H.launch(spec, grid(d.m, d.n, spec.bn), (d.m, d.n), spec.out_dtype,
                        {**ops, **extra}, {}, dev, empty=True)
    host = all(isinstance(v, np.ndarray) for v in (*ops.values(), *extra.values()))
    if host:  # keep the workspace on the device between the launches
        ops = {n: dev.to_device(np.ascontiguousarray(v)) for n, v in ops.items()}
    if spec.a_source == "packed":
        bufs = dict(ops)
    else:
        bufs = {"wa": TP._dequantize(spec.fmt, spec.target, ops["a"], ops["sfa"], d.m, BM, d.k,
                                     dev), "b": ops["b"], "sfb": ops["sfb"]}
    out = H.launch(spec, grid(d.m, d.n, spec.bn), (d.m, d.n), spec.out_dtype, {**bufs, **extra},
                   {"m": d.m, "n": d.n, "k": d.k, "alpha": alpha}, dev)
    return dev.to_host(out) if host else out


def kernel(spec: PdqMatmulSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def bundle_specs(target: str = "sm_90a") -> list[Any]:
    """NVFP4 / MXFP4 x bf16 / f32 out x A from the workspace / packed, 4 stages, with and
    without the prefetch, direct stores; the staged store with the prefetch; two producer
    warpgroups at 128 x 192 (5 stages, prefetch, both stores); one at 128 x 192 (staged,
    bf16); prefetch distance 2 (staged, bf16, both CTA shapes) (phase 1 of A: matmul_twophase's DequantSpec, tile 128, bundled by that module);
    none off sm_90a."""
    if target not in TARGETS:
        return []
    specs = [PdqMatmulSpec(f, o, None, target, None, pf, "split", src) for f in FORMATS
             for o in _matmul.OUT_DTYPES for pf in (True, False) for src in A_SOURCES]
    specs += [PdqMatmulSpec(f, o, None, target, None, True, "split", src, "staged")
              for f in FORMATS for o in _matmul.OUT_DTYPES for src in A_SOURCES]
    # two producer warpgroups (128 x 192), both stores; one producer at 128 x 192 (staged,
    # bf16) for the A/B of the tile width alone
    specs += [PdqMatmulSpec(f, o, None, target, None, True, "split", src, st, 2, 192)
              for f in FORMATS for o in _matmul.OUT_DTYPES for src in A_SOURCES
              for st in STORES]
    specs += [PdqMatmulSpec(f, "bfloat16", None, target, None, True, "split", src, "staged",
                            1, 192) for f in FORMATS for src in A_SOURCES]
    # prefetch distance 2 (loads after the proxy fence), staged, bf16: both CTA shapes
    specs += [PdqMatmulSpec(f, "bfloat16", None, target, None, True, "split", src, "staged",
                            pr, bn, 2) for f in FORMATS for src in A_SOURCES
              for pr, bn in ((1, 256), (2, 192))]
    return sorted(specs, key=lambda s: s.kernel_name)


_core.attach_kernel_api((block_scaled_matmul_pdq,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "PdqMatmulSpec",
    "block_scaled_matmul_pdq",
    "build",
    "bundle_specs",
    "grid",
    "kernel",
]
