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
* ``kind == "tensormap"``: a TMA tensor map (CUDA ``CUtensorMap``, 128 bytes) describing the
  buffer arg named ``tensor`` as a dense row-major tensor of ``dtype`` elements, copied in
  boxes of ``box`` elements (innermost dim first) with shared-memory swizzle ``swizzle`` and
  zero fill out of bounds. The kernel declares it as ``!llvm.ptr``: the generic address of the
  encoded map in device global memory (what ``nvgpu.tma.create.descriptor`` also produces;
  a ``__grid_constant__`` parameter cannot be expressed on a ``gpu.func``). The launch value
  is the tensor's dims, innermost first (e.g. ``(K, M)``); the CUDA runtime encodes the map
  with ``cuTensorMapEncodeTiled`` from the buffer's address and these dims, the interpreter
  builds the same description over the numpy buffer (:func:`tensormap_dims` checks both).

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
#: shared-memory swizzles of a tensormap arg, and the span (bytes) each one permutes.
TENSORMAP_SWIZZLES = {"none": 0, "32b": 32, "64b": 64, "128b": 128}
_TENSORMAP_FIELDS = ("tensor", "box", "swizzle")


@dataclasses.dataclass(frozen=True)
class KernelArg:
    """One kernel parameter: a flat buffer, a scalar or a TMA tensor map of a buffer."""

    name: str
    kind: str  # "buffer" | "scalar" | "tensormap"
    dtype: str  # buffer, tensormap: a BUFFER_DTYPES entry; scalar: a SCALAR_TYPES key
    role: str = "in"  # buffers: "in" | "out" | "inout"; scalars, tensormaps: "in"
    tensor: str = ""  # tensormap: the name of the buffer arg it describes
    box: tuple[int, ...] = ()  # tensormap: box dims in elements, innermost first
    swizzle: str = "none"  # tensormap: a TENSORMAP_SWIZZLES key

    def __post_init__(self) -> None:
        object.__setattr__(self, "box", tuple(int(b) for b in self.box))
        if self.kind == "tensormap":
            self._check_tensormap()
            return
        if self.tensor or self.box or self.swizzle != "none":
            raise ValueError(f"KernelArg {self.name!r}: tensor/box/swizzle are for kind "
                             f"'tensormap' only, got kind {self.kind!r}")
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
            raise ValueError(f"KernelArg {self.name!r}: kind must be 'buffer', 'scalar' or "
                             f"'tensormap', got {self.kind!r}")

    def _check_tensormap(self) -> None:
        where = f"KernelArg {self.name!r} (tensormap)"
        if self.dtype not in BUFFER_DTYPES:
            raise ValueError(f"{where}: dtype must be one of {BUFFER_DTYPES}, got {self.dtype!r}")
        if self.role != "in":
            raise ValueError(f"{where}: role must be 'in', got {self.role!r}")
        if not self.tensor:
            raise ValueError(f"{where}: tensor must name the buffer arg it describes")
        if not 1 <= len(self.box) <= 5 or any(not 1 <= b <= 256 for b in self.box):
            raise ValueError(f"{where}: box must be 1 to 5 dims in [1, 256], got {self.box}")
        if self.swizzle not in TENSORMAP_SWIZZLES:
            raise ValueError(f"{where}: swizzle must be one of {tuple(TENSORMAP_SWIZZLES)}, "
                             f"got {self.swizzle!r}")
        inner = self.box[0] * _itemsize(self.dtype)
        span = TENSORMAP_SWIZZLES[self.swizzle]
        if inner % 16 or (span and inner > span):
            raise ValueError(f"{where}: the inner box dim is {inner} bytes; it must be a "
                             f"multiple of 16{f' and at most {span} (swizzle)' if span else ''}")

    @property
    def box_bytes(self) -> int:
        """Bytes one tensormap box copies (what its mbarrier's expect-tx counts)."""
        n = _itemsize(self.dtype)
        for b in self.box:
            n *= b
        return n


def _itemsize(dtype: str) -> int:
    return 1 if dtype in ("uint8", "int8", "float8_e4m3fn", "float8_e8m0fnu") else \
        2 if dtype == "bfloat16" else 8 if dtype == "int64" else 4


def check_tensormap_args(args: tuple[KernelArg, ...], kernel: str = "") -> None:
    """Each tensormap arg must name a buffer arg of the same dtype (ValueError otherwise)."""
    buffers = {a.name: a for a in args if a.kind == "buffer"}
    for a in args:
        if a.kind != "tensormap":
            continue
        b = buffers.get(a.tensor)
        if b is None or b.dtype != a.dtype:
            raise ValueError(f"kernel {kernel!r} arg {a.name!r}: tensor must name a "
                             f"{a.dtype} buffer arg of the kernel, got {a.tensor!r} "
                             f"(buffers: {sorted(buffers)})")


def tensormap_dims(arg: KernelArg, value: Any, n_elements: int, kernel: str = "") -> tuple[int, ...]:
    """Validate the launch value of tensormap ``arg``: its tensor's dims, innermost first, one
    per box dim, whose product is the buffer's ``n_elements`` and whose row pitch
    (``dims[0] * itemsize``) is a multiple of 16 bytes (cuTensorMapEncodeTiled's rule)."""
    where = f"kernel {kernel!r} arg {arg.name!r}"
    if not isinstance(value, (tuple, list)) or len(value) != len(arg.box) or not all(
            hasattr(d, "__index__") and not isinstance(d, bool) for d in value):
        raise TypeError(f"{where}: expected a tuple of {len(arg.box)} ints (dims, innermost "
                        f"first), got {value!r}")
    dims = tuple(int(d) for d in value)
    if any(not 1 <= d < 2**32 for d in dims):
        raise ValueError(f"{where}: dims must be in [1, 2**32), got {dims}")
    total = 1
    for d in dims:
        total *= d
    if total != n_elements:
        raise ValueError(f"{where}: dims {dims} hold {total} elements, buffer "
                         f"{arg.tensor!r} has {n_elements}")
    if len(dims) > 1 and (dims[0] * _itemsize(arg.dtype)) % 16:
        raise ValueError(f"{where}: the row pitch {dims[0]} x {_itemsize(arg.dtype)} bytes "
                         "must be a multiple of 16")
    return dims


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

    def __post_init__(self) -> None:
        check_tensormap_args(tuple(self.args), self.name)

    def to_json(self) -> dict[str, Any]:
        """Metadata as JSON-able dict (the binary travels beside it)."""
        return {
            "name": self.name, "target": self.target, "binary_kind": self.binary_kind,
            "args": [_arg_json(a) for a in self.args], "block": list(self.block),
            "dynamic_shared_bytes": self.dynamic_shared_bytes, "mlir": self.mlir,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], binary: bytes) -> KernelBinary:
        return cls(name=d["name"], target=d["target"], binary_kind=d["binary_kind"],
                   binary=binary, args=tuple(KernelArg(**a) for a in d["args"]),
                   block=tuple(d["block"]), dynamic_shared_bytes=d["dynamic_shared_bytes"],
                   mlir=d.get("mlir", ""), meta=d.get("meta", {}))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


def _arg_json(arg: KernelArg) -> dict[str, Any]:
    d = dataclasses.asdict(arg)
    if arg.kind != "tensormap":  # the JSON of buffer and scalar args is unchanged
        for f in _TENSORMAP_FIELDS:
            d.pop(f)
    else:
        d["box"] = list(arg.box)
    return d


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
