"""Fused grouped matmul + gated activation + quantize, one kernel (SEMANTICS §6, §7.7, D8, D10).

``grouped_matmul_swiglu`` takes the grouped matmul's operands (§5) with σ-permuted gate/up
weights ``weight [E, 2D, K/2 | K]`` (row 2i = gate i, row 2i+1 = up i, see
:func:`blockscale.reference.sigma_permute_rows`; the 6-D ``b_scales`` permuted the same way
before the interleave) and returns the quantized activation ``(data [T, D/2 | D], scales 5-D)``
with the scales placed like the A scales (``a_scale_offsets``, ``a_scales.shape[0]`` tiles).

Per element (D10): ``g, u = f32(bf16(acc * expert_scales[e] (* a_row_scales[m])))``, ``z =
activation(g, u)`` in float32 (IEEE division in the sigmoid, blockscale's
``exp_f32`` as plain mul/add IR, ``ops/_expf_ir.py``), then the D2 quantize
with the NVFP4 encode scale ``1 / input_scales[e]`` (by expert id, D8; raw, not inverted).
Rows of expert id -1 groups, their scale tiles, padding rows of every tile and spare tiles are
zero bytes: every output byte is written by the kernel.

It is byte-identical to :func:`blockscale.ops.grouped_matmul_block_scaled` on the un-permuted
weights followed by :func:`blockscale.ops.fused_silu_quantize` (same K loop, same quantize
helpers, same ``exp``) on every target, and to :func:`blockscale.reference.grouped_matmul_swiglu`
wherever the kernel's fp32 accumulation rounds to the same bf16 as the reference's exact sum.
The IR is in :mod:`blockscale.ops._matmul_swiglu_ir`. Importing this module does not import MLIR.

MXFP8 on sm_90a (issue #10): prefill (the grouped wgmma fast path's "wgmma": the grouped
producer-dequant kernel with its flag and fixup kernels,
:mod:`blockscale.ops.matmul_grouped_pdq_mx8`) runs the chained path itself as FP4 does
(below); where the chained grouped matmul runs the mma.sync tensor-core kernel
(:mod:`blockscale.ops.matmul_grouped_sm90`, see :func:`chained_mainloop`), an E4M3 block sum
rounds inside the tensor core, so the fused kernel must issue the very same MMAs: there it
runs :class:`SwigluMmaSpec`, whose IR (:mod:`blockscale.ops._matmul_swiglu_mma_ir`, the
argument in its docstring) calls the chained kernel's mainloop and adds this op's epilogue.
Where the chained matmul runs the MXFP8 tensor-core decode kernel ("mma_x8", groups of <= 16
rows) the op runs the chained path itself (:func:`_run_chain`, that kernel with its
``sigma_out`` store, then :func:`blockscale.ops.fused_silu_quantize`).
FP4 block sums are exact, so FP4 keeps the portable K loop on every target, except where the
chained matmul's kernel does not sum as the portable kernel does: the one-row decode kernel
("mma_c8t1", where every group holds one row: the chained path run by :func:`_run_chain`
with that kernel's ``sigma_out`` store) and the sm_90a grouped wgmma fast path (prefill,
"wgmma": HGMMA's fp32 accumulation is not the portable kernel's): there the op runs that
fast path's kernel (the grouped producer-dequant kernel for
``matmul_grouped_wgmma.PDQ_FORMATS``, NVFP4 and MXFP4, ``matmul_grouped_pdq.dispatch_spec``;
the grouped wgmma kernel with ``BLOCKSCALE_SM90_GROUPED_PDQ=0``) on the σ-permuted weights
with its σ output store (un-permuted gate | up columns), then
:func:`blockscale.ops.fused_silu_quantize`, i.e. the chained computation itself.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.activations import GatedActivation
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import matmul_grouped as GM
from blockscale.ops import quantize as Q
from blockscale.ops import quantize_grouped as QG

BLOCK = Q.BLOCK
#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._matmul_swiglu_ir", "blockscale.ops._matmul_ir",
                  "blockscale.ops.quantize_ir", "blockscale.compiler.arch.convert",
                  "blockscale.ops._expf_ir", "blockscale.activations",
                  "blockscale.ops._matmul_swiglu_mma_ir", "blockscale.ops._mma_ir",
                  "blockscale.ops.matmul_sm90")
#: threads of the sm_90a MXFP8 mma kernel (2 x 2 warps, as the chained tensor-core kernel)
MMA_THREADS = 128


@dataclasses.dataclass(frozen=True)
class SwigluSpec(FormatSpec):
    """What one fused grouped-matmul SwiGLU kernel is specialised on.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8" (operands and output).
        target: a GPUTarget name.
        activation, act_alpha, act_limit: the gated activation (``GatedActivation`` fields).
        row_scales: whether the kernel reads ``a_row_scales`` (bf16 ``[T]``, NVFP4).
        aligned: D % 8 == 0 (vector stores of the packed output).
    """

    fmt: str
    target: str = "sm_90a"
    activation: str = "silu"
    act_alpha: float = 1.0
    act_limit: float = math.inf
    row_scales: bool = False
    aligned: bool = True

    op: ClassVar[str] = "grouped_matmul_swiglu"
    block: ClassVar[tuple[int, int, int]] = BLOCK
    #: the quantize_ir helpers read these (the chained path's QuantizeSpec fields)
    layout: ClassVar[str] = "tcgen5d"
    mode: ClassVar[str] = "swiglu"
    gather: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        object.__setattr__(self, "target", H.target_name(self.target))
        act = GatedActivation(self.activation, float(self.act_alpha), float(self.act_limit))
        object.__setattr__(self, "act_alpha", act.alpha)
        object.__setattr__(self, "act_limit", act.limit)
        for name in ("row_scales", "aligned"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got "
                                f"{type(getattr(self, name)).__name__}")
        if self.row_scales and self.format.is_mx:
            raise ValueError(f"row_scales is NVFP4 only, got fmt={self.fmt}")

    @property
    def rounding(self) -> str | None:
        """E8M0 rounding of the output scales: the format's default (as the chained path)."""
        return self.format.resolve_scale_rounding(None)

    @property
    def kernel_name(self) -> str:
        parts = ["grouped_matmul_swiglu", self.fmt, "v" if self.aligned else "s",
                 self.activation]
        if (self.act_alpha, self.act_limit) not in ((1.0, math.inf), (1.702, 7.0)):
            parts.append(f"a{self.act_alpha:g}l{self.act_limit:g}".replace(".", "p"))
        if self.row_scales:
            parts.append("rowsc")
        return "_".join(parts)

    def args(self) -> tuple[KernelArg, ...]:
        """a, w, sfa, sfb, expert_start, scales_offsets (= a_scale_offsets), expert_ids,
        expert_scales, input_scales, [a_row_scales], data, scales, then the scalars."""
        fmt = self.format
        data, scale = fmt.elem_dtype.name, fmt.scale_dtype.name
        args = [KernelArg("a", "buffer", data), KernelArg("w", "buffer", data),
                KernelArg("sfa", "buffer", scale), KernelArg("sfb", "buffer", scale),
                KernelArg("expert_start", "buffer", "int32"),
                KernelArg("scales_offsets", "buffer", "int32"),
                KernelArg("expert_ids", "buffer", "int32"),
                KernelArg("expert_scales", "buffer", "float32"),
                KernelArg("input_scales", "buffer", "float32")]
        if self.row_scales:
            args.append(KernelArg("a_row_scales", "buffer", "bfloat16"))
        args += [KernelArg("data", "buffer", data, "out"),
                 KernelArg("scales", "buffer", scale, "out"),
                 KernelArg("num_groups", "scalar", "i32"),
                 KernelArg("search_steps", "scalar", "i32"),
                 KernelArg("kdim", "scalar", "i64")]
        args += [KernelArg(n, "scalar", "i64") for n in
                 ("m", "k", "kblocks_row", "chunks_row", "n_tiles", "tiles_per_step")]
        args += [KernelArg(n, "scalar", "i32") for n in ("tile_iters", "cb_log2", "split_log2")]
        return tuple(args)


