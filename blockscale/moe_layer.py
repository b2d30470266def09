"""An end-to-end block-scaled MoE layer on :class:`~blockscale.moe.NvMxf4f8Strategy` (§7.10).

Forward pass (non-EP, as MAX's ``MoEQuantized``)::

    router top-k  ->  moe_create_indices (token_order, expert_start, restore_order, expert_ids,
                                          usage_stats, scales_offset)
    grouped_quantize(x, indices=token_order, indices_divisor=top_k)        (gather fused)
    grouped_matmul(gate_up)  ->  fused_silu_quantize      or   grouped_matmul_swiglu (fused)
    grouped_matmul(down)
    un-permute with restore_order and combine with the router weights (float32, k in order)

Routing, ``moe_create_indices`` and the final combine run on the host in numpy (blockscale has
no kernels for them); the four expert steps run through the strategy, i.e. through the compiled
ops (or the reference, ``device="reference"``), or inside a :class:`~blockscale.graph.Graph`
(:meth:`MoELayer.expert_graph`).

NVFP4 scales follow the ModelOpt convention (§1.4): ``input_scale = amax / (448 * 6)`` from a
calibration batch (one global gate/up input scale, per-expert down input scales),
``weight_scale_2 = amax(W_e) / (448 * 6)`` per expert, epilogue alphas
``weight_scale_2 * input_scale``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from blockscale.activations import GatedActivation
from blockscale.formats import Format
from blockscale.layouts import ROW_MAJOR
from blockscale.moe import ExpertInputs, Nvfp4Scales, NvMxf4f8Strategy, QuantConfig

__all__ = [
    "MoEIndices",
    "MoELayer",
    "MoEWeights",
    "QuantizedExperts",
    "combine_experts",
    "moe_forward",
    "moe_forward_reference",
    "quantize_experts",
    "route_top_k",
]

_NVFP4_GLOBAL = np.float32(448.0 * 6.0)


@dataclasses.dataclass(frozen=True)
class MoEWeights:
    """The unquantized weights of a MoE block.

    Attributes:
        router: float32 ``[H, E]``.
        gate_up: bfloat16 ``[E, 2D, H]``: gate rows ``[0, D)`` then up rows ``[D, 2D)``.
        down: bfloat16 ``[E, H, D]``.
    """

    router: np.ndarray
    gate_up: np.ndarray
    down: np.ndarray

    def __post_init__(self) -> None:
        if self.gate_up.ndim != 3 or self.down.ndim != 3 or self.router.ndim != 2:
            raise ValueError(f"expected router [H, E], gate_up [E, 2D, H], down [E, H, D]; got "
                             f"{self.router.shape}, {self.gate_up.shape}, {self.down.shape}")
        e, two_d, h = self.gate_up.shape
        if two_d % 2 or self.down.shape != (e, h, two_d // 2) or self.router.shape != (h, e):
            raise ValueError(f"inconsistent shapes: router {self.router.shape}, gate_up "
                             f"{self.gate_up.shape}, down {self.down.shape}")

    @property
    def num_experts(self) -> int:
        return self.gate_up.shape[0]

    @property
    def hidden(self) -> int:
        return self.gate_up.shape[2]

    @property
    def moe_dim(self) -> int:
        return self.gate_up.shape[1] // 2

    @staticmethod
    def random(hidden: int, moe_dim: int, num_experts: int, seed: int = 0) -> MoEWeights:
        """Gaussian weights scaled by 1/sqrt(fan-in), stored in bfloat16 (router float32)."""
        rng = np.random.default_rng(seed)
        bf = ml_dtypes.bfloat16
        return MoEWeights(
            router=(rng.standard_normal((hidden, num_experts)) / np.sqrt(hidden)
                    ).astype(np.float32),
            gate_up=(rng.standard_normal((num_experts, 2 * moe_dim, hidden)) / np.sqrt(hidden)
                     ).astype(bf),
            down=(rng.standard_normal((num_experts, hidden, moe_dim)) / np.sqrt(moe_dim)
                  ).astype(bf))


@dataclasses.dataclass(frozen=True)
class QuantizedExperts:
    """Expert weights quantized with row-major (rank-3) block scales, as a checkpoint holds them.

    ``*_ws2``: per-expert NVFP4 weight tensor scales (``weight_scale_2``; ones for MX).
    """

    fmt: Format
    gate_up: np.ndarray
    gate_up_scales: np.ndarray
    gate_up_ws2: np.ndarray
    down: np.ndarray
    down_scales: np.ndarray
    down_ws2: np.ndarray


class MoEIndices(NamedTuple):
    """The outputs of ``moe_create_indices`` (§7.10)."""

    token_order: np.ndarray
    expert_start: np.ndarray
    restore_order: np.ndarray
    expert_ids: np.ndarray
    usage_stats: np.ndarray
    scales_offset: np.ndarray


def _amax(a: np.ndarray) -> np.float32:
    return np.float32(np.max(np.abs(np.asarray(a, dtype=np.float32)), initial=0.0))


def _weight_ws2(w: np.ndarray) -> np.float32:
    amax = _amax(w)
    return np.float32(amax / _NVFP4_GLOBAL) if amax > 0 else np.float32(1.0)


def quantize_experts(weights: MoEWeights, fmt: Format | str) -> QuantizedExperts:
    """Quantize every expert's gate/up and down weights (reference quantizer, row-major
    scales; NVFP4 with ``tensor_sf = 1 / weight_scale_2``)."""
    from blockscale import reference as ref

    fmt = Format.from_name(fmt)

    def one(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        data, scales, ws2 = [], [], []
        for w in stack:
            s2 = np.float32(1.0) if fmt.is_mx else _weight_ws2(w)
            d, sc = ref.quantize_dynamic_block_scaled(w, fmt, tensor_sf=float(np.float32(1) / s2),
                                                      scale_layout=ROW_MAJOR)
            data.append(d)
            scales.append(sc)
            ws2.append(s2)
        return np.stack(data), np.stack(scales), np.array(ws2, dtype=np.float32)

    gu, gus, gws = one(weights.gate_up)
    dn, dns, dws = one(weights.down)
    return QuantizedExperts(fmt, gu, gus, gws, dn, dns, dws)


def dequantize_experts(q: QuantizedExperts) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``(gate_up [E, 2D, H], down [E, H, D])`` that the quantized weights encode."""
    from blockscale import reference as ref

    def one(data: np.ndarray, scales: np.ndarray, ws2: np.ndarray, k: int) -> np.ndarray:
        return np.stack([
            ref.dequantize_block_scaled(data[e], scales[e], q.fmt, k=k,
                                        tensor_sf=1.0 if q.fmt.is_mx
                                        else float(np.float32(1) / ws2[e]),
                                        scale_layout=ROW_MAJOR)
            for e in range(data.shape[0])])

    h = q.gate_up.shape[2] * (2 if q.fmt.is_fp4 else 1)
    d = q.down.shape[2] * (2 if q.fmt.is_fp4 else 1)
    return one(q.gate_up, q.gate_up_scales, q.gate_up_ws2, h), \
        one(q.down, q.down_scales, q.down_ws2, d)


