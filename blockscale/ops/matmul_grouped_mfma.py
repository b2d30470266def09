"""AMD MFMA grouped (MoE) block-scaled matmul: gfx950 scaled MFMA, gfx942 bf16 MFMA.

Same contract as the portable grouped kernel (SEMANTICS §5, §4.5, D8, D10): per group g with
rows ``[expert_start[g], expert_start[g+1])`` and expert ``e = expert_ids[g]``,
``C[m, n] = out(acc(m, n; e) * expert_scales[e] (* a_row_scales[m]))``; rows of groups with
``e == -1`` and rows past ``expert_start[G]`` are zeros (every output is written). Both entry
points: 5-D A scales with per-group padded tiles and 6-D weight scales
(:func:`~blockscale.ops.matmul_grouped.grouped_matmul_block_scaled`, via its FAST_PATHS), and
row-major E8M0 scales (:func:`~blockscale.ops.matmul_grouped.grouped_matmul_block_scaled_mxfp4`,
via its ROW_MAJOR_PATHS). The 5-D entry point takes it only where it is bit-identical to the
portable kernel unless BLOCKSCALE_AMD_MFMA_GROUPED=all (:data:`GROUPED_SWITCH`: D10).

Work items are (group, 64-row tile) pairs, numbered group after group, plus the tiles of the
rows past ``expert_start[G]`` (a virtual group of id -1); block ``(x, y)`` computes columns
``[64 x, 64 x + 64)`` of work item y (``grid.y = ceil(T / 64) + G + 1`` bounds their count;
blocks past the last exit). Each block finds its item by a uniform scan of ``expert_start``.
The mainloops are the dense MFMA kernel's (:mod:`blockscale.ops._mfma_ir`; instruction per
target and format as in :mod:`blockscale.ops.matmul_mfma`). Importing this module does not
import MLIR.
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
from blockscale.ops import matmul_grouped as _grouped
from blockscale.ops import matmul_grouped_sm90 as _gsm90
from blockscale.ops import matmul_mfma as _dense

KERNEL_SOURCES = ("blockscale.ops._mfma_ir", "blockscale.ops._matmul_ir",
                  "blockscale.ops.matmul_mfma", "blockscale.ops.matmul_grouped_sm90")
BM = _dense.TILE[0]


@dataclasses.dataclass(frozen=True)
class MfmaGroupedSpec(FormatSpec):
    """What one AMD MFMA grouped kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8".
        scale_layout: "tcgen5d" (5-D A scales with offsets, 6-D B scales) or "row_major".
        out_dtype: "bfloat16" | "float32".
        row_scales: whether the kernel reads ``a_row_scales`` (bf16 ``[T]``).
        aligned: K is a multiple of the block size (wide loads).
        target: "gfx942" | "gfx950".
    """

    fmt: str
    scale_layout: str = "tcgen5d"
    out_dtype: str = "bfloat16"
    row_scales: bool = False
    aligned: bool = True
    target: str = "gfx950"

    op: ClassVar[str] = "grouped_matmul_block_scaled_mfma"
    block: ClassVar[tuple[int, int, int]] = (_dense.THREADS, 1, 1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.scale_layout, ("tcgen5d", "row_major"), "scale_layout")
        H.check_choice(self.out_dtype, ("bfloat16", "float32"), "out_dtype")
        for name in ("row_scales", "aligned"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got "
                                f"{type(getattr(self, name)).__name__}")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, _dense.TARGETS, "target")

    @property
    def path(self) -> str:
        return _dense.path_for(self.target, self.format)

    @property
    def kernel_name(self) -> str:
        lay = "5d" if self.scale_layout == "tcgen5d" else "rm"
        return (f"bs_grouped_matmul_mfma_{self.path}_{self.fmt}_{lay}_"
                f"{H.out_tag(self.out_dtype)}{'_rowsc' if self.row_scales else ''}"
                f"{'' if self.aligned else '_tail'}")

    def args(self) -> tuple[KernelArg, ...]:
        """The portable grouped kernel's parameters."""
        return _grouped.GroupedMatmulSpec(self.fmt, self.scale_layout, self.out_dtype,
                                          self.row_scales, self.target).args()


