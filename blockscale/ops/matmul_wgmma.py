"""sm_90a (Hopper) block-scaled matmul on warpgroup MMAs (``wgmma``): NVFP4, MXFP4, MXFP8.

Same contract as :func:`blockscale.ops.matmul.block_scaled_matmul` (SEMANTICS §4.1): 5-D
scales, fp32 accumulation, ``alpha`` on the fp32 accumulator, bf16 (RNE) or f32 output, an
optional fused :class:`~blockscale.ops.matmul_epilogue.Epilogue`.

Kernel (see :mod:`blockscale.ops._wgmma_ir`): a CTA of ``bm / 64`` warpgroups computes a
``bm x bn`` tile of C (128 x 128, 256 threads; 64 x 64 when there are few tiles); per K-step
every thread dequantizes one row of A or B to bf16 (FP4) or f16 (E4M3) into shared memory in
the wgmma K-major layout, then each warpgroup runs ``wgmma.mma_async.m64n{bn}k16`` from
shared-memory descriptors into fp32 accumulators (3 shared stages, one barrier per step).
Variants (:data:`VARIANTS`, spec fields ``dequant``, ``scaling``, ``kstep``):

* ``scaling="fold"``: the block scales are folded into the operands, exactly (NVFP4:
  E2M1 x E4M3 has <= 6 significant bits; MX: E2M1 x 2^(e - 127 - 2), see
  ``_wgmma_ir.MX_FOLD_EXP``), and the wgmmas accumulate in place. NVFP4: one k16 per block,
  one rounding per block (the portable kernel's roundings in the interpreter's model); MX:
  a 32-block is two k16s, so up to two roundings per block.
* ``scaling="promote"`` (MX): plain operands; each block's two k16 wgmmas start from zero
  into a second fragment, added as ``acc = fma(blk, sA * sB, acc)`` one step later (the
  mma.sync kernel's scheme; MXFP4 equals the portable kernel bit for bit).
* ``dequant``: "lut" (``prmt`` tables), "shift" (NVFP4 bit placement), "cvt" (MXFP8:
  ``cvt.rn.f16x2.e4m3x2``); ``kstep`` 32 or 64 K elements per step.
* The FP8 path (MX, "promote"): ``dequant="fp8"`` (MXFP4: E2M1 bits placed into E4M3, times
  2^-6, exact) or ``"copy"`` (MXFP8 bytes as they are) into E4M3 shared operands, one
  ``wgmma ... m64nNk32.f32.e4m3.e4m3`` (QGMMA) per 32-block from zero, then promoted as above.
  Exact for MXFP4 if the tensor core sums 32 multiples of 2^-14 below 2^-1 exactly (13
  bits); MXFP8 block sums are rounded by the tensor core's fp8 accumulation (narrower than
  fp32 on Hopper: measure before trusting the bound).

Dispatch: the :data:`blockscale.ops.matmul.FAST_PATHS` entry (placed before the mma.sync
kernel's) runs by default on sm_90a for M > 16 and K % 32 == 0, with the format's
:data:`DEFAULTS` variant (NVFP4 shift/fold/k64, MX promote/k32); ``BLOCKSCALE_SM90_WGMMA=0`` turns it off (the mma.sync
kernel, which also takes what this one does not, runs instead). On the H200 the f32 results
are within the stated fp32 bound but not bit-identical to the portable kernel (HGMMA's fp32
accumulation rounds differently from the interpreter's model). Importing this module does
not import MLIR.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
import blockscale.ops._wgmma_ws as _ws
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import matmul as _matmul
from blockscale.ops import matmul_sm90 as _sm90
from blockscale.ops.matmul_epilogue import Epilogue

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._wgmma_ir", "blockscale.ops._wgmma_ws_ir",
                  "blockscale.ops._wgmma_ws", "blockscale.ops._mma_ir",
                  "blockscale.ops.matmul_epilogue", "blockscale.ops._matmul_ir",
                  "blockscale.ops.matmul_sm90")
TARGETS = ("sm_90a",)
FORMATS = ("nvfp4", "mxfp4", "mxfp8")
#: CTA tiles (= blockscale.ops._wgmma_ir.TILES); 128 x 256 only with scaling="fold"
TILE_CHOICES = ((128, 128), (64, 64), (128, 256))
#: NVFP4's dequantization variants (= blockscale.ops._wgmma_ir.DEQUANT; this module does not
#: import MLIR)
DEQUANT = ("lut", "shift")
KSTEPS = (32, 64)  # = blockscale.ops._wgmma_ir.KSTEPS
#: fmt -> {(dequant, scaling): K-steps built} (= blockscale.ops._wgmma_ir.VARIANTS)
VARIANTS = {
    "nvfp4": {("lut", "fold"): (32, 64), ("shift", "fold"): (32, 64)},
    "mxfp4": {("lut", "fold"): (32, 64), ("lut", "promote"): (32,), ("fp8", "promote"): (32,)},
    # ("copy", "promote"), MXFP8 bytes straight into QGMMA, was removed: on the H200 (run D,
    # 2026-11-30) ~8100 of 8192 sampled bf16 outputs fell outside the fp32 bound (QGMMA's
    # accumulation of E4M3 products is narrower than fp32)
    "mxfp8": {("cvt", "promote"): (32,)},
}
#: where a step issues the next step's global loads (= _wgmma_ir.PIPELINES)
PIPELINES = ("early", "late")
#: the tiles of the bundled TMA-fed kernels per pipeline ("ws" 128 x 256 is built but not
#: bundled: at 384 threads ptxas caps it at 168 registers and it spills)
WS_BUNDLE_TILES = {"ws": ((128, 128),), "tma": ((128, 128), (128, 256))}


def ws_variants(fmt: str) -> list[tuple[str, str]]:
    """(dequant, scaling) of the pipeline="ws" kernels of ``fmt`` (none: not built)."""
    if fmt not in _ws.FORMATS:
        return []
    return [v for v, ks in VARIANTS[fmt].items() if v[1] == _ws.SCALING and _ws.KSTEP in ks]
#: dequantizations to E4M3 shared operands and k32 e4m3 wgmmas (= _wgmma_ir.FP8_DEQUANT)
FP8_DEQUANT = ("fp8", "copy")
#: the default variants: the fastest on the H200 (run D, 2026-11-30, 8192 x 5760 x 2944, GPU
#: time): NVFP4 shift/fold/k64 0.946 ms (128x128) / 0.914 ms (128x256) vs lut/k32 1.29 ms;
#: MXFP4 lut/fold/k64 1.107 / 1.069 ms vs lut/promote/k32 1.79 ms and fp8/promote 1.51 ms
#: ("fold" rounds twice per 32-block, within the stated bound; see _wgmma_ir)
DEFAULT_DEQUANT = {"nvfp4": "shift", "mxfp4": "lut", "mxfp8": "cvt"}
DEFAULT_KSTEP = 64
#: fmt -> (dequant, scaling, kstep) of a spec that names no variant
DEFAULTS = {"nvfp4": ("shift", "fold", DEFAULT_KSTEP), "mxfp4": ("lut", "fold", 64),
            "mxfp8": ("cvt", "promote", 32)}
#: formats the dispatch sends to this kernel. MXFP8 stays on the mma.sync kernel, which was
#: faster on the H200 (run D: 1.63 ms vs 2.41 ms at 8192 x 5760 x 2944)
DISPATCH_FORMATS = ("nvfp4", "mxfp4")
#: the dispatch uses 128 x 256 tiles from this M on (run D: 0.914 vs 0.946 ms at M=8192;
#: at M=1024 128 x 128 was faster, 0.141 vs 0.156 ms)
WIDE_TILE_MIN_M = 4096
#: the pipeline of the dispatch's 128 x 256 kernels: the TMA-fed loop (run I, 2026-11-30, H200,
#: 8192 x 5760 x 2944: NVFP4 shift 0.808 vs 0.911 ms register-fed; MXFP4 lut 0.931 vs 1.071).
#: (Its tensor maps need 16-byte aligned a / b / sfa / sfb, as the register-fed kernels' loads
#: do: the dispatch runs the portable kernel for other addresses, H.vector_aligned.)
WIDE_PIPELINE = "tma"
#: the dispatch takes M > MIN_M (smaller M: the decode / mma.sync kernels)
MIN_M = 16
#: BLOCKSCALE_SM90_WGMMA=0 turns the fast path off (on by default)
ENV_SWITCH = "BLOCKSCALE_SM90_WGMMA"


@dataclasses.dataclass(frozen=True)
class WgmmaMatmulSpec(FormatSpec):
    """What one sm_90a wgmma dense matmul kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8".
        out_dtype: "bfloat16" | "float32".
        epilogue: an optional fused :class:`Epilogue`.
        bm, bn: the CTA tile (one of :data:`TILE_CHOICES`).
        target: "sm_90a".
        dequant: "lut" | "shift" (FP4), "cvt" (MXFP8); None: the format's default.
        kstep: K elements per step, 32 or 64 (:data:`blockscale.ops._wgmma_ir.KSTEPS`; 64
            with 128 x 128 tiles takes 96 KiB of dynamic shared memory); None: default.
        scaling: "fold" | "promote" (:data:`VARIANTS`); None: the format's default.
        pipeline: "early" | "late" (:data:`blockscale.ops._wgmma_ir.PIPELINES`: the next
            step's global loads before the dequantization, or after the wgmma issue), or
            "ws" (NVFP4 / MXFP4 fold k64, bm = 128: a TMA producer feeds an mbarrier ring,
            :mod:`blockscale.ops._wgmma_ws_ir`).
    """

    fmt: str
    out_dtype: str = "bfloat16"
    epilogue: Epilogue | None = None
    bm: int = 128
    bn: int = 128
    target: str = "sm_90a"
    dequant: str | None = None
    kstep: int | None = None
    scaling: str | None = None
    pipeline: str = "early"

    op: ClassVar[str] = "block_scaled_matmul_wgmma"

    def __post_init__(self) -> None:
        _matmul.check_spec_fields(self)  # (every Format is in FORMATS)
        if (self.bm, self.bn) not in TILE_CHOICES:
            raise ValueError(f"(bm, bn) must be one of {list(TILE_CHOICES)}, got "
                             f"{(self.bm, self.bn)}")
        H.check_choice(self.pipeline, (*PIPELINES, *_ws.PIPELINES), "pipeline")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")
        dq, sc, ks = DEFAULTS[self.fmt]
        variants = VARIANTS[self.fmt]
        if self.dequant is None:
            object.__setattr__(self, "dequant", dq)
        if self.scaling is None:  # the default's, else the first built with this dequant
            sc = "fold" if self.bn > 128 and (self.dequant, "fold") in variants else sc
            object.__setattr__(self, "scaling", sc if self.dequant == dq else next(
                (s for d, s in variants if d == self.dequant), "fold"))
        if self.kstep is None:  # the default's, else the variant's largest
            object.__setattr__(self, "kstep", ks if (self.dequant, self.scaling) == (dq, sc)
                               else max(variants.get((self.dequant, self.scaling), KSTEPS)))
        if (self.dequant, self.scaling) not in variants:
            raise ValueError(f"(dequant, scaling) must be one of {list(variants)} for "
                             f"{self.fmt}, got {(self.dequant, self.scaling)}")
        if self.bn > 128 and self.scaling == "promote":
            raise ValueError(f"scaling='promote' takes bn <= 128, got (bm, bn) = "
                             f"{(self.bm, self.bn)}")
        ksteps = variants[(self.dequant, self.scaling)]
        if self.kstep not in ksteps:
            raise ValueError(f"kstep must be one of {ksteps} for {self.fmt} "
                             f"{self.dequant}/{self.scaling}, got {self.kstep}")
        if self.ws and (
                self.fmt not in _ws.FORMATS or (self.scaling, self.kstep) != (_ws.SCALING,
                                                                              _ws.KSTEP)
                or (self.bm, self.bn) not in _ws.TILES):
            raise ValueError(f"pipeline={self.pipeline!r} takes fmt in {_ws.FORMATS}, scaling={_ws.SCALING!r}, "
                             f"kstep={_ws.KSTEP}, (bm, bn) in {list(_ws.TILES)}; got "
                             f"{(self.fmt, self.scaling, self.kstep, (self.bm, self.bn))}")

    @property
    def shared_bytes(self) -> int:
        """Shared memory of the 3 stages (= _wgmma_ir.Tiles.shared_bytes): bf16 / f16 / E4M3
        operands, plus the f32 scales of "promote" or the scale table of "fold"."""
        elem = 1 if self.dequant in FP8_DEQUANT else 2
        per_row = elem * self.kstep + (4 if self.scaling == "promote" else 0)
        table = 0 if self.scaling == "promote" else 512  # the bf16 scale table of "fold"
        return 3 * (self.bm + self.bn) * per_row + table

    @property
    def dynamic_shared_bytes(self) -> int:
        """Dynamic shared memory per CTA (the stages when over the 48 KiB static limit)."""
        return self.shared_bytes if self.shared_bytes > 48 * 1024 or self.ws else 0

    @property
    def ws(self) -> bool:
        """Whether the TMA-fed producer / consumer loop is used (``pipeline`` "ws" or
        "tma")."""
        return self.pipeline in _ws.PIPELINES

    @property
    def block(self) -> tuple[int, int, int]:  # type: ignore[override]
        """The ``bm / 64`` warpgroups (= _wgmma_ir.Tiles.threads)."""
        return (2 * self.bm + (_ws.PRODUCER_THREADS[self.pipeline] if self.ws else 0), 1, 1)

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        dq = f"_{self.dequant}_{self.scaling}_k{self.kstep}" + \
            ("" if self.pipeline == "early" else f"_{self.pipeline}")
        return (f"bs_matmul_wgmma_{self.fmt}_{self.bm}x{self.bn}{dq}_{H.out_tag(self.out_dtype)}"
                f"{ep}")

    def args(self) -> tuple[KernelArg, ...]:
        """The portable kernel's parameters: a, b, sfa, sfb, c, epilogue inputs, m, n, k,
        alpha."""
        base = _matmul.MatmulSpec(self.fmt, self.out_dtype, "tcgen5d", self.epilogue,
                                  self.target).args()
        return (*base, *_ws.tensormap_args(self.bm, self.bn, self.fmt)) if self.ws else base


def grid(spec: WgmmaMatmulSpec, m: int, n: int) -> tuple[int, int, int]:
    """Launch grid: one CTA per ``bm x bn`` tile of C."""
    return (max(1, -(-n // spec.bn)), max(1, -(-m // spec.bm)), 1)


def build(spec: WgmmaMatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of the kernel for ``spec`` (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._wgmma_ir as X
    from blockscale.compiler import ir as bir

    tiles = X.Tiles(spec.bm, spec.bn, spec.kstep, spec.fmt, spec.scaling,
                    spec.dequant in FP8_DEQUANT)
    if (X.VARIANTS, X.PIPELINES, X.FP8_DEQUANT) != (VARIANTS, PIPELINES, FP8_DEQUANT):
        raise AssertionError("matmul_wgmma's variant tables disagree with _wgmma_ir's")
    if tiles.shared_bytes != spec.shared_bytes:
        raise AssertionError("WgmmaMatmulSpec.shared_bytes disagrees with _wgmma_ir.Tiles")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        m_count, n_count, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
        m0 = bir.mul(bir.block_idx("y"), spec.bm)
        n0 = bir.mul(bir.block_idx("x"), spec.bn)
        d1 = bir.ceil_div(bir.ceil_div(k, tiles.block), 4)
        # scale rows m0 + r < ceil(M/128)*128 for every local r (bm divides 128): in bounds
        a = _sm90.tile_operand(kb.arg("a"), kb.arg("sfa"), m0, m0, m_count, m0, d1)
        b = _sm90.tile_operand(kb.arg("b"), kb.arg("sfb"), n0, n0, n_count, n0, d1)
        if spec.ws:
            from blockscale.ops import _wgmma_ws_ir

            acc, wg, live = _wgmma_ws_ir.emit_mainloop(kb, tiles, a, b, k, spec.dequant, m0,
                                                       n0, spec.pipeline)
        else:
            acc, wg = X.emit_mainloop(kb, tiles, a, b, k, spec.dequant, spec.pipeline)
            live = None
        fix = X.accumulator_scale(spec.dequant, spec.fmt, spec.scaling)

        def scale(v: Any, m: Any, n: Any) -> Any:
            if fix != 1.0:  # exact power of two first, then alpha (as the portable kernel)
                v = arith.mulf(v, bir.const(fix, bir.f32()))
            return _sm90._alpha(v, kb.arg("alpha"))

        def store() -> None:
            _sm90.store_tile(spec, kb, X.accumulator_tiles(acc, spec.bn), X.warp_coords(wg),
                             m0, n0, m_count, n_count, scale)
        if live is None:
            store()
        else:
            with bir.when(live):  # not the producer warp
                store()
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def enabled() -> bool:
    """False when BLOCKSCALE_SM90_WGMMA=0 (the mma.sync kernel then takes sm_90a)."""
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off")


def supported(fmt: Format, k: int) -> bool:
    """NVFP4 / MXFP4 / MXFP8 with K % 32 == 0 (rows of whole 16-byte pieces, whole MX
    blocks)."""
    return fmt.name in FORMATS and k % 32 == 0


def choose_tiles(m: int, n: int) -> tuple[int, int]:
    """128 x 128, or 64 x 64 when 128 x 128 tiles would leave the 132 SMs idle."""
    return (128, 128) if -(-m // 128) * -(-n // 128) >= 132 else (64, 64)


def spec_for(fmt: Format, m: int, n: int, out_dtype: str = "bfloat16",
             epilogue: Epilogue | None = None, target: str = "sm_90a") -> WgmmaMatmulSpec:
    """The spec the fast path uses for a problem shape (the format's :data:`DEFAULTS`)."""
    bm, bn = choose_tiles(m, n)
    if m >= WIDE_TILE_MIN_M and n >= 256 and DEFAULTS[fmt.name][1] == "fold":
        pipeline = WIDE_PIPELINE if fmt.name in _ws.FORMATS else "early"
        return WgmmaMatmulSpec(fmt.name, out_dtype, epilogue, 128, 256, target,
                               pipeline=pipeline)
    return WgmmaMatmulSpec(fmt.name, out_dtype, epilogue, bm, bn, target)


def _run_ws(spec: WgmmaMatmulSpec, d: Any, a: Any, b: Any, sfa: Any, sfb: Any, alpha: float,
            extra: dict[str, Any], device: Any) -> Any:
    """Launch a TMA-fed (``spec.ws``) kernel: the portable arguments plus the tensor maps'
    dims (launch values); M and N are > 0."""
    H.check_epilogue_inputs(spec.epilogue.inputs if spec.epilogue else (), extra, d.m, d.n)
    return H.launch(spec, grid(spec, d.m, d.n), (d.m, d.n), spec.out_dtype,
                    {"a": a, "b": b, "sfa": sfa, "sfb": sfb, **extra},
                    {"m": d.m, "n": d.n, "k": d.k, "alpha": H.finite_f32(alpha, "alpha"),
                     **_ws.tensormap_values(d.m, d.n, d.k, d.fmt.block_size)}, device)


def fast_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
              epilogue: Epilogue | None) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul.FAST_PATHS` hook: a runner (the default variant) for
    sm_90a, a supported format / K and M > :data:`MIN_M` unless BLOCKSCALE_SM90_WGMMA=0, else
    None (the mma.sync kernel's hook is next)."""
    if (target not in TARGETS or not enabled() or fmt.name not in DISPATCH_FORMATS
            or not supported(fmt, k) or m <= MIN_M or n == 0):
        return None
    spec = spec_for(fmt, m, n, out_dtype, epilogue, target)
    if not spec.ws:
        return _matmul.dense_runner(spec, fmt, m, n, k, grid(spec, m, n))
    dims = _matmul._Dense(fmt, m, n, k)

    def run(a: Any, b: Any, sfa: Any, sfb: Any, alpha: float, extra: dict[str, Any],
            device: Any) -> Any:
        return _run_ws(spec, dims, a, b, sfa, sfb, alpha, extra, device)
    return run


def block_scaled_matmul_wgmma(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                              k: int | None = None, alpha: float = 1.0,
                              out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                              epilogue_inputs: dict[str, Any] | None = None,
                              tiles: tuple[int, int] | None = None, dequant: str | None = None,
                              kstep: int | None = None, scaling: str | None = None,
                              pipeline: str = "early", device: Any = None) -> Any:
    """The wgmma kernel called directly (no dispatch, no env switch), e.g. by tests and
    benchmarks. Same arguments as :func:`blockscale.ops.matmul_sm90.block_scaled_matmul_sm90`,
    plus the variant: ``dequant``, ``kstep``, ``scaling``, ``pipeline``
    (:class:`WgmmaMatmulSpec`; None: the format's default). Raises ValueError when K % 32 != 0,
    the variant is not built, or an operand in device memory is not 16-byte aligned
    (:func:`~blockscale.ops._matmul_host.require_aligned`)."""
    fmt = Format.from_name(fmt)
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    H.require_aligned(a=a, b=b, sfa=sfa, sfb=sfb)  # no portable fallback here
    if not supported(fmt, d.k):
        raise ValueError(f"the sm_90a wgmma kernel takes k % 32 == 0, got "
                         f"{fmt.name}, k={d.k}")
    dev, tgt = H.device_and_target(device, "sm_90a")
    bm, bn = tiles if tiles is not None else choose_tiles(d.m, d.n)
    spec = WgmmaMatmulSpec(fmt.name, out_dtype, epilogue, bm, bn, tgt, dequant, kstep, scaling,
                           pipeline)
    if spec.ws and d.m and d.n:  # the TMA maps' dims travel as launch values
        return _run_ws(spec, d, a, b, sfa, sfb, alpha, dict(epilogue_inputs or {}), dev)
    return _matmul._run_dense(spec, d, a, b, sfa, sfb, alpha, dict(epilogue_inputs or {}),
                              dev, grid(spec, d.m, d.n))


def kernel(spec: WgmmaMatmulSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


#: (M, N, K) of the GPU tests and the benchmark shapes the next session measures
GPU_SHAPES = ((777, 2560, 8192), (8192, 5760, 2944), (1000, 1024, 1056),
              *((m, 5760, 2944) for m in (1, 128, 1024)))


def bundle_specs(target: str = "sm_90a") -> list[WgmmaMatmulSpec]:
    """Every spec the GPU tests and the benchmark use on ``target`` (none off sm_90a)."""
    if target not in TARGETS:
        return []
    specs = {WgmmaMatmulSpec(f, o, None, *choose_tiles(m, n), target, dq, ks, sc)
             for f, variants in VARIANTS.items() for (dq, sc), ksteps in variants.items()
             for ks in ksteps for o in _matmul.OUT_DTYPES for m, n, _ in GPU_SHAPES}
    specs |= {spec_for(Format.from_name(f), m, n, o, None, target)  # the dispatch's choice
              for f in FORMATS for o in _matmul.OUT_DTYPES for m, n, _ in GPU_SHAPES}
    specs |= {WgmmaMatmulSpec(f, o, None, 128, 256, target, dq, ks, sc)  # tiles=(128, 256)
              for f, variants in VARIANTS.items() for (dq, sc), ksteps in variants.items()
              if sc == "fold" for ks in ksteps for o in _matmul.OUT_DTYPES}
    specs |= {dataclasses.replace(s, pipeline=p) for s in specs for p in PIPELINES}
    specs |= {WgmmaMatmulSpec(f, o, None, *t, target, dq, _ws.KSTEP, sc, p)
              for f in _ws.FORMATS for (dq, sc) in ws_variants(f)  # the TMA-fed loop
              for o in _matmul.OUT_DTYPES for p, tiles in WS_BUNDLE_TILES.items()
              for t in tiles}
    return sorted(specs, key=lambda s: s.kernel_name)


def _register() -> None:
    """Put :func:`fast_path` just before the mma.sync kernel's entry (after the decode
    kernel's), so that it wins when switched on."""
    H.register_before(_matmul.FAST_PATHS, fast_path, _sm90.__name__)


_register()
_core.attach_kernel_api((block_scaled_matmul_wgmma,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "WgmmaMatmulSpec",
    "block_scaled_matmul_wgmma",
    "build",
    "bundle_specs",
    "fast_path",
    "grid",
    "kernel",
]