@dataclasses.dataclass(frozen=True)
class SwigluMmaSpec(FormatSpec):
    """The sm_90a MXFP8 fused kernel on the chained grouped matmul's tensor-core mainloop.

    Attributes:
        fmt: "mxfp8" (the only format whose block sums round, see the module docstring).
        target: "sm_90a".
        activation, act_alpha, act_limit: the gated activation (``GatedActivation`` fields).
    """

    fmt: str = "mxfp8"
    target: str = "sm_90a"
    activation: str = "silu"
    act_alpha: float = 1.0
    act_limit: float = math.inf

    op: ClassVar[str] = "grouped_matmul_swiglu_mma"
    block: ClassVar[tuple[int, int, int]] = (MMA_THREADS, 1, 1)
    #: the quantize_ir helpers read these (the chained path's QuantizeSpec fields)
    layout: ClassVar[str] = "tcgen5d"
    mode: ClassVar[str] = "swiglu"
    gather: ClassVar[bool] = False
    aligned: ClassVar[bool] = True
    row_scales: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        if self.fmt != "mxfp8":
            raise ValueError(f"fmt must be 'mxfp8' for the mma fused kernel, got {self.fmt!r}")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, ("sm_90a",), "target")
        act = GatedActivation(self.activation, float(self.act_alpha), float(self.act_limit))
        object.__setattr__(self, "act_alpha", act.alpha)
        object.__setattr__(self, "act_limit", act.limit)

    @property
    def rounding(self) -> str | None:
        """E8M0 rounding of the output scales: the format's default (as the chained path)."""
        return self.format.resolve_scale_rounding(None)

    @property
    def kernel_name(self) -> str:
        parts = ["grouped_matmul_swiglu_mma", self.fmt, self.activation]
        if (self.act_alpha, self.act_limit) not in ((1.0, math.inf), (1.702, 7.0)):
            parts.append(f"a{self.act_alpha:g}l{self.act_limit:g}".replace(".", "p"))
        return "_".join(parts)

    def args(self) -> tuple[KernelArg, ...]:
        """a, w, sfa, sfb, expert_start, scales_offsets, expert_ids, expert_scales, data,
        scales, then the scalars."""
        data, scale = "float8_e4m3fn", "float8_e8m0fnu"
        return (KernelArg("a", "buffer", data), KernelArg("w", "buffer", data),
                KernelArg("sfa", "buffer", scale), KernelArg("sfb", "buffer", scale),
                KernelArg("expert_start", "buffer", "int32"),
                KernelArg("scales_offsets", "buffer", "int32"),
                KernelArg("expert_ids", "buffer", "int32"),
                KernelArg("expert_scales", "buffer", "float32"),
                KernelArg("data", "buffer", data, "out"),
                KernelArg("scales", "buffer", scale, "out"),
                KernelArg("num_groups", "scalar", "i32"),
                KernelArg("search_steps", "scalar", "i32"),
                *(KernelArg(n, "scalar", "i64") for n in ("kdim", "d", "kblocks_row",
                                                          "n_tiles")))


