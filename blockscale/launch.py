"""The launch contract shared by the compiler and the runtime.

A compiled kernel travels from ``blockscale.compiler`` to ``blockscale.runtime`` only as a
:class:`KernelBinary`: bytes plus this metadata. Neither side imports the other.

Argument convention (one for all kernels)
-----------------------------------------
Kernel parameters are, in order, the entries of ``KernelBinary.args``:

* ``kind == "buffer"``: a flat, contiguous device buffer, declared in the kernel as a 1-D
  ``memref<?xT>``. After ``convert-gpu-to-nvvm`` / ``convert-gpu-to-rocdl`` it is the standard
  MLIR descriptor of five parameters: ``(allocated ptr, aligned ptr, offset: i64, size: i64,
  stride: i64)``. The runtime passes ``(p, p, 0, n_elements, 1)``.
* ``kind == "scalar"``: an ``i32``, ``i64`` or ``f32`` value passed by value.

Shapes are passed as scalars; the grid is chosen by the op on the host for each call
(``grid``), the block size is fixed at compile time (``block``) and recorded on the gpu.func
as ``known_block_size``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

#: numpy dtype names a buffer may have (ml_dtypes names for the narrow floats).
BUFFER_DTYPES = (
    "uint8", "int8", "int32", "uint32", "int64", "float32", "bfloat16",
    "float8_e4m3fn", "float8_e8m0fnu",
)
#: scalar parameter types and their numpy dtype names.
SCALAR_TYPES = {"i32": "int32", "i64": "int64", "f32": "float32"}


@dataclasses.dataclass(frozen=True)
class KernelArg:
    """One kernel parameter: a flat buffer or a scalar."""

    name: str
    kind: str  # "buffer" | "scalar"
    dtype: str  # buffer: a BUFFER_DTYPES entry; scalar: a SCALAR_TYPES key
    role: str = "in"  # buffers: "in" | "out" | "inout"; scalars: "in"

    def __post_init__(self) -> None:
        if self.kind == "buffer":
            if self.dtype not in BUFFER_DTYPES:
                raise ValueError(f"KernelArg {self.name!r}: buffer dtype must be one of "
                                 f"{BUFFER_DTYPES}, got {self.dtype!r}")
            if self.role not in ("in", "out", "inout"):
                raise ValueError(f"KernelArg {self.name!r}: role must be in/out/inout, "
                                 f"got {self.role!r}")
        elif self.kind == "scalar":
            if self.dtype not in SCALAR_TYPES:
                raise ValueError(f"KernelArg {self.name!r}: scalar dtype must be one of "
                                 f"{tuple(SCALAR_TYPES)}, got {self.dtype!r}")
        else:
            raise ValueError(f"KernelArg {self.name!r}: kind must be 'buffer' or 'scalar', "
                             f"got {self.kind!r}")


@dataclasses.dataclass(frozen=True)
class KernelBinary:
    """A compiled kernel: what the runtime needs to load and launch it.

    ``mlir`` is the kernel's MLIR before target lowering (what the numpy interpreter runs);
    ``binary`` is the cubin or hsaco. ``meta`` holds registers, spills, static shared memory
    and the toolchain versions.
    """

    name: str  # kernel symbol in the binary
    target: str  # GPUTarget name, e.g. "sm_90a"
    binary_kind: str  # "cubin" | "hsaco"
    binary: bytes
    args: tuple[KernelArg, ...]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int = 0
    mlir: str = ""
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Metadata as JSON-able dict (the binary travels beside it)."""
        return {
            "name": self.name, "target": self.target, "binary_kind": self.binary_kind,
            "args": [dataclasses.asdict(a) for a in self.args], "block": list(self.block),
            "dynamic_shared_bytes": self.dynamic_shared_bytes, "mlir": self.mlir,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], binary: bytes) -> "KernelBinary":
        return cls(name=d["name"], target=d["target"], binary_kind=d["binary_kind"],
                   binary=binary, args=tuple(KernelArg(**a) for a in d["args"]),
                   block=tuple(d["block"]), dynamic_shared_bytes=d["dynamic_shared_bytes"],
                   mlir=d.get("mlir", ""), meta=d.get("meta", {}))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan: which kernel, the grid, and the values of its args.

    ``bindings`` maps each KernelArg name to a buffer name of the plan (buffers) or a
    Python scalar (scalars).
    """

    kernel: KernelBinary
    grid: tuple[int, int, int]
    bindings: dict[str, Any]


def save_kernel(directory: str, key: str, kernel: KernelBinary) -> None:
    """Write ``kernel`` into a bundle directory as ``<key>.json`` + ``<key>.<binary_kind>``.

    Both files are written atomically (temporary file + rename), binary first, so a reader
    that finds the JSON also finds a complete binary.
    """
    import hashlib
    import os
    import tempfile

    os.makedirs(directory, exist_ok=True)
    meta = kernel.to_json()
    meta["sha256"] = hashlib.sha256(kernel.binary).hexdigest()
    for suffix, data in ((kernel.binary_kind, kernel.binary),
                         ("json", json.dumps(meta, sort_keys=True).encode())):
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(directory, f"{key}.{suffix}"))


def load_kernel(directory: str, key: str) -> KernelBinary | None:
    """Read a kernel saved by :func:`save_kernel`; None when absent.

    Raises ValueError when the binary does not match the checksum recorded in the JSON.
    """
    import hashlib
    import os

    meta_path = os.path.join(directory, f"{key}.json")
    if not os.path.exists(meta_path):
        return None
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    bin_path = os.path.join(directory, f"{key}.{meta['binary_kind']}")
    try:
        with open(bin_path, "rb") as f:
            binary = f.read()
    except FileNotFoundError:
        return None
    if hashlib.sha256(binary).hexdigest() != meta.get("sha256"):
        raise ValueError(f"kernel bundle entry {bin_path}: checksum mismatch (corrupted); "
                         "delete it and rebuild")
    return KernelBinary.from_json(meta, binary)
