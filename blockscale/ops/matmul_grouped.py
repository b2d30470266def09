"""Grouped (MoE) block-scaled matmul, portable kernel (SEMANTICS §5, §4.5, D8, D10).

For each group g with rows ``[s, t) = [expert_start[g], expert_start[g+1])`` and expert
``e = expert_ids[g]``:

    C[m, n] = bf16(acc(m, n; e) * expert_scales[e] (* a_row_scales[m]))     (fp32, in order)

with ``acc`` the fp32 block-scaled dot product of hidden row m and weight row ``W[e, n]``.
Rows of groups with ``e == -1`` and rows past ``expert_start[G]`` are written as zeros (every
output byte is written, D7/D8). Per-expert vectors are indexed by expert id (D8).

Two scale layouts:

* ``grouped_matmul_block_scaled`` (NVIDIA-style): ``a_scales`` 5-D with per-expert padded
  tiles (row m of group g at 5-D row ``(s//128 + a_scale_offsets[g])*128 + (m - s)``) and
  ``b_scales`` 6-D ``[E, ceil(N/128), ceil(J/4), 32, 4, 4]``;
* ``grouped_matmul_block_scaled_mxfp4`` (MAX's AMD entry point): row-major E8M0
  ``a_scales [T, K/32]``, ``b_scales [E, N, K/32]``, groups from ``row_offsets``; no scales.

One thread per output on 16x16 blocks, grid ``(ceil(N/16), ceil(T/16))``; each thread finds its
group by counting ``expert_start[1..G] <= m`` (a linear scan, G is small), then runs the shared
K loop of :mod:`blockscale.ops._matmul_ir`. Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import MXFP4, Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.layouts import SF_ATOM_ROWS, scale_shape

BLOCK = (16, 16, 1)
#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._matmul_ir",)


@dataclasses.dataclass(frozen=True)
class GroupedMatmulSpec(FormatSpec):
    """What one portable grouped matmul kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8".
        scale_layout: "tcgen5d" (5-D A scales with offsets, 6-D B scales) or "row_major".
        out_dtype: "bfloat16" | "float32".
        row_scales: whether the kernel reads ``a_row_scales`` (bf16 ``[T]``).
        target: a GPUTarget name.
    """

    fmt: str
    scale_layout: str = "tcgen5d"
    out_dtype: str = "bfloat16"
    row_scales: bool = False
    target: str = "sm_90a"

    op: ClassVar[str] = "grouped_matmul_block_scaled"
    block: ClassVar[tuple[int, int, int]] = BLOCK

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.scale_layout, ("tcgen5d", "row_major"), "scale_layout")
        H.check_choice(self.out_dtype, ("bfloat16", "float32"), "out_dtype")
        if not isinstance(self.row_scales, bool):
            raise TypeError(f"row_scales must be a bool, got {type(self.row_scales).__name__}")
        object.__setattr__(self, "target", H.target_name(self.target))

    @property
    def kernel_name(self) -> str:
        lay = "5d" if self.scale_layout == "tcgen5d" else "rm"
        out = H.out_tag(self.out_dtype)
        return f"bs_grouped_matmul_{self.fmt}_{lay}_{out}{'_rowsc' if self.row_scales else ''}"

    def args(self) -> tuple[KernelArg, ...]:
        """a, w, sfa, sfb, expert_start, [a_scale_offsets], expert_ids, expert_scales,
        [a_row_scales], c, then t, n, k, num_groups."""
        fmt = self.format
        data, scale = fmt.elem_dtype.name, fmt.scale_dtype.name
        args = [KernelArg("a", "buffer", data), KernelArg("w", "buffer", data),
                KernelArg("sfa", "buffer", scale), KernelArg("sfb", "buffer", scale),
                KernelArg("expert_start", "buffer", "int32")]
        if self.scale_layout == "tcgen5d":
            args.append(KernelArg("a_scale_offsets", "buffer", "int32"))
        args += [KernelArg("expert_ids", "buffer", "int32"),
                 KernelArg("expert_scales", "buffer", "float32")]
        if self.row_scales:
            args.append(KernelArg("a_row_scales", "buffer", "bfloat16"))
        args += [KernelArg("c", "buffer", self.out_dtype, "out"),
                 KernelArg("t", "scalar", "i32"), KernelArg("n", "scalar", "i32"),
                 KernelArg("k", "scalar", "i32"), KernelArg("num_groups", "scalar", "i32")]
        return tuple(args)


def grid(t: int, n: int) -> tuple[int, int, int]:
    """Launch grid for a ``[t, n]`` output."""
    return (max(1, -(-n // BLOCK[0])), max(1, -(-t // BLOCK[1])), 1)


def build(spec: GroupedMatmulSpec) -> Any:
    """The ``mlir.ir.Module`` of the portable grouped kernel for ``spec``."""
    from mlir.dialects import arith

    import blockscale.ops._matmul_ir as mir
    from blockscale.compiler import ir as bir

    fmt = spec.format
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), BLOCK) as kb:
        f32 = bir.f32()
        t_count, n_count, k, groups = (bir.as_index(kb.arg(x))
                                       for x in ("t", "n", "k", "num_groups"))
        n = bir.add(bir.mul(bir.block_idx("x"), BLOCK[0]), bir.thread_idx("x"))
        m = bir.add(bir.mul(bir.block_idx("y"), BLOCK[1]), bir.thread_idx("y"))
        with bir.when(bir.logical_and(bir.ult(m, t_count), bir.ult(n, n_count))):
            g, active, expert = mir.grouped_row_group(kb, m, groups)
            br = bir.if_(active, [f32])
            with br.then():
                e = bir.as_index(expert)
                row_bytes = bir.udiv(k, 2) if fmt.is_fp4 else k
                kblocks = bir.ceil_div(k, fmt.block_size)
                w_row = bir.add(bir.mul(e, n_count), n)  # row of W viewed as [E*N, K]
                if spec.scale_layout == "tcgen5d":
                    d1 = bir.ceil_div(kblocks, 4)
                    a_srow = mir.grouped_a_scale_row(kb, m, g)
                    b_srow = mir.grouped_b_scale_row(e, n, n_count)
                else:
                    d1, a_srow, b_srow = None, m, w_row
                sfa_off, sfb_off = mir.scale_offsets(spec.scale_layout, a_srow, b_srow,
                                                     kblocks, d1)
                acc = mir.emit_block_scaled_dot(
                    fmt, a=kb.arg("a"), a_row=bir.mul(m, row_bytes), b=kb.arg("w"),
                    b_row=bir.mul(w_row, row_bytes), sfa=kb.arg("sfa"), sfa_offset=sfa_off,
                    sfb=kb.arg("sfb"), sfb_offset=sfb_off, k=k)
                value = arith.mulf(acc, bir.load(kb.arg("expert_scales"), e))
                if spec.row_scales:  # D10: times the expert scale, then the row scale
                    value = arith.mulf(value, arith.extf(f32, bir.load(kb.arg("a_row_scales"),
                                                                       m)))
                br.yield_(value)
            with br.else_():
                br.yield_(bir.const(0.0, f32))
            mir.store_output(br.results[0], kb.arg("c"), bir.add(bir.mul(m, n_count), n),
                             spec.out_dtype)
    return kb.module


# ---- host side -------------------------------------------------------------------------------

def _int32_vector(v: Any, arg: str, length: int | None = None) -> Any:
    """An integer vector as int32 (numpy) or a device array passed through unchecked."""
    if not isinstance(v, np.ndarray):
        if hasattr(v, "shape"):
            return v
        v = np.asarray(v)
    if v.ndim != 1 or (v.size and v.dtype.kind not in "iu"):
        raise TypeError(f"{arg} must be a 1-D integer array, got dtype {v.dtype}, shape "
                        f"{v.shape}")
    if length is not None and v.shape[0] != length:
        raise ValueError(f"{arg} must have length {length}, got {v.shape[0]}")
    if v.size and (v.min() < -(2 ** 31) or v.max() >= 2 ** 31):
        raise ValueError(f"{arg} values must fit in int32, got range [{v.min()}, {v.max()}]")
    return np.ascontiguousarray(v.astype(np.int32))


def _check_groups(es: Any, ids: Any, t: int, num_experts: int, exact_total: bool) -> None:
    """Host checks of expert_start / expert_ids (numpy only; device arrays are trusted)."""
    if not isinstance(es, np.ndarray) or not isinstance(ids, np.ndarray):
        return
    if es.shape[0] < 2:
        raise ValueError(f"expert_start must have G+1 >= 2 entries, got {es.shape[0]}")
    if es[0] != 0:
        raise ValueError(f"expert_start[0] must be 0, got {es[0]}")
    if np.any(np.diff(es) < 0):
        raise ValueError(f"expert_start must be non-decreasing, got {es.tolist()}")
    if (es[-1] != t) if exact_total else (es[-1] > t):
        want = f"equal to T={t}" if exact_total else f"<= T={t}"
        raise ValueError(f"expert_start[-1] must be {want}, got {es[-1]}")
    if np.any(ids < -1) or np.any(ids >= num_experts):
        raise ValueError(f"expert_ids must be -1 or in [0, {num_experts}), got {ids.tolist()}")


def _grouped_dims(a: Any, w: Any, fmt: Format, k: int | None) -> tuple[int, int, int, int]:
    a_shape, w_shape = H.shape_of(a, "hidden", 2), H.shape_of(w, "weight", 3)
    H.check_dtype(a, fmt.elem_dtype, "hidden", fmt)
    H.check_dtype(w, fmt.elem_dtype, "weight", fmt)
    if w_shape[2] != a_shape[1]:
        raise ValueError(f"weight.shape[2] must equal hidden.shape[1] = {a_shape[1]}, got "
                         f"{w_shape[2]}")
    if k is None:
        k = 2 * a_shape[1] if fmt.is_fp4 else a_shape[1]
    fmt.check_k(k)
    if fmt.data_cols(k) != a_shape[1]:
        raise ValueError(f"hidden.shape[1] must be {fmt.data_cols(k)} for k={k} ({fmt.name}), "
                         f"got {a_shape[1]}")
    t, (e_count, n) = a_shape[0], w_shape[:2]
    if max(t, e_count * n, k) >= 2 ** 31:
        raise ValueError(f"T, E*N and K must be < 2^31, got T={t}, E*N={e_count * n}, K={k}")
    return t, e_count, n, k


def check_tcgen_scales(a_scales: Any, b_scales: Any, fmt: Format, e_count: int, n: int,
                       k: int) -> tuple[int, ...]:
    """Dtypes and shapes of the 5-D ``a_scales`` (any tile count) and the 6-D ``b_scales`` of
    ``e_count`` experts of ``n`` rows; returns ``a_scales``' shape."""
    j = fmt.kblocks(k)
    d1 = scale_shape("tcgen5d", 1, j)[1]
    sfa_shape = H.shape_of(a_scales, "a_scales", 5)
    H.check_dtype(a_scales, fmt.scale_dtype, "a_scales", fmt)
    if sfa_shape[1:] != (d1, 32, 4, 4):
        raise ValueError(f"a_scales must have shape (tiles, {d1}, 32, 4, 4), got {sfa_shape}")
    want_b = (e_count, *scale_shape("tcgen5d", n, j))
    H.check_dtype(b_scales, fmt.scale_dtype, "b_scales", fmt)
    if H.shape_of(b_scales, "b_scales", 6) != want_b:
        raise ValueError(f"b_scales must have shape {want_b}, got {tuple(b_scales.shape)}")
    return sfa_shape