def route_top_k(x: np.ndarray, router: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Router: float32 softmax over ``x @ router``, the ``top_k`` largest (ties: lower expert
    id first), weights renormalised over the chosen experts. Returns ``(ids int32 [T, k],
    weights float32 [T, k])``."""
    logits = np.asarray(x, dtype=np.float32) @ router.astype(np.float32)
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs = probs / probs.sum(axis=1, keepdims=True)
    ids = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    w = np.take_along_axis(probs, ids, axis=1)
    w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
    return ids.astype(np.int32), w


def combine_experts(y: np.ndarray, restore_order: np.ndarray, topk_weights: np.ndarray
                    ) -> np.ndarray:
    """Un-permute ``y [T*k, H]`` (rows in expert order) with ``restore_order`` and sum the k
    expert outputs of each token weighted by ``topk_weights [T, k]``, in float32 in k order;
    returns bfloat16 ``[T, H]``."""
    t, k = topk_weights.shape
    flat = np.asarray(y, dtype=np.float32)[np.asarray(restore_order)].reshape(t, k, -1)
    out = np.zeros((t, flat.shape[2]), dtype=np.float32)
    for j in range(k):
        out += topk_weights[:, j:j + 1].astype(np.float32) * flat[:, j]
    return out.astype(ml_dtypes.bfloat16)


class MoELayer:
    """A block-scaled MoE layer (NVFP4, MXFP4 or MXFP8) driven by :class:`NvMxf4f8Strategy`.

    Args:
        weights: the unquantized :class:`MoEWeights` (quantized here, once).
        config: the :class:`QuantConfig` (``can_use_fused_swiglu`` picks the fused path).
        top_k: experts per token.
        calibration: a bf16 ``[T, H]`` batch to derive the NVFP4 input scales from (required
            for NVFP4, ignored for MX formats).
        activation: the gated activation (default SiLU).
    """

    def __init__(self, weights: MoEWeights, config: QuantConfig, top_k: int, *,
                 calibration: np.ndarray | None = None,
                 activation: GatedActivation | str | None = None) -> None:
        from blockscale import reference as ref

        if not isinstance(weights, MoEWeights):
            raise TypeError(f"weights must be MoEWeights, got {type(weights).__name__}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) \
                or not 1 <= top_k <= weights.num_experts:
            raise ValueError(f"top_k must be an int in [1, {weights.num_experts}], got {top_k!r}")
        self.weights = weights
        self.config = config
        self.top_k = top_k
        self.activation = GatedActivation.parse(activation)
        self.strategy = NvMxf4f8Strategy(config, config.activation_dtype)
        self.quantized = quantize_experts(weights, config.fmt)
        self.dequantized = dequantize_experts(self.quantized)
        q = self.quantized
        self.scales: Nvfp4Scales | None = None
        if config.is_nvfp4:
            if calibration is None:
                raise ValueError("calibration: NVFP4 needs a calibration batch [T, H] to derive "
                                 "its input scales, got None")
            self.scales = self._calibrate(calibration)
        # kernel-layout (6-D) weight scales, interleaved once with the reference (host)
        self.gate_up_scales_6d, self.down_scales_6d = self.strategy.prepare_weight_scales(
            q.gate_up_scales, q.down_scales, "reference")
        # σ-permuted gate/up weights for the fused SwiGLU (permute rank-3 scales, then
        # interleave, as MAX's gate_up_proj_scales does)
        self.gate_up_sigma = ref.sigma_permute_rows(q.gate_up)
        self.gate_up_sigma_scales_6d, _ = self.strategy.prepare_weight_scales(
            ref.sigma_permute_rows(q.gate_up_scales), q.down_scales, "reference")

    # ---- calibration
    def _calibrate(self, x: np.ndarray) -> Nvfp4Scales:
        e = self.weights.num_experts
        q = self.quantized
        gate_up_input = np.full(e, max(_amax(x), np.float32(1e-30)) / _NVFP4_GLOBAL,
                                dtype=np.float32)
        ids, _ = route_top_k(x, self.weights.router, self.top_k)
        gu, _ = self.dequantized
        d = self.weights.moe_dim
        xf = np.asarray(x, dtype=np.float32)
        amax = np.zeros(e, dtype=np.float32)
        for ex in range(e):
            rows = np.flatnonzero((ids == ex).any(axis=1))
            if rows.size:
                h = xf[rows] @ gu[ex].T
                amax[ex] = _amax(self.activation(h[:, :d], h[:, d:]))
        fallback = amax.max() if amax.max() > 0 else np.float32(1.0)
        amax = np.where(amax > 0, amax, fallback).astype(np.float32)
        down_input = (amax / _NVFP4_GLOBAL).astype(np.float32)
        return Nvfp4Scales(gate_up_input, down_input,
                           (q.gate_up_ws2 * gate_up_input).astype(np.float32),
                           (q.down_ws2 * down_input).astype(np.float32))

    # ---- pieces of the forward pass
    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(topk_ids int32 [T, k], topk_weights float32 [T, k])``."""
        return route_top_k(x, self.weights.router, self.top_k)

    def indices(self, topk_ids: np.ndarray) -> MoEIndices:
        """``moe_create_indices`` of the routed experts (host, reference)."""
        from blockscale import reference as ref

        return MoEIndices(*ref.moe_create_indices(topk_ids.reshape(-1),
                                                  self.weights.num_experts))

    def _check_x(self, x: Any) -> None:
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) != 2 or shape[1] != self.weights.hidden:
            raise ValueError(f"x must have shape [T, {self.weights.hidden}], got {shape}")
        if np.dtype(x.dtype) != np.dtype(ml_dtypes.bfloat16):
            raise TypeError(f"x must be bfloat16, got {x.dtype}")

    def experts(self, x: Any, idx: MoEIndices, *, device: Any = None,
                fused: bool | None = None, operands: dict[str, Any] | None = None) -> Any:
        """The expert pipeline: ``y [T*k, H]`` bf16 in expert (permuted) row order.

        ``x`` is a numpy array (eager: ``device`` as in :mod:`blockscale.moe`) or a graph
        tensor (the ops are added to its graph; then ``idx`` holds graph tensors too).
        ``fused``: default ``config.can_use_fused_swiglu``. ``operands`` overrides the weight
        operands (keys of :meth:`weight_operands`), e.g. with named graph constants.
        """
        s = self.strategy
        sc = self.scales
        fused = self.config.can_use_fused_swiglu if fused is None else fused
        w = {**self.weight_operands(), **(operands or {})}
        if fused and self.config.is_mxfp4:
            raise ValueError("fused: the fused SwiGLU supports NVFP4 and MXFP8 only (§6), "
                             "got mxfp4")
        kw: dict[str, Any] = {} if _is_graph(x) else {"device": device}
        hidden, hidden_scales = s.grouped_quantize(
            x, self.config.fmt.block_size, sc.gate_up_input if sc else None, idx.expert_start,
            idx.scales_offset, idx.expert_ids, indices=idx.token_order,
            indices_divisor=self.top_k, **kw)
        inputs = ExpertInputs(hidden, hidden_scales, idx.expert_start, idx.scales_offset,
                              idx.expert_ids, idx.usage_stats)
        if fused:
            h, h_scales = s.grouped_matmul_swiglu(
                w["gate_up_sigma"], w["gate_up_sigma_scales"],
                expert_scales=sc.gate_up_expert if sc else None,
                input_scales=sc.down_input if sc else None, expert_inputs=tuple(inputs),
                activation=self.activation, **kw)
        else:
            gate_up = s.grouped_matmul(w["gate_up"], w["gate_up_scales"],
                                       sc.gate_up_expert if sc else None, tuple(inputs), **kw)
            h, h_scales = s.fused_silu_quantize(gate_up, sc.down_input if sc else None,
                                                tuple(inputs), activation=self.activation,
                                                **kw)
        down_inputs = inputs._replace(hidden=h, hidden_scales=h_scales)
        return s.grouped_matmul(w["down"], w["down_scales"], sc.down_expert if sc else None,
                                tuple(down_inputs), **kw)

    def weight_operands(self) -> dict[str, np.ndarray]:
        """The quantized weight operands of the expert matmuls (6-D scales)."""
        q = self.quantized
        return {"gate_up": q.gate_up, "gate_up_scales": self.gate_up_scales_6d,
                "gate_up_sigma": self.gate_up_sigma,
                "gate_up_sigma_scales": self.gate_up_sigma_scales_6d,
                "down": q.down, "down_scales": self.down_scales_6d}

    def forward(self, x: np.ndarray, *, device: Any = None, fused: bool | None = None
                ) -> np.ndarray:
        """bf16 ``[T, H]`` output for bf16 ``x [T, H]`` (eager; see :meth:`experts`)."""
        self._check_x(x)
        ids, w = self.route(x)
        idx = self.indices(ids)
        y = self.experts(x, idx, device=device, fused=fused)
        return combine_experts(np.asarray(y), idx.restore_order, w)

    __call__ = forward

    def expert_graph(self, num_tokens: int, *, fused: bool | None = None,
                     name: str = "moe_experts") -> Any:
        """A :class:`~blockscale.graph.Graph` of the expert pipeline for ``num_tokens`` tokens.

        Graph inputs: ``x`` (bf16 ``[T, H]``) and the index tensors ``token_order``,
        ``expert_start``, ``scales_offset``, ``expert_ids`` (int32, from :meth:`indices`);
        the quantized weights are graph inputs too (see :meth:`graph_inputs`). Output ``y``
        (bf16 ``[T*k, H]``, expert row order).
        """
        from blockscale.graph import Graph

        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
        e, h = self.weights.num_experts, self.weights.hidden
        rows = num_tokens * self.top_k
        g = Graph(name)
        x = g.input("x", (num_tokens, h), "bfloat16")
        idx = MoEIndices(g.input("token_order", (rows,), "int32"),
                         g.input("expert_start", (e + 1,), "int32"),
                         None, g.input("expert_ids", (e,), "int32"), None,
                         g.input("scales_offset", (e,), "int32"))
        fmt, d = self.config.fmt, self.weights.moe_dim
        layout = "tcgen5d"
        use_fused = self.config.can_use_fused_swiglu if fused is None else fused
        operands = {}
        for key, arr in self.weight_operands().items():
            if key.startswith("gate_up") and ("sigma" in key) != use_fused:
                continue
            kk = d if key.startswith("down") else h
            typing = {"fmt": fmt, "k": kk}
            if key.endswith("scales"):
                typing["layout"] = layout
            operands[key] = g.constant(arr, key, **typing)
        y = self.experts(x, idx, fused=fused, operands=operands)
        g.output(y, "y")
        return g

    def graph_inputs(self, x: np.ndarray, idx: MoEIndices) -> dict[str, np.ndarray]:
        """The input arrays of :meth:`expert_graph` for ``x`` and its indices."""
        return {"x": x, "token_order": idx.token_order.astype(np.int32),
                "expert_start": idx.expert_start.astype(np.int32),
                "expert_ids": idx.expert_ids.astype(np.int32),
                "scales_offset": idx.scales_offset.astype(np.int32)}


