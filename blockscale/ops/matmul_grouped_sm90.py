"""sm_90a tensor-core grouped (MoE) block-scaled matmul (SEMANTICS §5, D8, D10).

The dense tensor-core mainloop (:mod:`blockscale.ops._mma_ir`) run over (group, row tile)
work items: CTA ``(x, y)`` computes columns ``[x*bn, (x+1)*bn)`` of the y-th row tile, where row
tiles are numbered group after group (``ceil(n_g / bm)`` tiles for group g; empty groups get
none). Each CTA finds its group by a scan over ``expert_start`` (G is small; the scan is
uniform over the CTA); ``grid.y = ceil(T / bm) + G`` bounds the tile count, and CTAs past the
last tile exit. A tile of a group with expert id -1 writes zeros (D8: every output byte is
written) without running the mainloop.

Per group g with expert e: A rows ``expert_start[g] + ...``; A scales at 5-D row
``(s//128 + a_scale_offsets[g])*128 + (m - s)``; B = weight rows ``e*N + n`` and their 6-D scales
``[e, n//128, ...]``; ``C = bf16(acc * expert_scales[e] (* a_row_scales[m]))`` (fp32, in that
order, as the portable kernel). Registered in :data:`blockscale.ops.matmul_grouped.FAST_PATHS`
for the 5-D-scale entry point on sm_90a with aligned K. Importing it does not import MLIR.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.layouts import SF_ATOM_ROWS
from blockscale.ops import matmul_grouped as _grouped
from blockscale.ops import matmul_sm90 as _dense

KERNEL_SOURCES = ("blockscale.ops._mma_ir", "blockscale.ops._matmul_ir",
                  "blockscale.ops.matmul_sm90")


@dataclasses.dataclass(frozen=True)
class Sm90GroupedSpec(FormatSpec):
    """What one sm_90a tensor-core grouped kernel is specialised on (bf16 output).

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8".
        row_scales: whether the kernel reads ``a_row_scales`` (bf16 ``[T]``).
        bm, bn: the CTA tile (one of :data:`blockscale.ops.matmul_sm90.TILE_CHOICES`).
        target: "sm_90a".
    """

    fmt: str
    row_scales: bool = False
    bm: int = 64
    bn: int = 128
    target: str = "sm_90a"

    op: ClassVar[str] = "grouped_matmul_block_scaled_sm90"
    block: ClassVar[tuple[int, int, int]] = (_dense.THREADS, 1, 1)
    out_dtype: ClassVar[str] = "bfloat16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        if (self.bm, self.bn) not in _dense.tiles_for(self.format):
            raise ValueError(f"(bm, bn) must be one of {list(_dense.tiles_for(self.format))} "
                             f"for {self.fmt}, got {(self.bm, self.bn)}")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, _dense.TARGETS, "target")

    @property
    def kernel_name(self) -> str:
        rs = "_rowsc" if self.row_scales else ""
        return f"bs_grouped_matmul_mma_{self.fmt}_{self.bm}x{self.bn}{rs}"

    def args(self) -> tuple[KernelArg, ...]:
        """The portable grouped kernel's parameters (5-D scales, bf16 output)."""
        return _grouped.GroupedMatmulSpec(self.fmt, "tcgen5d", "bfloat16", self.row_scales,
                                          self.target).args()