def group_vectors(expert_start: Any, a_scale_offsets: Any, expert_ids: Any, t: int,
                  e_count: int) -> tuple[Any, Any, Any]:
    """``(expert_start, a_scale_offsets, expert_ids)`` as int32 kernel buffers, checked
    (:func:`_check_groups`: expert_start ends at T)."""
    es = _int32_vector(expert_start, "expert_start")
    g_count = es.shape[0] - 1
    ids = _int32_vector(expert_ids, "expert_ids", g_count)
    offs = _int32_vector(a_scale_offsets, "a_scale_offsets", g_count)
    _check_groups(es, ids, t, e_count, exact_total=True)
    return es, offs, ids


def expert_scales_arg(expert_scales: Any, fmt: Format, e_count: int) -> Any:
    """float32 ``[E]`` by expert id (numpy checked; device arrays passed through); None is
    ones for MX formats."""
    if expert_scales is None:
        if not fmt.is_mx:
            raise ValueError("expert_scales must be given for nvfp4 (one float32 per expert), "
                             "got None")
        return np.ones(e_count, np.float32)
    if isinstance(expert_scales, np.ndarray) or not hasattr(expert_scales, "shape"):
        v = np.asarray(expert_scales)
        if v.shape != (e_count,) or v.dtype.kind != "f":
            raise ValueError(f"expert_scales must be a float array of shape ({e_count},), got "
                             f"dtype {v.dtype}, shape {v.shape}")
        v = np.ascontiguousarray(v.astype(np.float32))
        if not np.all(np.isfinite(v)):
            raise ValueError(f"expert_scales must be finite, got {v.tolist()[:8]}")
        return v
    return expert_scales


