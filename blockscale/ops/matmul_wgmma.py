"""sm_90a (Hopper) block-scaled matmul on warpgroup MMAs (``wgmma``).

Same contract as :func:`blockscale.ops.matmul.block_scaled_matmul` (SEMANTICS §4.1): 5-D
scales, fp32 accumulation, ``alpha`` on the fp32 accumulator, bf16 (RNE) or f32 output, an
optional fused :class:`~blockscale.ops.matmul_epilogue.Epilogue`.

Kernel (see :mod:`blockscale.ops._wgmma_ir`): a CTA of ``bm / 64`` warpgroups computes a
``bm x bn`` tile of C (default 128 x 128, 256 threads); per K-step of 32 elements every
thread dequantizes one row of A or B to bf16 with its E4M3 block scale folded in (exact)
into shared memory in the wgmma K-major layout, then each warpgroup runs
``wgmma.mma_async.m64n{bn}k16.f32.bf16.bf16`` per NVFP4 block from shared-memory descriptors
into fp32 accumulators (3 shared stages, one barrier per step); the epilogue multiplies by
alpha and stores with bounds masks. FP4 results equal the portable kernel's bit for bit in the
interpreter (one fp32 rounding per block, in the same order).

Dispatch: the :data:`blockscale.ops.matmul.FAST_PATHS` entry (placed before the mma.sync
kernel's) runs by default on sm_90a for M > 16 and K % 32 == 0, with the default variant
(``dequant="shift"``, ``kstep=64``); ``BLOCKSCALE_SM90_WGMMA=0`` turns it off (the mma.sync
kernel, which also takes what this one does not, runs instead). On the H200 the f32 results
are within the stated fp32 bound but not bit-identical to the portable kernel (HGMMA's fp32
accumulation rounds differently from the interpreter's model). Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import matmul as _matmul
from blockscale.ops import matmul_sm90 as _sm90
from blockscale.ops.matmul_epilogue import Epilogue

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._wgmma_ir", "blockscale.ops._mma_ir",
                  "blockscale.ops.matmul_epilogue", "blockscale.ops._matmul_ir",
                  "blockscale.ops.matmul_sm90")
TARGETS = ("sm_90a",)
FORMATS = ("nvfp4",)
TILE_CHOICES = ((128, 128), (64, 64))
#: = blockscale.ops._wgmma_ir.DEQUANT (repeated: this module does not import MLIR)
DEQUANT = ("lut", "shift")
KSTEPS = (32, 64)  # = blockscale.ops._wgmma_ir.KSTEPS
#: the default variant (the fastest of the first H200 run: shift-k64 1.45 ms vs lut-k32 2.02
#: ms at 8192 x 5760 x 2944, host overhead included)
DEFAULT_DEQUANT = {"nvfp4": "shift"}
DEFAULT_KSTEP = 64
#: the dispatch takes M > MIN_M (smaller M: the decode / mma.sync kernels)
MIN_M = 16
#: BLOCKSCALE_SM90_WGMMA=0 turns the fast path off (on by default)
ENV_SWITCH = "BLOCKSCALE_SM90_WGMMA"


@dataclasses.dataclass(frozen=True)
class WgmmaMatmulSpec(FormatSpec):
    """What one sm_90a wgmma dense matmul kernel is specialised on.

    Attributes:
        fmt: "nvfp4".
        out_dtype: "bfloat16" | "float32".
        epilogue: an optional fused :class:`Epilogue`.
        bm, bn: the CTA tile (one of :data:`TILE_CHOICES`).
        target: "sm_90a".
        dequant: "lut" | "shift" (:data:`blockscale.ops._wgmma_ir.DEQUANT`).
        kstep: K elements per step, 32 or 64 (:data:`blockscale.ops._wgmma_ir.KSTEPS`; 64
            with 128 x 128 tiles takes 96 KiB of dynamic shared memory).
    """

    fmt: str
    out_dtype: str = "bfloat16"
    epilogue: Epilogue | None = None
    bm: int = 128
    bn: int = 128
    target: str = "sm_90a"
    dequant: str = "shift"
    kstep: int = DEFAULT_KSTEP

    op: ClassVar[str] = "block_scaled_matmul_wgmma"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.fmt, FORMATS, "fmt")
        H.check_choice(self.out_dtype, _matmul.OUT_DTYPES, "out_dtype")
        if self.epilogue is not None and not isinstance(self.epilogue, Epilogue):
            raise TypeError(f"epilogue must be an Epilogue or None, got "
                            f"{type(self.epilogue).__name__}")
        if (self.bm, self.bn) not in TILE_CHOICES:
            raise ValueError(f"(bm, bn) must be one of {list(TILE_CHOICES)}, got "
                             f"{(self.bm, self.bn)}")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")
        H.check_choice(self.dequant, DEQUANT, "dequant")
        if self.kstep not in KSTEPS:
            raise ValueError(f"kstep must be one of {KSTEPS}, got {self.kstep}")

    @property
    def shared_bytes(self) -> int:
        """Shared memory of the 3 stages (= _wgmma_ir.Tiles.shared_bytes)."""
        return 3 * (self.bm + self.bn) * 2 * self.kstep

    @property
    def dynamic_shared_bytes(self) -> int:
        """Dynamic shared memory per CTA (the stages when over the 48 KiB static limit)."""
        return self.shared_bytes if self.shared_bytes > 48 * 1024 else 0

    @property
    def block(self) -> tuple[int, int, int]:  # type: ignore[override]
        return (self.bm + self.bn, 1, 1)

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        dq = ("" if self.dequant == "lut" else f"_{self.dequant}") + \
            ("" if self.kstep == 32 else f"_k{self.kstep}")
        return (f"bs_matmul_wgmma_{self.fmt}_{self.bm}x{self.bn}{dq}_{H.out_tag(self.out_dtype)}"
                f"{ep}")

    def args(self) -> tuple[KernelArg, ...]:
        """The portable kernel's parameters: a, b, sfa, sfb, c, epilogue inputs, m, n, k,
        alpha."""
        return _matmul.MatmulSpec(self.fmt, self.out_dtype, "tcgen5d", self.epilogue,
                                  self.target).args()


def grid(spec: WgmmaMatmulSpec, m: int, n: int) -> tuple[int, int, int]:
    """Launch grid: one CTA per ``bm x bn`` tile of C."""
    return (max(1, -(-n // spec.bn)), max(1, -(-m // spec.bm)), 1)


def build(spec: WgmmaMatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of the kernel for ``spec`` (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._wgmma_ir as X
    from blockscale.compiler import ir as bir

    tiles = X.Tiles(spec.bm, spec.bn, spec.kstep)
    if tiles.shared_bytes != spec.shared_bytes:
        raise AssertionError("WgmmaMatmulSpec.shared_bytes disagrees with _wgmma_ir.Tiles")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        m_count, n_count, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
        m0 = bir.mul(bir.block_idx("y"), spec.bm)
        n0 = bir.mul(bir.block_idx("x"), spec.bn)
        d1 = bir.ceil_div(bir.ceil_div(k, 16), 4)
        # scale rows m0 + r < ceil(M/128)*128 for every local r (bm divides 128): in bounds
        a = _sm90.tile_operand(kb.arg("a"), kb.arg("sfa"), m0, m0, m_count, m0, d1)
        b = _sm90.tile_operand(kb.arg("b"), kb.arg("sfb"), n0, n0, n_count, n0, d1)
        acc, wg = X.emit_mainloop(kb, tiles, a, b, k, spec.dequant)
        fix = X.accumulator_scale(spec.dequant)

        def scale(v: Any, m: Any, n: Any) -> Any:
            if fix != 1.0:  # exact power of two first, then alpha (as the portable kernel)
                v = arith.mulf(v, bir.const(fix, bir.f32()))
            return _sm90._alpha(v, kb.arg("alpha"))

        _sm90.store_tile(spec, kb, X.accumulator_tiles(acc, spec.bn), X.warp_coords(wg),
                         m0, n0, m_count, n_count, scale)
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def enabled() -> bool:
    """False when BLOCKSCALE_SM90_WGMMA=0 (the mma.sync kernel then takes sm_90a)."""
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off")


def supported(fmt: Format, k: int) -> bool:
    """NVFP4 rows of whole 16-byte pieces (K % 32 == 0)."""
    return fmt.name in FORMATS and k % 32 == 0


def choose_tiles(m: int, n: int) -> tuple[int, int]:
    """128 x 128, or 64 x 64 when 128 x 128 tiles would leave the 132 SMs idle."""
    return (128, 128) if -(-m // 128) * -(-n // 128) >= 132 else (64, 64)


def spec_for(fmt: Format, m: int, n: int, out_dtype: str = "bfloat16",
             epilogue: Epilogue | None = None, target: str = "sm_90a") -> WgmmaMatmulSpec:
    """The spec the fast path uses for a problem shape."""
    bm, bn = choose_tiles(m, n)
    return WgmmaMatmulSpec(fmt.name, out_dtype, epilogue, bm, bn, target)


def fast_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
              epilogue: Epilogue | None) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul.FAST_PATHS` hook: a runner (the default variant) for
    sm_90a, a supported format / K and M > :data:`MIN_M` unless BLOCKSCALE_SM90_WGMMA=0, else
    None (the mma.sync kernel's hook is next)."""
    if target not in TARGETS or not enabled() or not supported(fmt, k) or m <= MIN_M or n == 0:
        return None
    spec = spec_for(fmt, m, n, out_dtype, epilogue, target)
    return _matmul.dense_runner(spec, fmt, m, n, k, grid(spec, m, n))


