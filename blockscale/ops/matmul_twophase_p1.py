"""The two-phase matmul's phase 1 for both operands in ONE launch (issue #9): packed FP4 A and
B + their 5-D scales -> the two bf16 workspaces of :mod:`blockscale.ops.matmul_twophase`,
byte-identical to :func:`~blockscale.ops.matmul_twophase.dequantize_operands` (layout
``swizzle="none"``), so phase 2 (:func:`~blockscale.ops.matmul_twophase.matmul_workspaces`,
or the pair's ``TwophaseMatmulSpec``) reads them unchanged.

Why (measured on the H200, run T, NVFP4 8192 x 5760 x 2944): the two launches of
``dequantize_operands`` (A, then B; one 64-element piece per thread) move ~104 MB in 0.038 ms
(~2.7 TB/s) where a device copy runs at ~4 TB/s; phase 1 at ~0.027 ms would bring the pair
within 85 % of cuBLAS bf16. This kernel (:mod:`blockscale.ops._twophase_p1_ir`): one grid
(A's blocks, then B's: one launch ramp and one tail instead of two), ``pieces`` (1, 2, 4)
64-element pieces of a row per thread with every load issued before the first conversion,
full-line warp stores, only the last block of each operand partly idle, and (``order``
"reversed") the tile-rows phase 2's first wave reads written last, so they are still in L2.
``pdl``: every thread triggers ``griddepcontrol.launch_dependents`` at its start, so a phase
2 launched with programmatic stream serialization overlaps this grid's tail.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import _staged_store_ir as S
from blockscale.ops import matmul_twophase as TP

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._twophase_p1_ir", "blockscale.ops._twophase_ir",
                  "blockscale.ops._wgmma_ir", "blockscale.ops._mma_ir",
                  "blockscale.ops._matmul_ir")
TARGETS = ("sm_90a",)
FORMATS = TP.FORMATS
#: threads per block (= _twophase_p1_ir.THREADS)
THREADS = 256
#: 64-element pieces per thread built (= _twophase_p1_ir.PIECES)
PIECES = (1, 2, 4)
#: tile-row orders (= _twophase_p1_ir.ORDERS): "rows" (first to last) or "reversed" (phase
#: 2's first tile-rows written last, so they are the ones left in L2)
ORDERS = ("rows", "reversed")
#: the default pieces per thread and order (dequantize_both)
DEFAULT_PIECES, DEFAULT_ORDER = 2, "reversed"


@dataclasses.dataclass(frozen=True)
class BothSpec(FormatSpec):
    """Phase 1 for A and B in one launch.

    Attributes:
        fmt: "nvfp4" | "mxfp4".
        bm: A's workspace tile height (``matmul_twophase.BMS``).
        bn: B's workspace tile height (``matmul_twophase.BNS``).
        pieces: 64-element pieces of a row per thread (:data:`PIECES`).
        order: :data:`ORDERS`.
        pdl: every thread first executes ``griddepcontrol.launch_dependents``.
        target: "sm_90a".
    """

    fmt: str
    bm: int = TP.BM
    bn: int = TP.BN
    pieces: int = DEFAULT_PIECES
    order: str = DEFAULT_ORDER
    pdl: bool = False
    target: str = "sm_90a"

    op: ClassVar[str] = "block_scaled_matmul_twophase_dequant_both"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.fmt, FORMATS, "fmt")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")
        H.check_choice(self.bm, TP.BMS, "bm")
        H.check_choice(self.bn, TP.BNS, "bn")
        H.check_choice(self.pieces, PIECES, "pieces")
        H.check_choice(self.order, ORDERS, "order")
        if type(self.pdl) is not bool:
            raise TypeError(f"pdl must be a bool, got {self.pdl!r}")

    @property
    def kernel_name(self) -> str:
        return (f"bs_twophase_p1_{self.fmt}_{self.bm}x{self.bn}_p{self.pieces}"
                f"{'_rows' if self.order == 'rows' else ''}{'_pdl' if self.pdl else ''}")

    def args(self) -> tuple[KernelArg, ...]:
        """a, sfa, b, sfb, wa, wb (the workspaces' bytes), m, m_pad, n, n_pad, k."""
        sd = Format.from_name(self.fmt).scale_dtype.name
        return (KernelArg("a", "buffer", "uint8"), KernelArg("sfa", "buffer", sd),
                KernelArg("b", "buffer", "uint8"), KernelArg("sfb", "buffer", sd),
                KernelArg("wa", "buffer", "uint8", "out"),
                KernelArg("wb", "buffer", "uint8", "out"),
                *(KernelArg(x, "scalar", "i32") for x in ("m", "m_pad", "n", "n_pad", "k")))


def operand_blocks(rows_pad: int, k: int, pieces: int) -> int:
    """Blocks of one operand: ``ceil(rows_pad * ceil(k_pad / 64 / pieces) / THREADS)``."""
    groups = -(-(TP.k_padded(k) // 64) // pieces)
    return -(-rows_pad * groups // THREADS)


def grid(m: int, n: int, k: int, bm: int = TP.BM, bn: int = TP.BN,
         pieces: int = DEFAULT_PIECES) -> tuple[int, int, int]:
    """A's blocks then B's (:func:`operand_blocks`)."""
    return (operand_blocks(TP.padded(m, bm), k, pieces)
            + operand_blocks(TP.padded(n, bn), k, pieces), 1, 1)


def build(spec: BothSpec) -> Any:
    """The ``mlir.ir.Module`` of the kernel (IR only)."""
    import blockscale.ops._twophase_p1_ir as P
    from blockscale.compiler import ir as bir

    if (P.THREADS, P.PIECES, P.ORDERS) != (THREADS, PIECES, ORDERS):
        raise AssertionError("matmul_twophase_p1's constants disagree with _twophase_p1_ir's")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        m, m_pad, n, n_pad, k = (bir.as_index(kb.arg(x))
                                 for x in ("m", "m_pad", "n", "n_pad", "k"))
        P.emit_both(kb.arg("a"), kb.arg("sfa"), kb.arg("b"), kb.arg("sfb"), kb.arg("wa"),
                    kb.arg("wb"), m, m_pad, n, n_pad, k, spec.fmt, spec.bm, spec.bn,
                    spec.pieces, spec.order, spec.pdl)
    return kb.module


def kernel(spec: BothSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def launch(spec: BothSpec, ops: dict[str, Any], m: int, n: int, k: int,
           dev: Any) -> tuple[Any, Any]:
    """Launch ``spec`` on validated operands ``ops`` (a, b, sfa, sfb: device or numpy
    arrays): the workspaces (device uint8 arrays; numpy when every input is numpy)."""
    m_pad, n_pad = TP.padded(m, spec.bm), TP.padded(n, spec.bn)
    kp = TP.k_padded(k)
    _, out = _core.launch_op(spec, grid(m, n, k, spec.bm, spec.bn, spec.pieces),
                             (("wa", (2 * m_pad * kp,), np.dtype(np.uint8)),
                              ("wb", (2 * n_pad * kp,), np.dtype(np.uint8))),
                             ops, {"m": m, "m_pad": m_pad, "n": n, "n_pad": n_pad, "k": k},
                             dev)
    return out["wa"], out["wb"]


def dequantize_both(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *, k: int,
                    bm: int = TP.BM, bn: int = TP.BN, swizzle: str = "none",
                    device: Any = None, pdl: bool = False, pieces: int = DEFAULT_PIECES,
                    order: str = DEFAULT_ORDER) -> tuple[Any, Any]:
    """Phase 1 for A and B in one launch: the workspaces ``(wa, wb)`` (flat uint8), the
    bytes of ``matmul_twophase.dequantize_operands(a, b, sfa, sfb, fmt, k=k, bm=bm, bn=bn)``.
    ``a`` / ``b`` packed FP4 ``[M, K/2]`` / ``[N, K/2]`` uint8, ``sfa`` / ``sfb`` 5-D scales;
    device arrays in give device arrays out (numpy when every input is numpy). ``swizzle``:
    "none" only (the 128B-swizzled workspaces: ``dequantize_operands``). ``pdl``: the grid
    triggers its dependents at its start (phase 2 with ``pdl=True`` next). ``pieces`` /
    ``order``: :class:`BothSpec`."""
    if swizzle != "none":
        raise ValueError(f"swizzle must be 'none' (the one-launch phase 1 writes the "
                         f"stage-ordered layout), got {swizzle!r}")
    fmt, d = TP.phase1_operands(a, b, sfa, sfb, fmt, k, "dequantize_both")
    dev, tgt = H.device_and_target(device, "sm_90a")
    spec = BothSpec(fmt.name, bm, bn, pieces, order, pdl, tgt)
    return launch(spec, {"a": a, "b": b, "sfa": sfa, "sfb": sfb}, d.m, d.n, d.k, dev)


def pair(a: Any, b: Any, sfa: Any, sfb: Any, fmt: Format | str, *, k: int,
         alpha: float = 1.0, out_dtype: str = "bfloat16", bm: int = TP.BM, bn: int = TP.BN,
         store: str = "staged", pdl: bool = False, pieces: int = DEFAULT_PIECES,
         order: str = DEFAULT_ORDER, device: Any = None) -> Any:
    """The two-phase pair with this phase 1: :func:`dequantize_both` (triggering its
    dependents when ``pdl``), then ``matmul_twophase``'s phase 2 (``TwophaseMatmulSpec``:
    tile ``bm x bn``, kstep 64, the most stages, ``store``, ``pdl``; no epilogue) on the
    workspaces. What the dispatch runs once wired (tests, benchmarks). Returns C
    (numpy when every input is numpy)."""
    host = all(isinstance(v, np.ndarray) for v in (a, b, sfa, sfb))
    dev, tgt = H.device_and_target(device, "sm_90a")
    wa, wb = dequantize_both(*(dev.to_device(np.ascontiguousarray(v)) if host else v
                               for v in (a, b, sfa, sfb)), fmt, k=k, bm=bm, bn=bn,
                             device=dev, pdl=pdl, pieces=pieces, order=order)
    spec = TP.TwophaseMatmulSpec(Format.from_name(fmt).name, out_dtype, None, tgt, 64, None,
                                 bm, "none", "tiles", store, bn, pdl)
    m, n = int(a.shape[0]), int(b.shape[0])
    S.check_store(store, out_dtype, n)
    out = H.launch(spec, TP.grid(m, n, bm, bn=bn), (m, n), out_dtype, {"wa": wa, "wb": wb},
                   {"m": m, "n": n, "k": k, "alpha": H.finite_f32(alpha, "alpha")}, dev)
    return dev.to_host(out) if host else out


#: (M, N, K) of the benchmark and the GPU tests
GPU_SHAPES = ((8192, 5760, 2944), (777, 2560, 8192), (1000, 1024, 1056))


def bundle_specs(target: str = "sm_90a") -> list[Any]:
    """NVFP4 / MXFP4, bm 128 with bn 256 / 240, every :data:`PIECES`, order "reversed", with
    and without ``pdl``; the "rows" order at the default pieces; the default pieces at the
    other widths the dense dispatch may pick (224, 192: ``matmul_twophase._run`` runs this
    phase 1 for its no-swizzle pairs); bm 192 at the dispatch's widths with and without
    ``pdl`` (none off sm_90a)."""
    if H.target_name(target) not in TARGETS:
        return []
    specs = [BothSpec(f, TP.BM, bn, p, DEFAULT_ORDER, pdl, target) for f in FORMATS
             for bn in (256, 240) for p in PIECES for pdl in (False, True)]
    specs += [BothSpec(f, TP.BM, bn, DEFAULT_PIECES, "rows", False, target) for f in FORMATS
              for bn in (256, 240)]
    specs += [BothSpec(f, TP.BM, bn, DEFAULT_PIECES, DEFAULT_ORDER, pdl, target)
              for f in FORMATS for bn in (224, 192) for pdl in (False, True)]
    specs += [BothSpec(f, 192, bn, DEFAULT_PIECES, DEFAULT_ORDER, pdl, target)
              for f in FORMATS for bn in TP.WAVE_BNS for pdl in (False, True)]
    return sorted(specs, key=lambda s: s.kernel_name)


_core.attach_kernel_api((dequantize_both,), kernel, build)
_core.register_op_module(__name__)

__all__ = ["BothSpec", "build", "bundle_specs", "dequantize_both", "grid", "kernel", "pair"]
