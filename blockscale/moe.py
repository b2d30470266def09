"""MoE quantization strategies on top of the ops: :class:`NvMxf4f8Strategy` (SEMANTICS §7).

``NvMxf4f8Strategy(config, dtype)`` has every member of MAX's ``max.nn.moe.NvMxf4f8Strategy``
with its contract (§7.1-7.8). Each method works two ways:

* **eagerly** on arrays (numpy in, numpy out), with ``device=``: ``"reference"`` runs the numpy
  reference (:mod:`blockscale.reference`); ``"cuda"``, ``"hip"``, ``"interp"`` or None (best
  available) run the compiled op of :mod:`blockscale.ops`. When the compiled op does not exist
  in this build (its module has not landed, or MLIR is missing and no kernel bundle has it), the
  call falls back to the reference and says so: a warning is logged and
  :attr:`NvMxf4f8Strategy.last_backend` names the backend that ran;
* **inside a** :class:`blockscale.graph.Graph`: when the main tensor argument is a graph
  :class:`~blockscale.graph.Tensor`, the method adds the op to that graph and returns graph
  tensors. Per-expert scale vectors are then numpy constants of the graph.

Decisions that differ from MAX (binding, SEMANTICS): per-expert vectors (``input_scales`` of
``fused_silu_quantize`` included) are indexed by **expert id** (D8), not by group slot.

The MoE layer itself (router, indices, the expert pipeline, combine) is in
:mod:`blockscale.moe_layer` and re-exported here.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from blockscale.activations import GatedActivation
from blockscale.formats import MXFP4, MXFP8, NVFP4, Format

__all__ = [
    "ExpertInputs",
    "GatedActivation",
    "NvMxf4f8Strategy",
    "Nvfp4Scales",
    "PreparedSwigluOperands",
    "QuantConfig",
    "run_op",
]
# also (lazily, from blockscale.moe_layer): MoELayer, MoEWeights, moe_forward,
# moe_forward_reference

log = logging.getLogger("blockscale.moe")

#: the MAX fallback for device-resident usage stats (§7.6): [max tokens per expert, groups]
USAGE_STATS_FALLBACK_MAX_TOKENS = 8192


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """How a MoE block is quantized (the part of MAX's QuantConfig this strategy reads).

    Attributes:
        format: the activation and weight format (:data:`NVFP4`, :data:`MXFP4`, :data:`MXFP8`
            or their names).
        input_scale_field: checkpoint name of the per-tensor activation scale (NVFP4).
        weight_scale_field: checkpoint name of the per-block weight scales.
        weight_scale_2_field: checkpoint name of the per-tensor weight scale (NVFP4).
        can_use_fused_swiglu: use ``grouped_matmul_swiglu`` (σ-permuted gate/up weights) in
            the MoE layer instead of ``grouped_matmul`` + ``fused_silu_quantize``.
    """

    format: Format | str = NVFP4
    input_scale_field: str = "input_scale"
    weight_scale_field: str = "weight_scale"
    weight_scale_2_field: str = "weight_scale_2"
    can_use_fused_swiglu: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", Format.from_name(self.format))
        if not isinstance(self.can_use_fused_swiglu, bool):
            raise TypeError(f"can_use_fused_swiglu must be a bool, got "
                            f"{type(self.can_use_fused_swiglu).__name__}")

    @property
    def fmt(self) -> Format:
        """The :class:`Format` (typed alias of ``format``)."""
        return self.format  # type: ignore[return-value]

    @property
    def is_nvfp4(self) -> bool:
        return self.fmt is NVFP4

    @property
    def is_mxfp4(self) -> bool:
        return self.fmt is MXFP4

    @property
    def is_mxfp8(self) -> bool:
        return self.fmt is MXFP8

    @property
    def activation_dtype(self) -> np.dtype:
        """Storage dtype of quantized activations: uint8 (FP4) or float8_e4m3fn (MXFP8)."""
        return self.fmt.elem_dtype


class ExpertInputs(NamedTuple):
    """The 6-tuple MAX passes as ``expert_inputs`` (§7.5-7.8)."""

    hidden: Any
    hidden_scales: Any
    expert_start: Any
    scales_offsets: Any
    expert_ids: Any
    usage_stats: Any


class PreparedSwigluOperands(NamedTuple):
    """What :meth:`NvMxf4f8Strategy.prepare_swiglu_operands` returns (§7.8).

    ``c_input_scales`` is the *inverted* per-expert SiLU-output scale ``f32(1 / input_scales)``
    (the NVFP4 encode scale, MAX's kernel convention; None for MX formats) and
    ``input_scales`` the raw one (our kernels and reference take it raw and invert it in f32
    themselves, which gives the same value). ``usage_stats_host`` is a host numpy array.
    """

    hidden: Any
    hidden_scales: Any
    expert_start: Any
    scales_offsets: Any
    expert_ids: Any
    usage_stats_host: np.ndarray
    expert_scales: Any
    input_scales: Any
    c_input_scales: Any


class Nvfp4Scales(NamedTuple):
    """The per-expert NVFP4 scalars of a MoE block (§1.4), float32 ``[E]`` each.

    ``gate_up_input`` (activation scale of the gate/up input: one global value broadcast),
    ``down_input`` (activation scale of the down input, per expert), ``gate_up_expert`` and
    ``down_expert`` (epilogue alphas ``weight_scale_2 * input_scale``).
    """

    gate_up_input: np.ndarray
    down_input: np.ndarray
    gate_up_expert: np.ndarray
    down_expert: np.ndarray


# ----------------------------------------------------------------------------- eager dispatch


def _ops_function(name: str) -> Any:
    """``blockscale.ops.<name>`` or None when this build has no such compiled op."""
    try:
        ops = importlib.import_module("blockscale.ops")
    except ImportError:
        return None
    fn = getattr(ops, name, None)
    return fn if callable(fn) else None


def _mlir_or_bundle_available() -> bool:
    try:
        import mlir.ir  # noqa: F401
        return True
    except ImportError:
        from blockscale.ops import _core
        return _core.bundle_dir() is not None


def run_op(name: str, *args: Any, device: Any = None, **kwargs: Any) -> tuple[Any, str]:
    """Run op ``name`` eagerly; returns ``(result, backend)``.

    ``device="reference"`` runs ``blockscale.reference.<name>``. Otherwise the compiled
    ``blockscale.ops.<name>(..., device=device)`` runs; backend is ``"ops:<device>"``. When
    this build has no compiled op of that name (or no compiler and no bundle), the reference
    runs instead, a warning is logged and backend is ``"reference (fallback: <why>)"``.
    """
    from blockscale import reference as ref

    ref_fn = getattr(ref, name, None)
    if ref_fn is None:
        raise ValueError(f"name: no reference op {name!r}")
    if device == "reference":
        return ref_fn(*args, **kwargs), "reference"
    fn = _ops_function(name)
    why = None
    if fn is None:
        why = f"blockscale.ops has no {name}"
    elif not _mlir_or_bundle_available():
        why = "no MLIR compiler and no kernel bundle"
    if why is not None:
        log.warning("%s: compiled op unavailable (%s); running the numpy reference", name, why)
        return ref_fn(*args, **kwargs), f"reference (fallback: {why})"
    result = fn(*args, device=device, **kwargs)
    dev_name = device if isinstance(device, str) else getattr(device, "name", "auto")
    return result, f"ops:{dev_name}"


def _is_graph_tensor(x: Any) -> bool:
    from blockscale.graph import Tensor  # graph imports no mlir at import time

    return isinstance(x, Tensor)


def _host(x: Any) -> np.ndarray:
    """A host numpy copy of an array or device array."""
    if isinstance(x, np.ndarray):
        return x
    to_numpy = getattr(x, "numpy", None)
    if callable(to_numpy):
        return np.asarray(to_numpy())
    return np.asarray(x)


def _invert(v: Any, arg: str) -> np.ndarray:
    """``f32(1 / v)`` of a positive finite per-expert vector (the NVFP4 encode scale)."""
    a = _host(v)
    if a.ndim != 1 or a.dtype.kind not in "fiu":
        raise TypeError(f"{arg} must be a 1-D float array, got dtype {a.dtype}, shape {a.shape}")
    a = a.astype(np.float32)
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{arg} must be finite and > 0, got {a.tolist()[:8]}")
    return (np.float32(1.0) / a).astype(np.float32)


def _unpack(expert_inputs: Any, method: str) -> ExpertInputs:
    if not isinstance(expert_inputs, tuple) or len(expert_inputs) != 6:
        got = len(expert_inputs) if isinstance(expert_inputs, tuple) else type(expert_inputs)
        raise ValueError(f"{method}: expert_inputs must be the 6-tuple (hidden, hidden_scales, "
                         f"expert_start, scales_offsets, expert_ids, usage_stats), got {got}")
    return ExpertInputs(*expert_inputs)


# ----------------------------------------------------------------------------- strategy


class NvMxf4f8Strategy:
    """NVIDIA NVFP4 / MXFP4 / MXFP8 quantization for MoE (MAX's ``NvMxf4f8Strategy``, §7).

    Args:
        config: the :class:`QuantConfig`.
        dtype: the quantized activation storage dtype: uint8 for NVFP4/MXFP4, float8_e4m3fn for
            MXFP8 (ValueError otherwise).

    Every method takes ``device=`` (keyword; see the module docstring) when called eagerly.
    """

    def __init__(self, config: QuantConfig, dtype: Any) -> None:
        if not isinstance(config, QuantConfig):
            raise TypeError(f"config must be a QuantConfig, got {type(config).__name__}")
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"dtype must be a numpy dtype, got {dtype!r}") from None
        if dt != config.activation_dtype:
            raise ValueError(f"dtype must be {config.activation_dtype} for {config.fmt.name}, "
                             f"got {dt}")
        self.config = config
        self.dtype = dt
        #: which backend ran the last eager call ("reference", "ops:interp", ...)
        self.last_backend: str | None = None

    def __repr__(self) -> str:
        return f"NvMxf4f8Strategy({self.config.fmt.name}, dtype={self.dtype})"

    @property
    def fmt(self) -> Format:
        return self.config.fmt

    @property
    def is_nvfp4(self) -> bool:
        """Whether this strategy handles NVFP4 rather than MXFP4 or MXFP8 (§7.1)."""
        return self.config.is_nvfp4

    def _run(self, name: str, *args: Any, device: Any, **kwargs: Any) -> Any:
        result, self.last_backend = run_op(name, *args, device=device, **kwargs)
        return result

    # ---- §7.2
    def quantize(self, tensor: Any, group_size: int) -> tuple[Any, Any]:
        """Not supported: always raises NotImplementedError, as MAX does (§7.2)."""
        raise NotImplementedError(
            "To quantize to NVFP4/MXFP4/MXFP8, use grouped_quantize instead")

    # ---- §7.3
    def grouped_quantize(self, tensor: Any, group_size: int, input_scale: Any,
                         expert_start: Any, scales_offset: Any, expert_ids: Any,
                         indices: Any = None, indices_divisor: int = 1, *,
                         device: Any = None) -> tuple[Any, Any]:
        """Quantize activations per expert with padded scale tiles (§2.5, §7.3).

        ``input_scale`` is the raw per-expert NVFP4 activation scale ``[E]`` (indexed by expert
        id, D8); it is inverted here (``tensor_sf = 1 / input_scale``). Required for NVFP4,
        None for MX formats. ``group_size`` is ignored (the block size comes from the format).
        ``indices`` / ``indices_divisor``: permuted row i reads ``tensor[indices[i] //
        indices_divisor]`` (the MoE gather fused into quantize, D11).

        Returns ``(data [rows, K/2 | K], scales 5-D, padded per expert)``.
        """
        if self.is_nvfp4 and input_scale is None:
            raise ValueError("NVFP4 requires input_scale")
        tensor_sf = _invert(input_scale, "input_scale") if input_scale is not None else None
        if _is_graph_tensor(tensor):
            return tensor.graph.grouped_quantize_dynamic_scaled(
                tensor, self.fmt, expert_start, scales_offset, expert_ids, tensor_sf,
                indices=indices, indices_divisor=indices_divisor)
        return self._run("grouped_quantize_dynamic_scaled", tensor, self.fmt, expert_start,
                         scales_offset, expert_ids, tensor_sf, indices=indices,
                         indices_divisor=indices_divisor, device=device)

    # ---- §7.5
    def fused_silu_quantize(self, gate_up_projs: Any, input_scales: Any = None,
                            expert_inputs: tuple[Any, ...] = (), max_padded_M: int = 0,
                            activation: GatedActivation | None = None, *,
                            device: Any = None) -> tuple[Any, Any]:
        """Apply the gated activation to ``gate_up_projs`` (bf16 ``[T, 2D]``, gate columns then
        up columns) and quantize the result per expert (§7.5, D10).

        ``input_scales``: raw per-expert SiLU-output scales (NVFP4 only; the quantizer uses
        their inverse), indexed by expert id (D8). ``max_padded_M`` is accepted for
        conformance and ignored (it applies to MX EP paths only).
        """
        e = _unpack(expert_inputs, "fused_silu_quantize")
        if self.is_nvfp4 and input_scales is None:
            raise ValueError("NVFP4 requires input_scales")
        act = GatedActivation.parse(activation)
        scales = None if input_scales is None else _host(input_scales).astype(np.float32)
        if _is_graph_tensor(gate_up_projs):
            return gate_up_projs.graph.fused_silu_quantize(
                gate_up_projs, self.fmt, e.expert_start, e.scales_offsets, e.expert_ids,
                scales, activation=act)
        return self._run("fused_silu_quantize", gate_up_projs, self.fmt, e.expert_start,
                         e.scales_offsets, e.expert_ids, scales, activation=act, device=device)

    # ---- §7.6
    def grouped_matmul(self, weight: Any, weight_scales: Any, expert_scales: Any = None,
                       expert_inputs: tuple[Any, ...] = (), estimated_total_m: Any = None,
                       a_scales_max_padded_m: int = 0, *, device: Any = None) -> Any:
        """Grouped block-scaled matmul with per-expert epilogue scales (§5, §7.6).

        ``weight [E, N, K/2 | K]``, ``weight_scales`` 6-D (see :meth:`prepare_weight_scales`),
        ``expert_scales [E]`` (required for NVFP4; None means 1.0 for MX). ``estimated_total_m`` and
        ``a_scales_max_padded_m`` only pick kernel regimes in MAX and are ignored here.
        Returns bf16 ``[rows, N]``.
        """
        e = _unpack(expert_inputs, "grouped_matmul")
        if self.is_nvfp4 and expert_scales is None:
            raise ValueError("NVFP4 requires expert_scales")
        esc = self._expert_scales(expert_scales)
        if _is_graph_tensor(e.hidden):
            return e.hidden.graph.grouped_matmul_block_scaled(
                e.hidden, weight, e.hidden_scales, weight_scales, e.expert_start,
                e.scales_offsets, e.expert_ids, esc)
        k = self._logical_k(e.hidden)
        return self._run("grouped_matmul_block_scaled", e.hidden, weight, e.hidden_scales,
                         weight_scales, e.expert_start, e.scales_offsets, e.expert_ids, esc,
                         self.fmt, k=k, device=device)

    # ---- §7.7
    def grouped_matmul_swiglu(self, weight: Any, weight_scales: Any, *, expert_scales: Any = None,
                              input_scales: Any = None, expert_inputs: tuple[Any, ...],
                              estimated_total_m: Any = None,
                              activation: GatedActivation | None = None,
                              a_row_scales: Any = None, device: Any = None) -> tuple[Any, Any]:
        """Fused grouped matmul + gated activation + quantize (§6, §7.7).

        ``weight`` / ``weight_scales`` are σ-permuted (row 2i = gate i, row 2i+1 = up i; see
        :func:`blockscale.reference.sigma_permute_rows`). Byte-identical to
        :meth:`grouped_matmul` on the un-permuted weights followed by
        :meth:`fused_silu_quantize` (D10). ``a_row_scales``: bf16 ``[T]``, NVFP4 only.
        Eagerly with a device (``"cuda"``, ``"hip"``, ``"interp"`` or None) this is one kernel,
        :func:`blockscale.ops.grouped_matmul_swiglu`; in a graph, one launch of it.
        Returns ``(data [T, D/2 | D], scales 5-D)``.
        """
        if a_row_scales is not None and not self.is_nvfp4:
            raise ValueError(f"a_row_scales is NVFP4 only, got format {self.fmt.name}")
        p = self.prepare_swiglu_operands(expert_inputs, expert_scales=expert_scales,
                                         input_scales=input_scales)
        act = GatedActivation.parse(activation)
        if _is_graph_tensor(p.hidden):
            return p.hidden.graph.grouped_matmul_swiglu(
                p.hidden, weight, p.hidden_scales, weight_scales, p.expert_start,
                p.scales_offsets, p.expert_ids, p.expert_scales, p.input_scales,
                activation=act, a_row_scales=a_row_scales)
        k = self._logical_k(p.hidden)
        return self._run("grouped_matmul_swiglu", p.hidden, weight, p.hidden_scales,
                         weight_scales, p.expert_start, p.scales_offsets, p.expert_ids,
                         p.expert_scales, p.input_scales, self.fmt, k=k, activation=act,
                         a_row_scales=a_row_scales, device=device)

    # ---- §7.8
    def prepare_swiglu_operands(self, expert_inputs: tuple[Any, ...], *,
                                expert_scales: Any = None,
                                input_scales: Any = None) -> PreparedSwigluOperands:
        """Normalize the operands every fused-SwiGLU call needs (§7.8).

        The two derivations that are easy to get wrong live here and only here: the
        per-expert SiLU-output scale is **inverted** (``c_input_scales = f32(1 /
        input_scales)``), and the usage stats are made **host-resident** (a numpy array; a
        device array is copied to the host). Raises ValueError when NVFP4 lacks
        ``expert_scales`` or ``input_scales``.
        """
        e = _unpack(expert_inputs, "prepare_swiglu_operands")
        if self.is_nvfp4:
            if input_scales is None:
                raise ValueError("NVFP4 requires input_scales")
            if expert_scales is None:
                raise ValueError("NVFP4 requires expert_scales")
        raw = None if input_scales is None else _host(input_scales).astype(np.float32)
        inverted = None if input_scales is None else _invert(input_scales, "input_scales")
        if e.usage_stats is None or _is_graph_tensor(e.usage_stats):
            groups = len(_host(e.expert_ids)) if not _is_graph_tensor(e.expert_ids) \
                else e.expert_ids.shape[0]
            usage = np.array([USAGE_STATS_FALLBACK_MAX_TOKENS, groups], dtype=np.uint32)
        else:
            usage = _host(e.usage_stats).astype(np.uint32)
        esc = self._expert_scales(expert_scales)
        return PreparedSwigluOperands(e.hidden, e.hidden_scales, e.expert_start,
                                      e.scales_offsets, e.expert_ids, usage, esc, raw, inverted)

    # ---- §7.4
    def prepare_weight_scales(self, gate_up: Any, down: Any, device: Any = None
                              ) -> tuple[Any, Any]:
        """Interleave rank-3 weight block scales ``[E, rows, K/SFV]`` into the 6-D kernel
        layout ``[E, ceil(rows/128), ceil(K/SFV/4), 32, 4, 4]``, expert by expert (§7.4).

        ``device``: where the interleave runs (as for every eager method; "reference" for
        numpy). Raises ValueError for scales that are not rank 3.
        """
        return (self._interleave_experts(gate_up, "gate_up", device),
                self._interleave_experts(down, "down", device))

    # ---- helpers
    def _interleave_experts(self, scales: Any, arg: str, device: Any) -> Any:
        shape = tuple(getattr(scales, "shape", ()))
        if len(shape) != 3:
            raise ValueError(f"{arg}: expected block scales of rank 3 [E, rows, K/SFV], got "
                             f"shape {shape}")
        want = self.fmt.scale_dtype
        if np.dtype(scales.dtype) != want:
            raise TypeError(f"{arg}: expected dtype {want} for {self.fmt.name}, got "
                            f"{scales.dtype}")
        if _is_graph_tensor(scales):
            raise TypeError(f"{arg}: weight scales are interleaved eagerly, once, before the "
                            "graph is built; pass a numpy array")
        per_expert = [self._run("block_scales_interleave", np.ascontiguousarray(scales[i]),
                                device=device) for i in range(shape[0])]
        return np.stack([_host(p) for p in per_expert])

    def _expert_scales(self, expert_scales: Any) -> np.ndarray | None:
        """float32 ``[E]`` per-expert epilogue scales, or None (MX formats: all 1.0)."""
        if expert_scales is None:
            return None
        a = _host(expert_scales)
        if a.ndim != 1:
            raise ValueError(f"expert_scales must be 1-D [E], got shape {a.shape}")
        return a.astype(np.float32)

    def _logical_k(self, hidden: Any) -> int:
        cols = int(hidden.shape[1])
        return 2 * cols if self.fmt.is_fp4 else cols


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (RNE)."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)


def __getattr__(name: str) -> Any:
    if name in ("MoELayer", "MoEWeights", "moe_forward", "moe_forward_reference"):
        from blockscale import moe_layer

        return getattr(moe_layer, name)
    raise AttributeError(f"module 'blockscale.moe' has no attribute {name!r}")