def _is_graph(x: Any) -> bool:
    from blockscale.graph import Tensor

    return isinstance(x, Tensor)


def moe_forward(layer: MoELayer, x: np.ndarray, *, device: Any = None,
                fused: bool | None = None) -> np.ndarray:
    """``layer.forward(x, device=device, fused=fused)``."""
    return layer.forward(x, device=device, fused=fused)


def moe_forward_reference(layer: MoELayer, x: np.ndarray, *, activation_qdq: bool = True
                          ) -> np.ndarray:
    """The float64 reference of the layer: the same routing, the *dequantized* expert weights
    (the model's weights are the quantized ones), float64 matmuls, activation and combine, no
    bf16 rounding anywhere. float64 ``[T, H]``.

    ``activation_qdq=True`` (as MAX's MoE test reference does) quantizes and dequantizes the
    two activations the kernels quantize (the expert input with the gate/up input scale, the
    SiLU output with the expert's down input scale) with the numpy reference quantizer;
    ``False`` leaves activations unquantized (then FP4 activation noise dominates: one NVFP4
    round trip of Gaussian data alone has cosine ~0.995).
    """
    from blockscale import reference as ref

    ids, w = layer.route(x)
    gu, dn = (a.astype(np.float64) for a in layer.dequantized)
    d = layer.weights.moe_dim
    fmt = layer.config.fmt
    sc = layer.scales

    def qdq(v: np.ndarray, scale: np.float32 | None) -> np.ndarray:
        if not activation_qdq or v.shape[0] == 0:
            return v
        tsf = 1.0 if scale is None else float(np.float32(1) / np.float32(scale))
        data, s = ref.quantize_dynamic_block_scaled(v.astype(np.float32), fmt, tensor_sf=tsf,
                                                    scale_layout=ROW_MAJOR)
        return ref.dequantize_block_scaled(data, s, fmt, k=v.shape[1], tensor_sf=tsf,
                                           scale_layout=ROW_MAJOR).astype(np.float64)

    xf = np.asarray(x, dtype=np.float32)
    out = np.zeros((xf.shape[0], layer.weights.hidden), dtype=np.float64)
    act = layer.activation
    for j in range(layer.top_k):
        for ex in np.unique(ids[:, j]):
            rows = np.flatnonzero(ids[:, j] == ex)
            a = qdq(xf[rows], sc.gate_up_input[ex] if sc else None).astype(np.float64)
            hcat = a @ gu[ex].T
            g, u = hcat[:, :d], hcat[:, d:]
            if act.kind == "silu":
                z = g / (1.0 + np.exp(-g)) * u
            else:
                g2 = np.minimum(g, act.limit)
                u2 = np.clip(u, -act.limit, act.limit)
                z = (u2 + 1.0) * g2 / (1.0 + np.exp(-act.alpha * g2))
            z = qdq(z, sc.down_input[ex] if sc else None)
            out[rows] += w[rows, j:j + 1].astype(np.float64) * (z @ dn[ex].T)
    return out
