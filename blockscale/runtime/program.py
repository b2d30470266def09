"""A compiled op or graph as a self-contained, saveable launch plan.

A :class:`Program` is named buffers (inputs, outputs, temporaries, each with a shape and a
dtype), an ordered list of :class:`Step` launches that bind kernel arguments to buffer names or
scalar values, and the :class:`~blockscale.launch.KernelBinary` of every kernel it launches.
It needs neither MLIR nor LLVM: :meth:`Program.save` writes one directory (``plan.json`` plus
``kernels/<key>.json`` and ``kernels/<key>.<cubin|hsaco>`` via ``launch.save_kernel``), and
:meth:`Program.load` + :meth:`Program.run` work on a machine with only the driver, numpy and
ml_dtypes. The same program runs on the interpreter when its kernels carry their MLIR.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from blockscale.dtypes import np_dtype
from blockscale.launch import KernelBinary, Launch, load_kernel, save_kernel
from blockscale.runtime.arrays import as_device_buffer, io_mode
from blockscale.runtime.device import Device, GpuDevice, get_device

__all__ = ["BufferDecl", "Program", "Step"]

PLAN_FORMAT = "blockscale-program"
PLAN_VERSION = 1
_ROLES = ("input", "output", "temp")
_INITS = ("empty", "zeros")
_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclasses.dataclass(frozen=True)
class BufferDecl:
    """A named buffer of the plan.

    ``role``: "input" (given to :meth:`Program.run`), "output" (returned) or "temp".
    ``init``: how outputs and temporaries start: "empty" (undefined) or "zeros" (e.g. scale
    buffers whose padding the kernel does not write).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "input"
    init: str = "empty"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        if self.role not in _ROLES:
            raise ValueError(f"buffer {self.name!r}: role must be one of {_ROLES}, "
                             f"got {self.role!r}")
        if self.init not in _INITS:
            raise ValueError(f"buffer {self.name!r}: init must be one of {_INITS}, "
                             f"got {self.init!r}")
        if any(n < 0 for n in self.shape):
            raise ValueError(f"buffer {self.name!r}: shape dims must be >= 0, got {self.shape}")
        try:
            np_dtype(self.dtype)
        except TypeError:
            raise ValueError(f"buffer {self.name!r}: unknown dtype {self.dtype!r}") from None

    @property
    def np_dtype(self) -> np.dtype:
        return np_dtype(self.dtype)


@dataclasses.dataclass(frozen=True)
class Step:
    """One launch: kernel ``kernel`` (a key of ``Program.kernels``) on ``grid``, with
    ``bindings`` mapping each kernel argument name to a buffer name or a scalar value."""

    kernel: str
    grid: tuple[int, int, int]
    bindings: Mapping[str, Any]