def mma_launch_plan(d: int, num_tiles: int, num_groups: int, k: int
                    ) -> tuple[tuple[int, int, int], dict[str, int]]:
    """Grid and scalars of :class:`SwigluMmaSpec` for ``d`` output columns, ``num_tiles``
    scale tiles, ``num_groups`` groups and matmul K ``k``: CTA (x, y) = output K-block x
    (padded to a multiple of 4) of rows ``[64 (y & 1), +64)`` of scale tile ``y >> 1``."""
    kblocks = -(-d // 32)  # output MXFP8 blocks per row
    kblocks_row = -(-kblocks // 4) * 4
    grid = (kblocks_row, 2 * num_tiles, 1)
    return grid, {"num_groups": num_groups, "kdim": k, "d": d, "kblocks_row": kblocks_row,
                  "n_tiles": num_tiles,
                  "search_steps": max(1, num_groups - 1).bit_length() if num_groups > 1 else 0}


def chained_mainloop(target: str, fmt: Format, t: int, n: int, k: int, num_groups: int,
                     expert_start: Any, row_scales: bool = False, aligned: bool = True) -> str:
    """Which kernel :func:`blockscale.ops.grouped_matmul_block_scaled` runs for these
    operands, found by walking its ``FAST_PATHS`` as it does: "decode" (sm_90a, groups of
    <= 16 rows), "mma" (the sm_90a tensor-core kernel), "wgmma" (the sm_90a grouped wgmma
    kernel), "portable" (also when the operands are not 16-byte aligned: ``aligned`` False,
    see ``_matmul_host.vector_aligned``), or the module name of a fast path this op does not
    know (the fused op then runs its portable kernel)."""
    from blockscale.ops import matmul_decode as MD
    from blockscale.ops import matmul_grouped_sm90 as GS
    from blockscale.ops import matmul_grouped_wgmma as GW

    for hook in GM.FAST_PATHS if aligned else ():
        if hook(target, fmt, t, n, k, num_groups, row_scales) is None:
            continue
        if hook is MD.grouped_fast_path:
            if MD.max_group_rows(expert_start, t) <= MD.MAX_ROWS:
                return "decode"
            continue  # its runner hands over to the next fast path
        if hook is GS.fast_path:
            return "mma"
        if hook is GW.fast_path:
            return "wgmma"
        return str(getattr(hook, "__module__", hook))
    return "portable"


def _spec(fmt: Format, target: str, act: GatedActivation, row_scales: bool, aligned: bool
          ) -> SwigluSpec:
    return SwigluSpec(fmt.name, target, act.kind, float(act.alpha), float(act.limit),
                      row_scales, aligned)


def build(spec: SwigluSpec | SwigluMmaSpec) -> Any:
    """The kernel module of ``spec`` (imports MLIR)."""
    if isinstance(spec, SwigluMmaSpec):
        from blockscale.ops import _matmul_swiglu_mma_ir

        return _matmul_swiglu_mma_ir.build(spec)
    from blockscale.ops import _matmul_swiglu_ir

    return _matmul_swiglu_ir.build(spec)


def launch_plan(spec: SwigluSpec, t: int, d: int, num_tiles: int, num_groups: int, k: int
                ) -> tuple[tuple[int, int, int], dict[str, int]]:
    """Grid and scalars for ``t`` rows, ``d`` output columns, ``num_tiles`` scale tiles,
    ``num_groups`` groups and logical matmul K ``k`` (the quantize kernel's decomposition)."""
    grid, scalars = Q.launch_plan(spec, t, d, num_tiles)  # type: ignore[arg-type]
    scalars.update(num_groups=num_groups, kdim=k,
                   search_steps=max(1, num_groups - 1).bit_length() if num_groups > 1 else 0)
    return grid, scalars


# ---- host side -------------------------------------------------------------------------------

def grouped_matmul_swiglu(hidden: Any, weight: Any, a_scales: Any, b_scales: Any,
                          expert_start: Any, a_scale_offsets: Any, expert_ids: Any,
                          expert_scales: Any, input_scales: Any, fmt: Format | str, *,
                          k: int | None = None,
                          activation: GatedActivation | str | None = None,
                          a_row_scales: Any = None, device: Any = None,
                          target: str | None = None) -> tuple[Any, Any]:
    """Fused grouped matmul + gated activation + quantize, one kernel (module docstring).

    Args:
        hidden: ``[T, K/2]`` uint8 (FP4) or ``[T, K]`` float8_e4m3fn, rows sorted by group.
        weight: σ-permuted ``[E, 2D, K/2 | K]``; b_scales: its 6-D scales
            ``[E, ceil(2D/128), ceil(J/4), 32, 4, 4]``.
        a_scales: 5-D ``[tiles, ceil(J/4), 32, 4, 4]`` with per-group padded row tiles.
        expert_start: ``[G+1]``; a_scale_offsets: ``[G]`` (group g's first tile is
            ``expert_start[g] // 128 + a_scale_offsets[g]``, for the A and the output scales);
            expert_ids: ``[G]``, -1 marks an unused group (zero output).
        expert_scales: float32 ``[E]`` by expert id; None allowed for MX formats (ones).
        input_scales: float32 ``[E]`` raw NVFP4 SiLU-output scales by expert id (the encode
            scale is ``1 / input_scales[e]``); required for NVFP4, None (or ones) for MX.
        fmt: the format; k: logical K (default from hidden).
        activation: ``GatedActivation.SILU`` (default) or ``SWIGLU_OAI``.
        a_row_scales: optional bf16 ``[T]`` (NVFP4 only), applied after the expert scale.
        device: "cuda" | "hip" | "interp" | a Device; None: best available.
        target: the kernel's GPUTarget name; None: the device's.

    Returns:
        ``(data [T, D/2 | D], scales [a_scales.shape[0], ceil(ceil(D/SFV)/4), 32, 4, 4])``.
    """
    fmt = Format.from_name(fmt)
    act = GatedActivation.parse(activation)
    t, e_count, n, k = GM._grouped_dims(hidden, weight, fmt, k)
    if n % 2:
        raise ValueError(f"weight.shape[1] (2D, σ-permuted gate/up rows) must be even, got {n}")
    d = n // 2
    fmt.check_k(d, "weight.shape[1] // 2")
    sfa_shape = GM.check_tcgen_scales(a_scales, b_scales, fmt, e_count, n, k)
    es, offs, ids = GM.group_vectors(expert_start, a_scale_offsets, expert_ids, t, e_count)
    ng = es.shape[0] - 1
    num_tiles = sfa_shape[0]
    QG.check_groups(es, offs, ids, t, num_tiles)
    buffers = {"a": hidden, "w": weight, "sfa": a_scales, "sfb": b_scales, "expert_start": es,
               # empty groups' tile0 moved so that the kernel's tile -> group search holds
               "scales_offsets": QG._i32(QG.search_offsets(es, offs)), "expert_ids": ids,
               "expert_scales": GM.expert_scales_arg(expert_scales, fmt, e_count),
               "input_scales": QG.expert_scales_arg(fmt, input_scales, "input_scales", ids)}
    if a_row_scales is not None:
        GM.check_row_scales(a_row_scales, fmt, t)
        buffers["a_row_scales"] = a_row_scales
    dev, tgt = H.device_and_target(device, target)
    aligned = H.vector_aligned(hidden, weight, a_scales, b_scales)
    if fmt.name == "mxfp8" and t > 0 and \
            chained_mainloop(tgt, fmt, t, n, k, ng, expert_start, aligned=aligned) == "mma":
        return _run_mma(SwigluMmaSpec(fmt.name, tgt, act.kind, float(act.alpha),
                                      float(act.limit)), buffers, t, d, num_tiles, ng, k, dev)
    chain = chained_mainloop(tgt, fmt, t, n, k, ng, expert_start, a_row_scales is not None,
                             aligned) if t > 0 else "portable"
    if chain == "decode":
        from blockscale.ops import matmul_decode as MD

        v = MD.grouped_variant(fmt, k, expert_start, ng)
        chain = "solo" if v in MD.SOLO_VARIANTS else "mx8" if v in MD.MX8_VARIANTS else chain
    if chain in ("wgmma", "solo", "mx8"):
        return _run_chain(chain, buffers, fmt, act, t, n, k, ng, es, offs, ids, num_tiles,
                          a_row_scales is not None, tgt, dev)
    spec = _spec(fmt, tgt, act, a_row_scales is not None, d % 8 == 0)
    return QG.run_grouped(spec, hidden, d, t, num_tiles, buffers,  # type: ignore[arg-type]
                          {"num_groups": ng, "kdim": k}, dev)


def _run_chain(kind: str, buffers: dict[str, Any], fmt: Format, act: GatedActivation, t: int,
               n: int, k: int, num_groups: int, es: Any, offs: Any, ids: Any, num_tiles: int,
               row_scales: bool, target: str, device: Any) -> tuple[Any, Any]:
    """The chained path itself where the chained matmul's kernel does not sum as the
    portable kernel does: ``kind`` "wgmma" (the grouped wgmma fast path: the grouped
    producer-dequant kernel where :func:`~blockscale.ops.matmul_grouped_wgmma.uses_pdq`, else
    the grouped wgmma kernel), "solo" (the one-row decode kernel "mma_c8t1", where every
    group holds one row) or "mx8" (the MXFP8 decode kernel of the dispatch, "mma_x8"), run
    on the σ-permuted weights and stored un-permuted
    (``sigma_out``), then ``fused_silu_quantize``."""
    from blockscale.ops import matmul_decode as MD
    from blockscale.ops import matmul_grouped_pdq as GP
    from blockscale.ops import matmul_grouped_wgmma as GW
    from blockscale.ops.quantize_silu import fused_silu_quantize

    bufs = {name: v for name, v in buffers.items()
            if name not in ("scales_offsets", "input_scales")}
    bufs["a_scale_offsets"] = offs
    scalars = {"t": t, "n": n, "k": k, "num_groups": num_groups}
    if kind in ("solo", "mx8"):
        variant = MD.SOLO_VARIANTS[0] if kind == "solo" else \
            MD.grouped_variant(fmt, k, es, num_groups)
        spec = MD.DecodeSpec(fmt.name, "grouped", "bfloat16", row_scales, target, variant,
                             sigma_out=True)
        gate_up = MD._launch_grouped(spec, t, n, num_groups, bufs, scalars, device)
    elif GW.uses_pdq(fmt):
        pdq = GP.dispatch_plan(fmt, n, row_scales, target, device, sigma_out=True,
                               rows_per_group=t / max(num_groups, 1))
        gate_up = GP.launch(pdq, t, n, num_groups, bufs, scalars, device)
    else:
        spec = GW.spec_for(fmt, t, n, num_groups, row_scales, target, sigma_out=True)
        gate_up = GW.launch(spec, t, n, num_groups, bufs, scalars, device)
    return fused_silu_quantize(gate_up, fmt, es, offs, ids, buffers["input_scales"],
                               activation=act, num_scale_tiles=num_tiles, device=device,
                               target=target)


def _run_mma(spec: SwigluMmaSpec, buffers: dict[str, Any], t: int, d: int, num_tiles: int,
             num_groups: int, k: int, device: Any) -> tuple[Any, Any]:
    """Launch the sm_90a MXFP8 mma kernel; returns (data, scales) like QG.run_grouped."""
    fmt = spec.format
    data_dt, scale_dt = QG.out_dtypes(fmt)
    grid, scalars = mma_launch_plan(d, num_tiles, num_groups, k)
    bufs = {n: v for n, v in buffers.items() if n != "input_scales"}  # MX: no tensor scale
    out = Q.launch(spec, grid, {"data": ((t, d), data_dt),  # type: ignore[arg-type]
                                "scales": ((num_tiles, scalars["kblocks_row"] // 4, 32, 4, 4),
                                           scale_dt)},
                   bufs, scalars, device)
    return out["data"], out["scales"]


# ---- compiled kernels, bundle, graph -----------------------------------------------------------

def kernel(spec_or_fmt: SwigluSpec | SwigluMmaSpec | Format | str, target: str = "sm_90a",
           **fields: Any) -> Any:
    """The compiled Kernel (``.asm[...]``, ``.meta``) of a spec, or of a format plus
    :class:`SwigluSpec` fields. Needs the compiler."""
    spec = spec_or_fmt if isinstance(spec_or_fmt, (SwigluSpec, SwigluMmaSpec)) else SwigluSpec(
        Format.from_name(spec_or_fmt).name, target=target, **fields)
    return H.compile_spec(spec)


def grouped_matmul_swiglu_kernel(fmt: Format | str, target: str = "sm_90a", *,
                                 activation: GatedActivation | str | None = None,
                                 row_scales: bool = False, aligned: bool = True) -> Any:
    """Compiled Kernel behind :func:`grouped_matmul_swiglu` for ``fmt`` on ``target``."""
    return kernel(_spec(Format.from_name(fmt), target, GatedActivation.parse(activation),
                        row_scales, aligned))


def bundle_specs(target: str = "sm_90a") -> list[SwigluSpec | SwigluMmaSpec]:
    """The fused specs the GPU tests and the MoE layer use on ``target``."""
    specs = [_spec(Format.from_name(f), target, act, False, True)
             for f in ("nvfp4", "mxfp4", "mxfp8")
             for act in (GatedActivation.SILU, GatedActivation.SWIGLU_OAI)]
    specs.append(_spec(Format.from_name("nvfp4"), target, GatedActivation.SILU, True, True))
    if target == "sm_90a":
        specs += [SwigluMmaSpec("mxfp8", target, act.kind, float(act.alpha), float(act.limit))
                  for act in (GatedActivation.SILU, GatedActivation.SWIGLU_OAI)]
    return specs


def graph_launches(node: Any, target: str) -> list[tuple[Any, tuple[int, int, int],
                                                          dict[str, Any]]]:
    """Launch plan of a graph ``grouped_matmul_swiglu`` node (see blockscale/graph/plans.py):
    ``[(spec, grid, bindings)]``, empty when the output has no rows or columns."""
    ins = node.inputs
    data, scales = node.outputs
    t, d = ins["a"].shape[0], ins["w"].shape[1] // 2
    if t == 0 or d == 0:
        return []
    rs = ins.get("a_row_scales")
    ng = ins["expert_ids"].shape[0]
    spec = _spec(node.attrs["fmt"], target, node.attrs["activation"], rs is not None,
                 d % 8 == 0)
    grid, scalars = launch_plan(spec, t, d, scales.shape[0], ng, node.attrs["k"])
    bindings: dict[str, Any] = {name: ins[name].name for name in
                                ("a", "w", "sfa", "sfb", "expert_start", "expert_ids",
                                 "expert_scales", "input_scales")}
    bindings["scales_offsets"] = ins["a_scale_offsets"].name
    if rs is not None:
        bindings["a_row_scales"] = rs.name
    bindings.update(data=data.name, scales=scales.name, **scalars)
    return [(spec, grid, bindings)]


_core.attach_kernel_api((grouped_matmul_swiglu,), kernel, build)

__all__ = [
    "SwigluMmaSpec",
    "SwigluSpec",
    "build",
    "bundle_specs",
    "chained_mainloop",
    "graph_launches",
    "grouped_matmul_swiglu",
    "grouped_matmul_swiglu_kernel",
    "kernel",
    "launch_plan",
    "mma_launch_plan",
]