def grid(t: int, n: int, num_groups: int) -> tuple[int, int, int]:
    """Column tiles x an upper bound of the work items (group tiles + the tail's tiles)."""
    return (max(1, -(-n // _dense.TILE[1])), -(-t // BM) + num_groups + 1, 1)


def _find_item(kb: Any, groups: Any, t_count: Any) -> tuple[Any, ...]:
    """(group, tile within it, has work, is the tail): a block-uniform scan of
    expert_start; the tail is the rows ``[expert_start[G], T)``."""
    from blockscale.compiler import ir as bir

    y, total, g, start = _gsm90.scan_tiles(kb, groups, BM)
    es = kb.arg("expert_start")
    tail_rows = bir.sub(t_count, bir.as_index(bir.load(es, groups)))
    is_tail = bir.ule(total, y)
    tile = bir.select(is_tail, bir.sub(y, total), bir.sub(y, start))
    has_work = bir.ult(y, bir.add(total, bir.ceil_div(tail_rows, BM)))
    return g, tile, has_work, is_tail


def build(spec: MfmaGroupedSpec) -> Any:
    """The ``mlir.ir.Module`` of the grouped kernel for ``spec`` (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._matmul_ir as mir
    import blockscale.ops._mfma_ir as X
    from blockscale.compiler import ir as bir
    from blockscale.layouts import SF_ATOM_ROWS

    fmt = spec.format
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        t_count, n_count, k, groups = (bir.as_index(kb.arg(x))
                                       for x in ("t", "n", "k", "num_groups"))
        g, tile, has_work, is_tail = _find_item(kb, groups, t_count)
        lane = X.Lane.of()
        kblocks = bir.ceil_div(k, fmt.block_size)
        with bir.when(has_work):
            es = kb.arg("expert_start")
            g_safe = bir.select(is_tail, 0, g)  # a valid index (groups >= 1)
            start = bir.select(is_tail, bir.as_index(bir.load(es, groups)),
                               bir.as_index(bir.load(es, g_safe)))
            end = bir.select(is_tail, t_count, bir.as_index(bir.load(es, bir.add(g_safe, 1))))
            expert = bir.select(is_tail, bir.const(-1, bir.i32()),
                                bir.load(kb.arg("expert_ids"), g_safe))
            m0 = bir.add(start, bir.mul(tile, BM))
            n0 = bir.mul(bir.block_idx("x"), _dense.TILE[1])
            active = arith.cmpi(arith.CmpIPredicate.sge, expert, bir.const(0, bir.i32()))
            br = bir.if_(active, [])
            with br.then():
                e = bir.as_index(expert)
                if spec.scale_layout == "tcgen5d":
                    d1 = bir.ceil_div(kblocks, 4)
                    tile0 = bir.add(bir.udiv(start, SF_ATOM_ROWS),
                                    bir.as_index(bir.load(kb.arg("a_scale_offsets"), g_safe)))
                    a_srow0 = bir.sub(bir.mul(tile0, SF_ATOM_ROWS), start)
                    b_srow0 = bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)),
                                      SF_ATOM_ROWS)

                    def a_off(row: Any, j: Any) -> Any:  # 5-D row tile0*128 + (m - start)
                        return bir.add(mir.tcgen_row_offset(bir.add(a_srow0, row), d1),
                                       mir.tcgen_kblock_offset(j))

                    def b_off(row: Any, j: Any) -> Any:  # 6-D [e, n // 128, ...]
                        return bir.add(mir.tcgen_row_offset(bir.add(b_srow0, row), d1),
                                       mir.tcgen_kblock_offset(j))
                else:
                    w0 = bir.mul(e, n_count)

                    def a_off(row: Any, j: Any) -> Any:
                        return bir.add(bir.mul(row, kblocks), j)

                    def b_off(row: Any, j: Any) -> Any:
                        return bir.add(bir.mul(bir.add(w0, row), kblocks), j)
                a = X.Operand(kb.arg("a"), kb.arg("sfa"), bir.add(m0, lane.wm), end, a_off)
                b = X.Operand(kb.arg("w"), kb.arg("sfb"), bir.add(n0, lane.wn), n_count, b_off,
                              base=bir.mul(e, n_count))
                acc = X.emit_mainloop(spec.path, spec.target, fmt, a, b, lane, k, spec.aligned)
                scale = bir.load(kb.arg("expert_scales"), e)

                def value(v: Any, m: Any, n: Any) -> Any:
                    v = arith.mulf(v, scale)
                    if spec.row_scales:  # D10: times the expert scale, then the row scale
                        v = arith.mulf(v, arith.extf(bir.f32(),
                                                     bir.load(kb.arg("a_row_scales"), m)))
                    return v

                X.store_acc(kb.arg("c"), spec.out_dtype, acc, lane, m0, n0, end, n_count,
                            value)
                br.yield_()
            with br.else_():
                zero = bir.const(0.0, bir.vec(4, bir.f32()))
                zeros = [[zero] * X.SUB_N for _ in range(X.SUB_M)]
                X.store_acc(kb.arg("c"), spec.out_dtype, zeros, lane, m0, n0, end, n_count,
                            lambda v, m, n: v)
                br.yield_()
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def spec_for(target: str, fmt: Format, k: int, scale_layout: str = "tcgen5d",
             out_dtype: str = "bfloat16", row_scales: bool = False) -> MfmaGroupedSpec:
    """The spec the dispatch uses for a problem."""
    return MfmaGroupedSpec(fmt.name, scale_layout, out_dtype, row_scales,
                           _dense.aligned_k(fmt, k), target)


def _runner(spec: MfmaGroupedSpec, t: int, n: int, num_groups: int) -> Callable[..., Any]:
    def run(buffers: dict[str, Any], scalars: dict[str, Any], device: Any) -> Any:
        return H.launch(spec, grid(t, n, num_groups), (t, n), spec.out_dtype, buffers,
                        scalars, device)
    return run


#: BLOCKSCALE_AMD_MFMA_GROUPED: "exact" (default) dispatches the 5-D-scale entry point to the
#: MFMA kernel only where it equals the portable grouped kernel bit for bit (FP4 on the bf16
#: path: NVFP4 on both targets, MXFP4 on gfx942), because the fused SwiGLU
#: (ops/matmul_swiglu.py) runs the portable mainloop on AMD and D10 requires it to be
#: byte-identical to this chained matmul; "all" takes the MFMA kernel for every format
#: (MXFP8 block sums and the scaled MFMA round differently); "0" never.
GROUPED_SWITCH = "BLOCKSCALE_AMD_MFMA_GROUPED"


def grouped_mode() -> str:
    """"exact" | "all" | "0" (see :data:`GROUPED_SWITCH`)."""
    mode = os.environ.get(GROUPED_SWITCH, "exact")
    if mode not in ("exact", "all", "0"):
        raise ValueError(f"{GROUPED_SWITCH} must be one of 'exact', 'all', '0', got {mode!r}")
    return mode


def exact_as_portable(target: str, fmt: Format) -> bool:
    """Whether the MFMA kernel's results equal the portable kernel's bit for bit (FP4 on the
    bf16 path: exact block sums, the portable kernel's accumulation order)."""
    return _dense.path_for(target, fmt) == "bf16" and fmt.is_fp4


def fast_path(target: str, fmt: Format, t: int, n: int, k: int, num_groups: int,
              row_scales: bool) -> Callable[..., Any] | None:
    """:data:`blockscale.ops.matmul_grouped.FAST_PATHS` hook (5-D scales, bf16 output); see
    :data:`GROUPED_SWITCH` for which formats it takes."""
    if target not in _dense.TARGETS or not _dense.enabled() or t == 0 or n == 0:
        return None
    mode = grouped_mode()
    if mode == "0" or (mode == "exact" and not exact_as_portable(target, fmt)):
        return None
    return _runner(spec_for(target, fmt, k, "tcgen5d", "bfloat16", row_scales), t, n,
                   num_groups)


def row_major_path(target: str, fmt: Format, t: int, n: int, k: int, num_groups: int,
                   out_dtype: str) -> Callable[..., Any] | None:
    """:data:`blockscale.ops.matmul_grouped.ROW_MAJOR_PATHS` hook (row-major E8M0 scales)."""
    if target not in _dense.TARGETS or not _dense.enabled() or t == 0 or n == 0:
        return None
    return _runner(spec_for(target, fmt, k, "row_major", out_dtype), t, n, num_groups)


def kernel(spec: MfmaGroupedSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def bundle_specs(target: str = "gfx950") -> list[MfmaGroupedSpec]:
    """Every grouped spec the dispatch can pick on ``target`` (none off AMD)."""
    if target not in _dense.TARGETS:
        return []
    specs = [MfmaGroupedSpec(f, "tcgen5d", "bfloat16", rs, al, target)
             for f in ("nvfp4", "mxfp4", "mxfp8") for rs in (False, True)
             for al in (True, False) if not (rs and f != "nvfp4")]
    # grouped_matmul_block_scaled_mxfp4 requires K % 32 == 0: aligned only
    specs += [MfmaGroupedSpec("mxfp4", "row_major", o, False, True, target)
              for o in ("bfloat16", "float32")]
    return specs


if fast_path not in _grouped.FAST_PATHS:
    _grouped.FAST_PATHS.append(fast_path)
if row_major_path not in _grouped.ROW_MAJOR_PATHS:
    _grouped.ROW_MAJOR_PATHS.append(row_major_path)

_core.attach_kernel_api((), kernel, build)
_core.register_op_module(__name__)

__all__ = ["MfmaGroupedSpec", "build", "bundle_specs", "fast_path", "grid", "kernel",
           "row_major_path", "spec_for"]
