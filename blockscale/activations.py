"""Gated activations of the fused SwiGLU path (SEMANTICS D10, §6, §7.9)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np


@dataclasses.dataclass(frozen=True)
class GatedActivation:
    """A gated activation ``z = act(gate, up)``, evaluated in float32 (D10).

    ``GatedActivation.SILU``: ``z = (g * sigmoid(g)) * u``.
    ``GatedActivation.SWIGLU_OAI`` (alpha=1.702, limit=7.0, gpt-oss):
    ``g' = min(g, L)``, ``u' = clip(u, -L, L)``, ``z = ((u' + 1) * g') * sigmoid(alpha * g')``.
    ``GatedActivation.swiglu_oai(alpha, limit)`` builds other clamped variants.

    ``sigmoid(v) = 1 / (1 + exp(-v))`` with IEEE float32 division; ``exp`` is numpy's float32
    exp (the interpreter uses the same). Every intermediate is rounded to float32 in the order
    written above.
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
                return (g * (one / (one + np.exp(-g)))) * u
            lim = np.float32(self.limit)
            g2 = np.minimum(g, lim)
            u2 = np.clip(u, -lim, lim)
            sig = one / (one + np.exp(-(np.float32(self.alpha) * g2)))
            return ((u2 + one) * g2) * sig


GatedActivation.SILU = GatedActivation("silu")
GatedActivation.SWIGLU_OAI = GatedActivation.swiglu_oai(1.702, 7.0)