def block_scaled_matmul_wgmma(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *,
                              k: int | None = None, alpha: float = 1.0,
                              out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                              epilogue_inputs: dict[str, Any] | None = None,
                              tiles: tuple[int, int] | None = None, dequant: str = "shift",
                              kstep: int = DEFAULT_KSTEP, device: Any = None) -> Any:
    """The wgmma kernel called directly (no dispatch, no env switch), e.g. by tests and
    benchmarks. Same arguments as
    :func:`blockscale.ops.matmul_sm90.block_scaled_matmul_sm90`, plus ``dequant`` and ``kstep``. Raises ValueError for formats
    other than NVFP4 or K % 32 != 0."""
    fmt = Format.from_name(fmt)
    d = _matmul._validate(a, b, sfa, sfb, fmt, k, "tcgen5d")
    if not supported(fmt, d.k):
        raise ValueError(f"the sm_90a wgmma kernel takes NVFP4 with k % 32 == 0, got "
                         f"{fmt.name}, k={d.k}")
    dev, tgt = H.device_and_target(device, "sm_90a")
    bm, bn = tiles if tiles is not None else choose_tiles(d.m, d.n)
    spec = WgmmaMatmulSpec(fmt.name, out_dtype, epilogue, bm, bn, tgt, dequant, kstep)
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
    specs = {dataclasses.replace(spec_for(Format.from_name("nvfp4"), m, n, o, None, target),
                                 dequant=dq, kstep=ks)
             for o in _matmul.OUT_DTYPES for m, n, _ in GPU_SHAPES for dq in DEQUANT
             for ks in KSTEPS}
    return sorted(specs, key=lambda s: s.kernel_name)


def _register() -> None:
    """Put :func:`fast_path` just before the mma.sync kernel's entry (after the decode
    kernel's), so that it wins when switched on."""
    paths = _matmul.FAST_PATHS
    if fast_path in paths:
        return
    # by module name: matmul_sm90 may be partially imported here (import cycle through
    # ops.matmul); when it registers later it appends, i.e. after this entry
    sm90 = [i for i, f in enumerate(paths) if f.__module__ == _sm90.__name__]
    paths.insert(sm90[0] if sm90 else len(paths), fast_path)


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
