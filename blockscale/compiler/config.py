"""Typed environment knobs of the compiler, in one registry.

Each knob is a :class:`Knob` descriptor (name, type, default, description); reading the
attribute of :data:`knobs` reads the environment *at that moment* (no import-time caching), so
tests can ``monkeypatch.setenv``. ``help()`` lists them all; ``docs/env.md`` is generated from
this registry by :func:`markdown_table` (a test checks they match).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"environment variable {name} must be one of {_TRUE + _FALSE[:-1]}, "
                     f"got {raw!r}")


@dataclasses.dataclass(frozen=True)
class Knob(Generic[T]):
    """One environment variable: its type (bool or str), default and meaning."""

    name: str
    type: type
    default: T
    description: str

    def get(self) -> T:
        """The current value (environment, else default); bad values raise ValueError."""
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        if self.type is bool:
            return _parse_bool(self.name, raw)  # type: ignore[return-value]
        return raw  # type: ignore[return-value]

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        return self.get()


class _Knobs:
    """Attribute access to the current value of every knob (``knobs.dump_dir``)."""

    dump_dir = Knob("BLOCKSCALE_DUMP_DIR", str, "",
                    "Write every compile stage of every kernel to "
                    "`<dir>/<kernel>/<target>/NN_<stage>.<ext>` (also on cache hits).")
    dump_passes = Knob("BLOCKSCALE_DUMP_PASSES", bool, False,
                       "With BLOCKSCALE_DUMP_DIR: also write the IR after every MLIR pass "
                       "under `<dir>/<kernel>/<target>/passes/` (bypasses the cache).")
    cache_dir = Knob("BLOCKSCALE_CACHE_DIR", str, "",
                     "On-disk kernel cache directory (default `~/.cache/blockscale`).")
    disable_cache = Knob("BLOCKSCALE_DISABLE_CACHE", bool, False,
                         "Always recompile: skip the in-memory and on-disk kernel caches.")
    llvm_bin = Knob("BLOCKSCALE_LLVM_BIN", str, "",
                    "Directory holding `llc`, `ld.lld` and `llvm-objdump` with the AMDGPU "
                    "target (searched before ROCm and /usr/lib/llvm-*).")
    ptxas = Knob("BLOCKSCALE_PTXAS", str, "",
                 "Path of the `ptxas` to use (searched before the nvidia-cuda-nvcc wheel, "
                 "CUDA_HOME and PATH).")
    bundle_dir = Knob("BLOCKSCALE_BUNDLE_DIR", str, "",
                      "Directory of precompiled kernels (`make gpu-bundle`); default "
                      "`build/gpu` when it exists.")
    cuda_mempool = Knob("BLOCKSCALE_CUDA_MEMPOOL", bool, True,
                        "CUDA arrays come from the device's stream-ordered memory pool "
                        "(cuMemAllocAsync / cuMemFreeAsync, freed memory kept cached); off: "
                        "cuMemAlloc / cuMemFree, which synchronize the device on every free.")

    def all(self) -> tuple[Knob[Any], ...]:
        """Every knob, in declaration order."""
        return tuple(v for v in type(self).__dict__.values() if isinstance(v, Knob))


knobs = _Knobs()


def help() -> str:
    """A human-readable list of every knob with its current value."""
    lines = []
    for k in knobs.all():
        lines.append(f"{k.name} ({k.type.__name__}, default {k.default!r}, "
                     f"now {os.environ.get(k.name, '<unset>')!r})\n    {k.description}")
    return "\n".join(lines)


def markdown_table() -> str:
    """The env-knob table of ``docs/env.md`` (generated from the registry)."""
    rows = ["| Variable | Type | Default | Meaning |", "|---|---|---|---|"]
    for k in knobs.all():
        default = repr(k.default) if k.default != "" else "(unset)"
        rows.append(f"| `{k.name}` | {k.type.__name__} | {default} | {k.description} |")
    return "\n".join(rows) + "\n"


def env_markdown() -> str:
    """The full text of ``docs/env.md``."""
    return ("# Environment variables\n\n"
            "Generated from `blockscale/compiler/config.py` "
            "(`python -c \"from blockscale.compiler import config; "
            "print(config.env_markdown())\" > docs/env.md`); a test checks that it matches.\n\n"
            + markdown_table())
