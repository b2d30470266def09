"""blockscale: an MLIR-based compiler pipeline for block-scaled low-precision GPU kernels.

``import blockscale`` is cheap: it loads the format and layout descriptors only. The numpy
reference, the compiled ops, the graph API and the MoE strategy load on first use, and MLIR is
imported only when something must be compiled (or interpreted).
"""

from __future__ import annotations

import importlib
from typing import Any

from blockscale.formats import MXFP4, MXFP8, NVFP4, Format
from blockscale.layouts import ROW_MAJOR, TCGEN_5D, QTensor, ScaleLayout

__version__ = "0.1.0"

_LAZY_MODULES = ("reference", "ops", "graph", "moe", "runtime", "compiler", "launch")
_LAZY_ATTRS = {
    "GatedActivation": "blockscale.activations",
    "Graph": "blockscale.graph",
    "NvMxf4f8Strategy": "blockscale.moe",
    "QuantConfig": "blockscale.moe",
}

__all__ = ["Format", "NVFP4", "MXFP4", "MXFP8", "ScaleLayout", "ROW_MAJOR", "TCGEN_5D",
           "QTensor", *_LAZY_ATTRS, *_LAZY_MODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"blockscale.{name}")
    if name in _LAZY_ATTRS:
        return getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
    raise AttributeError(f"module 'blockscale' has no attribute {name!r}")