def check_row_scales(a_row_scales: Any, fmt: Format, t: int) -> None:
    """``a_row_scales``: bf16 ``[T]``, NVFP4 only."""
    if fmt.is_mx:
        raise ValueError(f"a_row_scales is NVFP4 only, got fmt={fmt.name}")
    if H.shape_of(a_row_scales, "a_row_scales", 1) != (t,):
        raise ValueError(f"a_row_scales must have shape ({t},), got "
                         f"{tuple(a_row_scales.shape)}")
    H.check_dtype(a_row_scales, ml_dtypes.bfloat16, "a_row_scales")


def tiled_grouped_operands(hidden: Any, weight: Any, a_scales: Any, b_scales: Any,
                           expert_start: Any, a_scale_offsets: Any, expert_ids: Any,
                           expert_scales: Any, fmt: Format, k: int | None, a_row_scales: Any,
                           kernel: str) -> tuple[int, int, int, int, dict[str, Any]]:
    """The checks of a direct call of an sm_90a tiled grouped kernel (5-D / 6-D scales, K %
    32 == 0; ``kernel`` names it in the error) and its buffers: ``(t, n, k, num_groups,
    buffers)`` with the portable kernel's argument names."""
    t, e_count, n, k = _grouped_dims(hidden, weight, fmt, k)
    if k % 32:
        raise ValueError(f"the {kernel} takes k % 32 == 0, got k={k}")
    check_tcgen_scales(a_scales, b_scales, fmt, e_count, n, k)
    es, offs, ids = group_vectors(expert_start, a_scale_offsets, expert_ids, t, e_count)
    buffers = _buffers(hidden, weight, a_scales, b_scales, (es, offs, ids), expert_scales,
                       a_row_scales, fmt, e_count, t)
    return t, n, k, es.shape[0] - 1, buffers