class Program:
    """A launch plan plus its kernels; see the module docstring."""

    def __init__(self, buffers: Iterable[BufferDecl], steps: Iterable[Step],
                 kernels: Mapping[str, KernelBinary], *, meta: Mapping[str, Any] | None = None):
        self.buffers: dict[str, BufferDecl] = {}
        for b in buffers:
            if b.name in self.buffers:
                raise ValueError(f"buffers: duplicate buffer name {b.name!r}")
            self.buffers[b.name] = b
        self.steps: list[Step] = [Step(s.kernel, tuple(s.grid), dict(s.bindings))  # type: ignore
                                  for s in steps]
        self.kernels: dict[str, KernelBinary] = dict(kernels)
        self.meta: dict[str, Any] = dict(meta or {})
        targets = sorted({k.target for k in self.kernels.values()})
        if len(targets) > 1:
            raise ValueError(f"kernels: a program has one target, got {targets}")
        self.target: str | None = targets[0] if targets else None
        self._validate()

    # ---- construction
    @classmethod
    def from_launches(cls, launches: Sequence[Launch], buffers: Iterable[BufferDecl], *,
                      meta: Mapping[str, Any] | None = None,
                      keys: Mapping[str, str] | None = None) -> Program:
        """A program from ``launch.Launch`` steps whose buffer bindings name ``buffers``.

        Kernels are keyed by ``keys[kernel.name]`` when given (e.g. ``ops._core.kernel_key``),
        else by ``<kernel name>-<n>`` in order of first use.
        """
        kernels: dict[str, KernelBinary] = {}
        by_identity: dict[tuple[str, bytes], str] = {}
        steps = []
        for launch in launches:
            k = launch.kernel
            ident = (k.name, k.binary)
            key = by_identity.get(ident)
            if key is None:
                key = (keys or {}).get(k.name) or f"{k.name}-{len(kernels)}"
                by_identity[ident] = key
                kernels[key] = k
            steps.append(Step(key, tuple(launch.grid), dict(launch.bindings)))  # type: ignore
        return cls(buffers, steps, kernels, meta=meta)

    def _validate(self) -> None:
        for i, step in enumerate(self.steps):
            where = f"step {i}"
            if step.kernel not in self.kernels:
                raise ValueError(f"{where}: unknown kernel {step.kernel!r}; expected one of "
                                 f"{sorted(self.kernels)}")
            kernel = self.kernels[step.kernel]
            names = {a.name for a in kernel.args}
            if set(step.bindings) != names:
                raise ValueError(f"{where} ({kernel.name}): bindings must name exactly the "
                                 f"kernel args {sorted(names)}, got {sorted(step.bindings)}")
            for arg in kernel.args:
                value = step.bindings[arg.name]
                if arg.kind == "buffer" and value not in self.buffers:
                    raise ValueError(f"{where} ({kernel.name}) arg {arg.name!r}: expected a "
                                     f"buffer name, got {value!r}")
                if arg.kind == "scalar" and not isinstance(value, (int, float)):
                    raise ValueError(f"{where} ({kernel.name}) arg {arg.name!r}: expected a "
                                     f"scalar number, got {value!r}")
        for key in self.kernels:
            if not _KEY_RE.match(key):
                raise ValueError(f"kernels: key {key!r} must match {_KEY_RE.pattern}")

    @property
    def inputs(self) -> list[BufferDecl]:
        return [b for b in self.buffers.values() if b.role == "input"]

    @property
    def outputs(self) -> list[BufferDecl]:
        return [b for b in self.buffers.values() if b.role == "output"]

    def __repr__(self) -> str:
        return (f"Program(target={self.target}, inputs={[b.name for b in self.inputs]}, "
                f"outputs={[b.name for b in self.outputs]}, steps={len(self.steps)})")

    # ---- persistence
    def to_json(self) -> dict[str, Any]:
        """The plan (everything but the kernel binaries) as a JSON-able dict."""
        return {
            "format": PLAN_FORMAT, "version": PLAN_VERSION, "target": self.target,
            "meta": self.meta,
            "buffers": [dataclasses.asdict(b) for b in self.buffers.values()],
            "steps": [{"kernel": s.kernel, "grid": list(s.grid), "bindings": dict(s.bindings)}
                      for s in self.steps],
            "kernels": sorted(self.kernels),
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``plan.json`` and ``kernels/`` into directory ``path`` (created if needed)."""
        path = os.fspath(path)
        kdir = os.path.join(path, "kernels")
        for key, kernel in self.kernels.items():
            save_kernel(kdir, key, kernel)
        tmp = os.path.join(path, ".plan.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(path, "plan.json"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Program:
        """Read a directory written by :meth:`save` (no MLIR or LLVM needed)."""
        path = os.fspath(path)
        plan_path = os.path.join(path, "plan.json")
        try:
            with open(plan_path, encoding="utf-8") as f:
                plan = json.load(f)
        except (FileNotFoundError, NotADirectoryError):
            raise ValueError(f"path: {path!r} is not a program directory (no plan.json)") \
                from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"path: {plan_path} is not a valid plan ({e})") from None
        if not isinstance(plan, dict):
            raise ValueError(f"path: {plan_path} must hold a JSON object, got "
                             f"{type(plan).__name__}")
        if plan.get("format") != PLAN_FORMAT or plan.get("version") != PLAN_VERSION:
            raise ValueError(f"{plan_path}: expected format {PLAN_FORMAT!r} version "
                             f"{PLAN_VERSION}, got {plan.get('format')!r} version "
                             f"{plan.get('version')!r}")
        kernels = {}
        for key in plan["kernels"]:
            kernel = load_kernel(os.path.join(path, "kernels"), key)
            if kernel is None:
                raise ValueError(f"{path}: kernel {key!r} is missing from kernels/")
            kernels[key] = kernel
        buffers = [BufferDecl(b["name"], tuple(b["shape"]), b["dtype"], b["role"],
                              b.get("init", "empty")) for b in plan["buffers"]]
        steps = [Step(s["kernel"], tuple(s["grid"]), s["bindings"])  # type: ignore[arg-type]
                 for s in plan["steps"]]
        prog = cls(buffers, steps, kernels, meta=plan.get("meta"))
        if prog.target != plan.get("target"):
            raise ValueError(f"{plan_path}: target {plan.get('target')!r} does not match its "
                             f"kernels' target {prog.target!r}")
        return prog

    # ---- execution
    def check_device(self, device: Device) -> None:
        """ValueError when this program's kernels cannot run on ``device``."""
        for kernel in self.kernels.values():
            try:
                device.check_kernel(kernel)
            except ValueError as e:
                raise ValueError(f"program for target {self.target} cannot run on "
                                 f"{device.describe()}: {e}") from None

    def _check_input(self, decl: BufferDecl, value: Any) -> None:
        if isinstance(value, np.ndarray):
            shape, dtype = value.shape, value.dtype
        else:
            buf = as_device_buffer(value, f"input {decl.name!r}")
            shape, dtype = buf.shape, buf.dtype
        if tuple(shape) != decl.shape:
            raise ValueError(f"input {decl.name!r}: expected shape {decl.shape}, "
                             f"got {tuple(shape)}")
        if dtype != decl.np_dtype:
            raise TypeError(f"input {decl.name!r}: expected dtype {decl.dtype}, got {dtype.name}")

    def run(self, inputs: Mapping[str, Any], device: Any = None,
            stream: Any = None) -> dict[str, Any]:
        """Run the plan and return ``{output name: array}``.

        ``inputs`` maps every input name to a numpy array or device memory of the declared
        shape and dtype. Numpy in gives numpy out; any device input gives device outputs (on
        the caller's stream: ``stream``, else the device's ``launch_stream`` of the inputs). ``device``: a name or Device (default: :func:`get_device`).
        """
        dev = get_device(device)
        self.check_device(dev)
        names = {b.name for b in self.inputs}
        if set(inputs) != names:
            raise ValueError(f"inputs: expected exactly {sorted(names)}, got {sorted(inputs)}")
        for decl in self.inputs:
            self._check_input(decl, inputs[decl.name])
        mode = io_mode(*inputs.values())
        if not isinstance(dev, GpuDevice) and mode == "device":
            raise TypeError(f"inputs: device {dev.name!r} runs on numpy arrays, got device "
                            "memory; pass numpy arrays or choose a GPU device")
        if stream is None and isinstance(dev, GpuDevice):
            # the caller's current stream (torch's, e.g. a graph capture), else the inputs'
            stream = dev.launch_stream([inputs[b.name] for b in self.inputs])
        bufs: dict[str, Any] = {}
        for decl in self.buffers.values():
            if decl.role == "input":
                value = inputs[decl.name]
                bufs[decl.name] = (dev.to_device(value, stream)
                                   if isinstance(value, np.ndarray) else value)
            elif decl.init == "zeros":
                bufs[decl.name] = dev.zeros(decl.shape, decl.np_dtype, stream)
            else:
                bufs[decl.name] = dev.alloc(decl.shape, decl.np_dtype, stream)
        for step in self.steps:
            kernel = self.kernels[step.kernel]
            args = [bufs[step.bindings[a.name]] if a.kind == "buffer" else step.bindings[a.name]
                    for a in kernel.args]
            dev.launch(kernel, step.grid, args, stream)
        outputs = {b.name: bufs[b.name] for b in self.outputs}
        if mode == "numpy" and isinstance(dev, GpuDevice):
            outputs = {k: dev.to_host(v, stream) for k, v in outputs.items()}
        return outputs
