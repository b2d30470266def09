"""Compiled ops: the public functions of DESIGN.md's API, each a GPU kernel generator.

``import blockscale.ops`` is cheap and never imports MLIR: op functions load on first
attribute access from their module (``blockscale.ops.<module>``), and MLIR loads only when a
kernel must be built. Every op module has a spec, ``build(spec)``, ``bundle_specs(target)`` and
a user-facing function with ``.kernel(...)`` returning the compiled Kernel.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

#: Public name -> module, for the names whose module is known up front.
_KNOWN = {
    "block_scales_interleave": "interleave",
    "block_scales_interleave_fp4": "interleave",
    "block_scales_interleave_fp4_kernel": "interleave",
    "naive_block_scaled_matmul": "matmul",
    "block_scaled_matmul": "matmul",
    "block_scaled_matmul_with_epilogue": "matmul",
    "matmul_dynamic_block_scaled_mxfp4": "matmul",
    "grouped_matmul_swiglu": "matmul_swiglu",
}


def op_module_names() -> list[str]:
    """Public modules of this package (those not starting with an underscore)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def __getattr__(name: str) -> Any:
    # Private and dunder names are never op functions: no module scan for them, so that
    # ``from blockscale.ops import _core`` (the import system asks this hook first) imports
    # only that submodule, not every op module (and MLIR through the IR modules).
    if name.startswith("_"):
        raise AttributeError(f"module 'blockscale.ops' has no attribute {name!r}")
    if name in op_module_names():  # ``from blockscale.ops import quantize``: that module only
        return importlib.import_module(f"{__name__}.{name}")
    candidates = [_KNOWN[name]] if name in _KNOWN else []
    candidates += [m for m in op_module_names() if m not in candidates]
    for mod_name in candidates:
        try:
            module = importlib.import_module(f"{__name__}.{mod_name}")
        except ImportError:
            continue
        if name == mod_name:
            return module
        if hasattr(module, name):
            value = getattr(module, name)
            globals()[name] = value
            return value
    raise AttributeError(f"module 'blockscale.ops' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_KNOWN) | set(op_module_names()))