def _buffers(hidden: Any, weight: Any, a_scales: Any, b_scales: Any, groups: tuple[Any, ...],
             expert_scales: Any, a_row_scales: Any, fmt: Format, e_count: int,
             t: int) -> dict[str, Any]:
    """The grouped kernels' buffers by the portable kernel's argument names (``groups``:
    :func:`group_vectors`' result; the expert and row scales checked here)."""
    es, offs, ids = groups
    buffers = {"a": hidden, "w": weight, "sfa": a_scales, "sfb": b_scales,
               "expert_start": es, "a_scale_offsets": offs, "expert_ids": ids,
               "expert_scales": expert_scales_arg(expert_scales, fmt, e_count)}
    if a_row_scales is not None:
        check_row_scales(a_row_scales, fmt, t)
        buffers["a_row_scales"] = a_row_scales
    return buffers


#: Fast-path hook of :func:`grouped_matmul_block_scaled`: callables ``(target_name, fmt, t, n,
#: k, num_groups, row_scales) -> runner`` returning a runner ``(buffers, scalars, device) -> C``
#: (the portable kernel's argument names) or None when they do not apply. Tried in order.
FAST_PATHS: list[Any] = []
#: Hook of :func:`grouped_matmul_block_scaled_mxfp4` (row-major scales): callables ``(target,
#: fmt, t, n, k, num_groups, out_dtype) -> runner`` or None, as :data:`FAST_PATHS`.
ROW_MAJOR_PATHS: list[Any] = []


