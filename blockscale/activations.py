"""Gated activations of the fused SwiGLU path (SEMANTICS D10, §6, §7.9)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

# ---- exp_f32: the one float32 exp of every implementation ---------------------------------------
#
# Constants of exp_f32 (exact float32 values, written in hex). The kernels' IR mirror
# (blockscale/ops/_expf_ir.py) takes them from here.
EXP_LO = -104.0  # below: exp < 2^-150, rounds to +0 (so does exp(-104))
EXP_HI = 89.0  # above: exp > 2^128, overflows to +inf (so does exp(89))
EXP_LOG2E = float.fromhex("0x1.715476p+0")  # f32(1 / ln 2)
EXP_MAGIC = 12582912.0  # 1.5 * 2^23: adding it rounds to an integer (RNE); bits 0x4B400000
EXP_MAGIC_BITS = 0x4B400000
EXP_LN2_HI = float.fromhex("0x1.62e4p-1")  # ln 2 to 16 bits: k * LN2_HI is exact for |k| < 256
EXP_LN2_LO = float.fromhex("0x1.7f7d1cp-20")  # f32(ln 2 - LN2_HI)
#: q(r) = c0 + c1 r + ... + c5 r^5 with exp(r) ~ 1 + r + r^2 q(r) on |r| <= ln2/2 (a weighted
#: least-squares fit, coefficients rounded to float32; approximation error < 2^-29 relative).
EXP_POLY = tuple(float.fromhex(h) for h in (
    "0x1p-1", "0x1.555554p-3", "0x1.555478p-5", "0x1.1111eap-7", "0x1.6d9dd4p-10",
    "0x1.9fc8bep-13"))


def exp_f32(x: np.ndarray) -> np.ndarray:
    """blockscale's float32 ``exp``, defined as this exact sequence of operations (D10).

    Every step is one IEEE-754 binary32 operation rounded to nearest-even (mul, add, sub,
    min / max) or an exact integer / bit operation, so any implementation that performs the same
    steps (numpy here, the interpreter, the kernels' ``arith`` ops on every GPU target, which
    must not contract mul + add into fma) produces the same bits::

        xc = min(max(x, -104), 89)                 # NaN propagates (IEEE minimum / maximum)
        t  = xc * LOG2E + MAGIC                    # two roundings: t = 1.5 * 2^23 + k
        kf = t - MAGIC                             # exact: k as float
        k  = bits(t) - 0x4B400000                  # k as int32, |k| <= 150
        r  = (xc - kf * LN2_HI) - kf * LN2_LO      # first product and difference exact
        q  = ((((c5 * r + c4) * r + c3) * r + c2) * r + c1) * r + c0
        e  = 1 + (r + (r * r) * q)
        k1 = k >> 1 (arithmetic); k2 = k - k1      # both in [-75, 64]
        exp_f32(x) = (e * 2^k1) * 2^k2             # 2^k from bits (k + 127) << 23

    Accuracy (checked exhaustively over all float32 inputs with a normal result): error below
    1 ulp (max 0.957 ulp), i.e. faithfully rounded; results in the subnormal range round once
    more (to within 1 subnormal ulp + 2^-24 relative); ``exp_f32(+inf) = +inf``,
    ``exp_f32(-inf) = +0``, ``exp_f32(NaN)`` is NaN (payload unspecified). It is correctly
    rounded for ~90% of inputs; it is neither numpy's float32 ``np.exp`` (a SIMD routine chosen
    by the CPU's instruction set, correctly rounded for only ~60% of inputs, differing from
    exp_f32 in ~40%) nor CUDA's ``expf`` (libdevice, <= 2 ulp) nor AMD's ocml exp: the point is
    that every implementation agrees bit for bit, including the fused SwiGLU kernels' sigmoid.
    """
    f = np.float32
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        xc = np.minimum(np.maximum(x, f(EXP_LO)), f(EXP_HI))
        t = xc * f(EXP_LOG2E) + f(EXP_MAGIC)
        kf = t - f(EXP_MAGIC)
        k = np.asarray(t).view(np.int32) - np.int32(EXP_MAGIC_BITS)
        r = (xc - kf * f(EXP_LN2_HI)) - kf * f(EXP_LN2_LO)
        q = f(EXP_POLY[-1])
        for c in EXP_POLY[-2::-1]:
            q = q * r + f(c)
        e = f(1.0) + (r + (r * r) * q)
        k1 = k >> np.int32(1)
        k2 = k - k1
        s1 = np.asarray((k1 + np.int32(127)) << np.int32(23)).view(np.float32)
        s2 = np.asarray((k2 + np.int32(127)) << np.int32(23)).view(np.float32)
        return np.asarray((e * s1) * s2, dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class GatedActivation:
    """A gated activation ``z = act(gate, up)``, evaluated in float32 (D10).

    ``GatedActivation.SILU``: ``z = (g * sigmoid(g)) * u``.
    ``GatedActivation.SWIGLU_OAI`` (alpha=1.702, limit=7.0, gpt-oss):
    ``g' = min(g, L)``, ``u' = clip(u, -L, L)``, ``z = ((u' + 1) * g') * sigmoid(alpha * g')``.
    ``GatedActivation.swiglu_oai(alpha, limit)`` builds other clamped variants.

    ``sigmoid(v) = 1 / (1 + exp_f32(-v))`` with IEEE float32 division, where :func:`exp_f32`
    is blockscale's own float32 exp (a fixed sequence of IEEE float32 mul / add and integer bit
    operations, < 1 ulp from the true exp): the kernels emit the same sequence, so every target
    and the interpreter compute the same bits (docs/internals.md, "Decision: exp"). Every
    intermediate is rounded to float32 in the order written above.
    """

    kind: str  # "silu" | "swiglu_oai"
    alpha: float = 1.0
    limit: float = math.inf

    SILU: ClassVar[GatedActivation]
    SWIGLU_OAI: ClassVar[GatedActivation]

    def __post_init__(self) -> None:
        if self.kind not in ("silu", "swiglu_oai"):
            raise ValueError(f"kind must be 'silu' or 'swiglu_oai', got {self.kind!r}")
        if self.kind == "silu" and (self.alpha != 1.0 or self.limit != math.inf):
            raise ValueError(f"silu takes no alpha/limit, got alpha={self.alpha}, "
                             f"limit={self.limit}")
        if self.kind == "swiglu_oai":
            for name in ("alpha", "limit"):
                v = getattr(self, name)
                if not isinstance(v, (int, float)) or not math.isfinite(v) or v == 0:
                    raise ValueError(f"{name} must be a finite non-zero number, got {v!r}")
            if self.limit < 0:
                raise ValueError(f"limit must be > 0, got {self.limit}")

    @staticmethod
    def swiglu_oai(alpha: float = 1.702, limit: float = 7.0) -> GatedActivation:
        """The OAI-clamped SwiGLU with the given alpha and limit."""
        return GatedActivation("swiglu_oai", float(alpha), float(limit))

    @staticmethod
    def parse(value: GatedActivation | str | None) -> GatedActivation:
        """An activation from itself, None (SILU) or "silu" / "swiglu_oai"."""
        if value is None:
            return GatedActivation.SILU
        if isinstance(value, GatedActivation):
            return value
        if isinstance(value, str) and value.lower() in ("silu", "swiglu_oai"):
            return GatedActivation.SILU if value.lower() == "silu" else GatedActivation.SWIGLU_OAI
        raise ValueError(f"activation must be a GatedActivation, 'silu' or 'swiglu_oai', "
                         f"got {value!r}")

    def __call__(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """Apply to float32 arrays ``gate`` and ``up`` of the same shape; returns float32."""
        g = np.asarray(gate, dtype=np.float32)
        u = np.asarray(up, dtype=np.float32)
        if g.shape != u.shape:
            raise ValueError(f"gate and up must have the same shape, got {g.shape} and {u.shape}")
        one = np.float32(1.0)
        with np.errstate(over="ignore"):
            if self.kind == "silu":
                return (g * (one / (one + exp_f32(-g)))) * u
            lim = np.float32(self.limit)
            g2 = np.minimum(g, lim)
            u2 = np.clip(u, -lim, lim)
            sig = one / (one + exp_f32(-(np.float32(self.alpha) * g2)))
            return ((u2 + one) * g2) * sig


GatedActivation.SILU = GatedActivation("silu")
GatedActivation.SWIGLU_OAI = GatedActivation.swiglu_oai(1.702, 7.0)