def grid(spec: Sm90GroupedSpec, t: int, n: int, num_groups: int) -> tuple[int, int, int]:
    """Launch grid: column tiles x an upper bound of the (group, row tile) work items."""
    return (max(1, -(-n // spec.bn)), -(-t // spec.bm) + num_groups, 1)


def scan_tiles(kb: Any, groups: Any, bm: int) -> tuple[Any, Any, Any, Any]:
    """A CTA-uniform scan of expert_start for CTA row ``y``: ``(y, total, g, start)`` — the
    number of ``bm``-row tiles of all groups, and the group whose tiles hold tile ``y`` with
    its first tile index (0, 0 when ``y >= total``). Shared with the grouped MFMA kernel."""
    from blockscale.compiler import ir as bir

    y = bir.block_idx("y")
    es = kb.arg("expert_start")
    zero = bir.const(0)
    with bir.for_range(0, groups, carry=[zero, zero, zero]) as gl:
        g = gl.iv
        cum, sel_g, sel_start = gl.carried
        rows = bir.sub(bir.as_index(bir.load(es, bir.add(g, 1))),
                       bir.as_index(bir.load(es, g)))
        tiles = bir.ceil_div(rows, bm)
        mine = bir.logical_and(bir.ule(cum, y), bir.ult(y, bir.add(cum, tiles)))
        gl.yield_(bir.add(cum, tiles), bir.select(mine, g, sel_g),
                  bir.select(mine, cum, sel_start))
    total, g, start = gl.results
    return y, total, g, start


def _find_tile(spec: Sm90GroupedSpec, kb: Any, groups: Any) -> tuple[Any, Any, Any]:
    """(group, row tile within the group, whether CTA y has a work item)."""
    from blockscale.compiler import ir as bir

    y, total, g, start = scan_tiles(kb, groups, spec.bm)
    return g, bir.sub(y, start), bir.ult(y, total)


def work_item(kb: Any, g: Any, tile: Any, bm: int, bn: int) -> tuple[Any, ...]:
    """IR values of work item (group ``g``, row tile ``tile``, this CTA's column tile):
    ``(start, end, expert, m0, n0, active)`` — the group's rows [start, end), its expert id,
    the tile's first row and column, and ``expert >= 0``. Shared with the grouped wgmma kernel."""
    from mlir.dialects import arith

    from blockscale.compiler import ir as bir

    es = kb.arg("expert_start")
    start = bir.as_index(bir.load(es, g))
    end = bir.as_index(bir.load(es, bir.add(g, 1)))
    expert = bir.load(kb.arg("expert_ids"), g)
    m0 = bir.add(start, bir.mul(tile, bm))
    n0 = bir.mul(bir.block_idx("x"), bn)
    active = arith.cmpi(arith.CmpIPredicate.sge, expert, bir.const(0, bir.i32()))
    return start, end, expert, m0, n0, active


def work_operands(kb: Any, g: Any, tile: Any, bm: int, start: Any, end: Any, expert: Any,
                  m0: Any, n0: Any, n_count: Any, k: Any, block: int) -> tuple[Any, Any, Any]:
    """``(e, a, b)`` of an active work item: the expert index and the A (group rows, masked at
    ``end``) and B (``weight[e]``) tile operands with their 5-D / 6-D scale rows (``block``:
    the format's block size). Shared with the grouped wgmma kernel."""
    from blockscale.compiler import ir as bir

    e = bir.as_index(expert)
    d1 = bir.ceil_div(bir.ceil_div(k, block), 4)
    tile0 = bir.add(bir.udiv(start, SF_ATOM_ROWS),
                    bir.as_index(bir.load(kb.arg("a_scale_offsets"), g)))
    # bm divides 128: local rows r < bm stay inside the group's padded 128-row scale tiles
    srow0 = bir.add(bir.mul(tile0, SF_ATOM_ROWS), bir.mul(tile, bm))
    w_row0 = bir.add(bir.mul(e, n_count), n0)
    b_srow0 = bir.add(bir.mul(bir.mul(e, bir.ceil_div(n_count, SF_ATOM_ROWS)),
                              SF_ATOM_ROWS), n0)
    a = _dense.tile_operand(kb.arg("a"), kb.arg("sfa"), m0, m0, end, srow0, d1)
    b = _dense.tile_operand(kb.arg("w"), kb.arg("sfb"), w_row0, n0, n_count, b_srow0, d1)
    return e, a, b


def build(spec: Sm90GroupedSpec) -> Any:
    """The ``mlir.ir.Module`` of the grouped kernel for ``spec`` (IR only)."""
    from mlir.dialects import arith

    import blockscale.ops._mma_ir as X
    from blockscale.compiler import ir as bir

    plan, tiles = X.Plan(spec.format), X.Tiles(spec.bm, spec.bn)
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        smem = X.Smem.allocate(kb, plan, tiles)
        t_count, n_count, k, groups = (bir.as_index(kb.arg(x))
                                       for x in ("t", "n", "k", "num_groups"))
        g, tile, has_work = _find_tile(spec, kb, groups)
        wc = X.WarpCoords.of(tiles)
        with bir.when(has_work):
            start, end, expert, m0, n0, active = work_item(kb, g, tile, spec.bm, spec.bn)
            br = bir.if_(active, [])
            with br.then():
                e, a, b = work_operands(kb, g, tile, spec.bm, start, end, expert, m0, n0,
                                        n_count, k, plan.block)
                acc = X.emit_mainloop(plan, tiles, smem, wc, a, b, k)
                scale = bir.load(kb.arg("expert_scales"), e)

                def expert_scaled(v: Any, m: Any, n: Any) -> Any:
                    v = arith.mulf(v, scale)
                    if spec.row_scales:  # D10: times the expert scale, then the row scale
                        v = arith.mulf(v, arith.extf(bir.f32(),
                                                     bir.load(kb.arg("a_row_scales"), m)))
                    return v

                _dense.store_tile(spec, kb, acc, wc, m0, n0, end, n_count, expert_scaled)
                br.yield_()
            with br.else_():
                zeros = [[[bir.const(0.0, bir.f32())] * 4] * tiles.n_tiles] * tiles.m_tiles
                _dense.store_tile(spec, kb, zeros, wc, m0, n0, end, n_count,
                                  lambda v, m, n: v)
                br.yield_()
        del t_count
    return kb.module


def fast_path(target: str, fmt: Format, t: int, n: int, k: int, num_groups: int,
              row_scales: bool) -> Callable[..., Any] | None:
    """The :data:`blockscale.ops.matmul_grouped.FAST_PATHS` hook: a runner
    ``(buffers, scalars, device) -> C`` for sm_90a and aligned K, else None."""
    if target not in _dense.TARGETS or not _dense.enabled() or t == 0 or n == 0 \
            or not _dense.k_supported(fmt, k):
        return None
    spec = spec_for(fmt, t, n, row_scales, target)

    def run(buffers: dict[str, Any], scalars: dict[str, Any], device: Any) -> Any:
        return H.launch(spec, grid(spec, t, n, num_groups), (t, n), "bfloat16", buffers,
                        scalars, device)
    return run


def spec_for(fmt: Format, t: int, n: int, row_scales: bool = False,
             target: str = "sm_90a") -> Sm90GroupedSpec:
    """The spec the fast path uses for ``T`` rows and ``N`` columns."""
    bm, bn = _dense.choose_tiles(fmt, t, n)
    return Sm90GroupedSpec(fmt.name, row_scales, bm, bn, target)


def kernel(spec: Sm90GroupedSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


#: (T, N) of the grouped GPU tests (tests/test_matmul_fast_gpu.py) and benchmarks.
GPU_SHAPES = ((1920, 2048), (8, 2048), (451, 2048), (6, 2048), (64, 7168), (4096, 5760))


def bundle_specs(target: str = "sm_90a") -> list[Sm90GroupedSpec]:
    """The grouped specs of the GPU tests (tests/test_matmul_fast_gpu.py) on ``target``."""
    if target not in _dense.TARGETS:
        return []
    specs = {spec_for(Format.from_name(f), t, n, rs, target)
             for f in ("nvfp4", "mxfp4", "mxfp8") for rs in (False, True) for t, n in GPU_SHAPES
             if not (rs and f != "nvfp4")}
    return sorted(specs, key=lambda s: s.kernel_name)


if fast_path not in _grouped.FAST_PATHS:
    _grouped.FAST_PATHS.append(fast_path)

_core.register_op_module(__name__)

__all__ = ["Sm90GroupedSpec", "build", "bundle_specs", "fast_path", "grid", "kernel",
           "spec_for"]