def grouped_matmul_block_scaled(hidden: Any, weight: Any, a_scales: Any, b_scales: Any,
                                expert_start: Any, a_scale_offsets: Any, expert_ids: Any,
                                expert_scales: Any, fmt: Format | str, *, k: int | None = None,
                                a_row_scales: Any = None, device: Any = None,
                                target: str | None = None) -> Any:
    """Grouped (MoE) block-scaled matmul, bf16 ``[T, N]`` (SEMANTICS §5, D8, D10).

    Args:
        hidden: ``[T, K/2]`` uint8 (FP4) or ``[T, K]`` float8_e4m3fn, rows sorted by group.
        weight: ``[E, N, K/2 | K]`` (K-major per expert).
        a_scales: 5-D ``[tiles, ceil(J/4), 32, 4, 4]`` with per-group padded row tiles.
        b_scales: 6-D ``[E, ceil(N/128), ceil(J/4), 32, 4, 4]``.
        expert_start: ``[G+1]`` row offsets (0, non-decreasing, ends at T).
        a_scale_offsets: ``[G]`` tile corrections: group g's first scale tile is
            ``expert_start[g] // 128 + a_scale_offsets[g]``.
        expert_ids: ``[G]`` expert of each group; -1 marks an unused group (zero rows).
        expert_scales: ``[E]`` float32 by expert id; None allowed for MX formats (ones).
        fmt: the format; k: logical K (default from hidden).
        a_row_scales: optional bf16 ``[T]`` (NVFP4 only), applied after the expert scale.
    """
    fmt = Format.from_name(fmt)
    t, e_count, n, k = _grouped_dims(hidden, weight, fmt, k)
    sfa_shape = check_tcgen_scales(a_scales, b_scales, fmt, e_count, n, k)
    es, offs, ids = group_vectors(expert_start, a_scale_offsets, expert_ids, t, e_count)
    g_count = es.shape[0] - 1
    if isinstance(es, np.ndarray) and isinstance(offs, np.ndarray):
        for g in range(g_count):
            s, e_ = int(es[g]), int(es[g + 1])
            r0 = (s // SF_ATOM_ROWS + int(offs[g])) * SF_ATOM_ROWS
            if s < e_ and ids[g] >= 0 and (r0 < 0 or r0 + e_ - s > sfa_shape[0] * SF_ATOM_ROWS):
                raise ValueError(f"a_scale_offsets[{g}] = {offs[g]} puts group {g}'s scale rows "
                                 f"at [{r0}, {r0 + e_ - s}), outside a_scales' "
                                 f"{sfa_shape[0] * SF_ATOM_ROWS} rows")
    buffers = _buffers(hidden, weight, a_scales, b_scales, (es, offs, ids), expert_scales,
                       a_row_scales, fmt, e_count, t)
    dev, tgt = H.device_and_target(device, target)
    # the tiled kernels load 16-byte pieces: operands at other addresses run the portable one
    for fast in FAST_PATHS if H.vector_aligned(hidden, weight, a_scales, b_scales) else ():
        runner = fast(tgt, fmt, t, n, k, g_count, a_row_scales is not None)
        if runner is not None:
            return runner(buffers, {"t": t, "n": n, "k": k, "num_groups": g_count}, dev)
    spec = GroupedMatmulSpec(fmt.name, "tcgen5d", "bfloat16", a_row_scales is not None, tgt)
    return H.launch(spec, grid(t, n), (t, n), "bfloat16", buffers,
                    {"t": t, "n": n, "k": k, "num_groups": g_count}, dev,
                    empty=t == 0 or n == 0)


def grouped_matmul_block_scaled_mxfp4(a: Any, b: Any, a_scales: Any, b_scales: Any,
                                      row_offsets: Any, expert_ids: Any, *,
                                      out_dtype: str = "bfloat16", device: Any = None,
                                      target: str | None = None) -> Any:
    """Grouped MXFP4 matmul with row-major E8M0 scales, MAX's AMD entry point (§4.5).

    ``a [T, K/2]``, ``b [E, N, K/2]`` uint8, ``a_scales [T, K/32]``, ``b_scales [E, N, K/32]``;
    group g's rows ``[row_offsets[g], row_offsets[g+1])`` use expert ``expert_ids[g]``; rows
    outside every group or of id -1 are 0. K = 2 * b.shape[2] must be a multiple of 32.
    """
    b_shape = H.shape_of(b, "b", 3)
    k = 2 * b_shape[2]
    if k % 32:
        raise ValueError(f"K = 2 * b.shape[2] must be a multiple of 32, got {k}")
    t, e_count, n, k = _grouped_dims(a, b, MXFP4, k)
    H.check_dtype(a_scales, MXFP4.scale_dtype, "a_scales", MXFP4)
    H.check_dtype(b_scales, MXFP4.scale_dtype, "b_scales", MXFP4)
    if H.shape_of(a_scales, "a_scales", 2) != (t, k // 32):
        raise ValueError(f"a_scales must have shape ({t}, {k // 32}), got "
                         f"{tuple(a_scales.shape)}")
    if H.shape_of(b_scales, "b_scales", 3) != (e_count, n, k // 32):
        raise ValueError(f"b_scales must have shape ({e_count}, {n}, {k // 32}), got "
                         f"{tuple(b_scales.shape)}")
    es = _int32_vector(row_offsets, "row_offsets")
    g_count = es.shape[0] - 1
    ids = _int32_vector(expert_ids, "expert_ids", g_count)
    _check_groups(es, ids, t, e_count, exact_total=False)
    dev, tgt = H.device_and_target(device, target)
    spec = GroupedMatmulSpec("mxfp4", "row_major", out_dtype, False, tgt)
    buffers = {"a": a, "w": b, "sfa": a_scales, "sfb": b_scales, "expert_start": es,
               "expert_ids": ids, "expert_scales": np.ones(e_count, np.float32)}
    for fast in ROW_MAJOR_PATHS:
        runner = fast(tgt, MXFP4, t, n, k, g_count, out_dtype)
        if runner is not None:
            return runner(buffers, {"t": t, "n": n, "k": k, "num_groups": g_count}, dev)
    return H.launch(spec, grid(t, n), (t, n), out_dtype, buffers,
                    {"t": t, "n": n, "k": k, "num_groups": g_count}, dev,
                    empty=t == 0 or n == 0)


def kernel(spec_or_fmt: GroupedMatmulSpec | Format | str, target: str = "sm_90a",
           **spec_fields: Any) -> Any:
    """The compiled Kernel (every asm stage) of a spec, or of a format plus
    :class:`GroupedMatmulSpec` fields on ``target``; needs the compiler."""
    spec = spec_or_fmt if isinstance(spec_or_fmt, GroupedMatmulSpec) else GroupedMatmulSpec(
        Format.from_name(spec_or_fmt).name, target=target, **spec_fields)
    return H.compile_spec(spec)


def grouped_matmul_block_scaled_mxfp4_kernel(target: str = "sm_90a", *,
                                             out_dtype: str = "bfloat16") -> Any:
    """Compiled Kernel behind :func:`grouped_matmul_block_scaled_mxfp4` (row-major E8M0
    scales) on ``target``."""
    return kernel(GroupedMatmulSpec("mxfp4", "row_major", out_dtype, False, target))


def bundle_specs(target: str = "sm_90a") -> list[GroupedMatmulSpec]:
    """Every grouped spec the GPU tests and benchmarks use on ``target``."""
    specs = [GroupedMatmulSpec(f, "tcgen5d", "bfloat16", False, target)
             for f in ("nvfp4", "mxfp4", "mxfp8")]
    specs.append(GroupedMatmulSpec("nvfp4", "tcgen5d", "bfloat16", True, target))
    specs += [GroupedMatmulSpec("mxfp4", "row_major", o, False, target)
              for o in ("bfloat16", "float32")]
    return specs


_core.attach_kernel_api((grouped_matmul_block_scaled, grouped_matmul_block_scaled_mxfp4),
                        kernel, build)

_core.register_op_module(__name__)

import blockscale.ops.matmul_grouped_sm90  # noqa: F401 (registers its FAST_PATHS entry)
import blockscale.ops.matmul_grouped_wgmma  # sm_90a wgmma, prefill (before the mma.sync entry)
import blockscale.ops.matmul_grouped_mfma  # noqa: E402, F401 (gfx942 / gfx950 MFMA)
import blockscale.ops.matmul_decode  # noqa: E402, F401 (decode kernel: first in FAST_PATHS)

__all__ = [
    "FAST_PATHS",
    "GroupedMatmulSpec",
    "build",
    "bundle_specs",
    "grid",
    "grouped_matmul_block_scaled",
    "grouped_matmul_block_scaled_mxfp4",
    "grouped_matmul_block_scaled_mxfp4_kernel",
    "kernel",
]
