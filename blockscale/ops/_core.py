"""What every op module shares: kernel keys, kernel lookup/compilation, launching, registry.

An op spec is a frozen dataclass with these members (see docs/internals.md):

* ``op`` (ClassVar str): the op name, e.g. "block_scales_interleave";
* ``target`` (str): a GPUTarget name;
* ``kernel_name`` (str attribute or property): the kernel symbol;
* ``args()`` -> tuple of ``KernelArg``: the launch parameters;
* ``block`` (tuple of 3 ints): the fixed block size;
* optionally ``dynamic_shared_bytes`` (int).

The generator is the ``build(spec) -> ir.Module`` function of the module defining the spec
class (or the ``build`` passed explicitly). This module never imports MLIR at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from blockscale.launch import KernelBinary, load_kernel

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: op modules (under blockscale.ops) whose ``bundle_specs(target)`` the bundle tool collects.
_OP_MODULES: list[str] = []
_MEMORY: dict[str, KernelBinary] = {}
_LOCK = threading.Lock()


def register_op_module(module_name: str) -> None:
    """Register an op module (e.g. ``"blockscale.ops.interleave"``) for :func:`bundle_specs`."""
    if module_name not in _OP_MODULES:
        _OP_MODULES.append(module_name)


def attach_kernel_api(entry_points: Iterable[Callable[..., Any]], kernel: Callable[..., Any],
                      build: Callable[[Any], Any]) -> None:
    """Give each user-facing function of an op module the module's ``kernel`` (compiled
    Kernel of a spec) and ``build`` (its IR) as ``fn.kernel`` / ``fn.build``."""
    for fn in entry_points:
        fn.kernel = kernel  # type: ignore[attr-defined]
        fn.build = build  # type: ignore[attr-defined]


def op_modules() -> tuple[str, ...]:
    """Registered op modules, in registration order."""
    return tuple(_OP_MODULES)


def bundle_specs(target: str) -> list[Any]:
    """Every spec of every op module for ``target`` (for ``make gpu-bundle``): the modules
    registered with :func:`register_op_module` plus every public module of blockscale.ops
    that defines ``bundle_specs(target)``."""
    import blockscale.ops as ops_pkg

    names = list(_OP_MODULES)
    names += [f"blockscale.ops.{m}" for m in ops_pkg.op_module_names()
              if f"blockscale.ops.{m}" not in names]
    specs: list[Any] = []
    for name in names:
        module = importlib.import_module(name)
        fn = getattr(module, "bundle_specs", None)
        if callable(fn):
            specs.extend(fn(target))
    return specs


# ----------------------------------------------------------------------------- keys


def _package_version() -> str:
    return getattr(sys.modules.get("blockscale"), "__version__", "0")


@functools.cache
def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _compiler_sources() -> list[str]:
    """Source files of blockscale/compiler and launch.py (they shape every kernel)."""
    files = [os.path.join(_PACKAGE_DIR, "launch.py")]
    for root, _, names in os.walk(os.path.join(_PACKAGE_DIR, "compiler")):
        files.extend(os.path.join(root, n) for n in names if n.endswith(".py"))
    return sorted(files)


def generator_sources(spec: Any) -> list[str]:
    """The source files whose bytes enter the key of ``spec``: the spec's module, any
    modules it lists in ``KERNEL_SOURCES`` (module names), and the compiler sources."""
    module = sys.modules[type(spec).__module__]
    files = [os.path.abspath(module.__file__)]
    for name in getattr(module, "KERNEL_SOURCES", ()):
        files.append(os.path.abspath(_module_file(name)))
    return files + _compiler_sources()


def _module_file(name: str) -> str:
    """The source file of module ``name`` *without running it*: KERNEL_SOURCES are IR
    modules that import MLIR, and a machine without MLIR (the GPU box running a kernel
    bundle) must still compute kernel keys."""
    loaded = getattr(sys.modules.get(name), "__file__", None)
    if loaded:
        return loaded
    found = importlib.util.find_spec(name)
    if found is None or not found.origin:
        raise ImportError(f"KERNEL_SOURCES names module {name!r}, which does not exist")
    return found.origin


def _spec_fields(spec: Any) -> Any:
    if not dataclasses.is_dataclass(spec):
        raise TypeError(f"spec must be a dataclass instance, got {type(spec).__name__}")

    def norm(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {"__type__": type(v).__qualname__,
                    **{f.name: norm(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        if isinstance(v, list | tuple):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
        if isinstance(v, str | int | float | bool) or v is None:
            return v
        key = getattr(v, "key", None) or getattr(v, "name", None)
        return repr(key if key is not None else v)

    return norm(spec)


def kernel_key(spec: Any) -> str:
    """A hex key of the compiled kernel for ``spec``, computed without importing MLIR: hash of
    the spec's type and fields, its ``build_facts()`` where it has them (what the generator
    reads from module-level tunables rather than the fields, e.g. a register cap; a test that
    patches a tunable must not share the kernel of the unpatched one), the generator's (and
    compiler's) source bytes, and the package version. Memoized per spec and facts (an op
    call computes it on every launch)."""
    facts = spec.build_facts() if hasattr(spec, "build_facts") else None
    memo = (spec, json.dumps(facts, sort_keys=True))
    try:
        return _KEYS[memo]
    except (KeyError, TypeError):  # TypeError: an unhashable spec, computed every time
        pass
    h = hashlib.sha256()
    h.update(json.dumps({"type": f"{type(spec).__module__}.{type(spec).__qualname__}",
                         "op": getattr(spec, "op", ""), "fields": _spec_fields(spec),
                         "build": facts, "version": _package_version()},
                        sort_keys=True).encode())
    for rel, digest in _source_digests(type(spec).__module__):
        h.update(rel.encode())
        h.update(digest.encode())
    key = f"{getattr(spec, 'op', 'kernel')}-{h.hexdigest()[:32]}"
    try:
        _KEYS[memo] = key
    except TypeError:
        pass
    return key


_KEYS: dict[tuple[Any, str], str] = {}


@functools.cache
def _source_digests(module_name: str) -> tuple[tuple[str, str], ...]:
    """(path relative to the package, sha256) of each generator source of the specs defined in
    ``module_name``; files are read once per process, like ``_file_digest``."""
    class _Probe:  # generator_sources only looks at the spec's module
        pass
    _Probe.__module__ = module_name
    return tuple((os.path.relpath(p, _PACKAGE_DIR), _file_digest(p))
                 for p in generator_sources(_Probe()))


# ----------------------------------------------------------------------------- lookup


def bundle_dir() -> str | None:
    """BLOCKSCALE_BUNDLE_DIR, else ``./build/gpu`` when it exists, else None."""
    env = os.environ.get("BLOCKSCALE_BUNDLE_DIR")
    if env:
        return env
    default = os.path.join("build", "gpu")
    return default if os.path.isdir(default) else None


def _mlir_available() -> bool:
    try:
        import mlir.ir  # noqa: F401
    except ImportError:
        return False
    return True


def _builder_of(spec: Any, build: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    if build is not None:
        return build
    fn = getattr(sys.modules[type(spec).__module__], "build", None)
    if fn is None:
        raise TypeError(f"no build(spec) function in {type(spec).__module__}; pass build=")
    return fn


def compile_kernel(spec: Any, build: Callable[[Any], Any] | None = None) -> Any:
    """The compiled ``compiler.pipeline.Kernel`` for ``spec`` (all stages in ``.asm``),
    through the compiler's cache. Needs MLIR. Dumps (BLOCKSCALE_DUMP_DIR) are written on a
    cache hit too; BLOCKSCALE_DUMP_PASSES=1 recompiles."""
    from blockscale.compiler import cache as kcache
    from blockscale.compiler import pipeline, toolchain
    from blockscale.compiler.config import knobs
    from blockscale.compiler.targets import GPUTarget

    target = GPUTarget.parse(spec.target)
    key = kcache.cache_key(kernel_key(spec), target, pipeline.pass_pipeline(target),
                           toolchain.toolchain_versions(target.backend), _package_version())
    use_cache = not knobs.disable_cache and not (knobs.dump_dir and knobs.dump_passes)
    store = kcache.default_cache()
    if use_cache:
        hit = store.get(key)
        if hit is not None:
            dump = pipeline.dump_directory(hit.name, target)
            if dump:
                pipeline.dump_kernel(hit, dump, note="cache hit: stages read from the cache")
            return hit
    module = _builder_of(spec, build)(spec)
    kernel = pipeline.compile_module(
        module, target, kernel_name=spec.kernel_name, args=spec.args(), block=spec.block,
        dynamic_shared_bytes=getattr(spec, "dynamic_shared_bytes", 0))
    kernel.meta["op_key"] = kernel_key(spec)
    kernel.meta.update(getattr(spec, "launch_meta", {}))  # e.g. programmatic_launch (cuda.py)
    if not knobs.disable_cache:
        store.put(key, kernel)
    return kernel


def get_kernel(spec: Any, build: Callable[[Any], Any] | None = None) -> KernelBinary:
    """The launchable binary for ``spec``: memory -> bundle directory -> compile (with the
    disk cache). Without MLIR, a kernel missing from the bundle raises RuntimeError."""
    key = kernel_key(spec)
    with _LOCK:
        hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    directory = bundle_dir()
    binary = load_kernel(directory, key) if directory else None
    if binary is not None and not binary.mlir and _mlir_available():
        binary = None  # a stripped bundle entry: compile here (cached) so the interpreter can run it
    if binary is None:
        if not _mlir_available():
            raise RuntimeError(
                f"kernel for op {getattr(spec, 'op', type(spec).__name__)!r} (spec {spec!r}, "
                f"key {key}) is not in the kernel bundle "
                f"{directory or 'build/gpu (absent)'} and MLIR is not installed here to "
                "compile it; run `make gpu-bundle` on a machine with the compiler and copy "
                "build/gpu here (or set BLOCKSCALE_BUNDLE_DIR)")
        binary = compile_kernel(spec, build).binary
    with _LOCK:
        _MEMORY[key] = binary
    return binary


def clear_memory() -> None:
    """Forget the in-memory kernels (bundle and disk cache untouched)."""
    with _LOCK:
        _MEMORY.clear()


# ----------------------------------------------------------------------------- launch


def run_kernel(kernel: KernelBinary, grid: Sequence[int], args: Iterable[Any],
               device: Any = None) -> Any:
    """Launch ``kernel`` on ``device`` ("cuda" | "hip" | "interp" | None = best available, or
    a runtime Device); returns the Device used."""
    from blockscale import runtime

    dev = device if hasattr(device, "launch") else runtime.get_device(device)
    grid3 = grid if type(grid) is tuple and len(grid) == 3 else \
        tuple(int(g) for g in grid) + (1,) * (3 - len(tuple(grid)))
    dev.launch(kernel, grid3, args if type(args) is list else list(args))
    return dev


#: id(kernel) -> (kernel, output names, per kernel arg: (0 output | 1 input buffer | 2 scalar,
#: name)); what :func:`launch_op` would otherwise work out from ``kernel.args`` every call
_ORDERS: dict[int, tuple[KernelBinary, tuple[str, ...], tuple[tuple[int, str], ...]]] = {}


def _arg_order(kernel: KernelBinary, outs: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    hit = _ORDERS.get(id(kernel))
    if hit is not None and hit[0] is kernel and hit[1] == outs:
        return hit[2]
    order = tuple((0 if a.name in outs else 1 if a.kind == "buffer" else 2, a.name)
                  for a in kernel.args)
    if len(_ORDERS) > 4096:
        _ORDERS.clear()
    _ORDERS[id(kernel)] = (kernel, outs, order)  # holding the kernel keeps its id unique
    return order


@functools.cache
def _launch_modules() -> tuple[Any, type]:
    """numpy and DeviceArray, imported on first use (importing ops stays light)."""
    import numpy as np

    from blockscale.runtime.arrays import DeviceArray

    return np, DeviceArray


def launch_op(spec: Any, grid: tuple[int, int, int],
              outs: Sequence[tuple[str, tuple[int, ...], Any]], buffers: dict[str, Any],
              scalars: dict[str, Any], device: Any,
              build: Callable[[Any], Any] | None = None) -> tuple[bool, dict[str, Any]]:
    """The launch path the ops share: check ``buffers`` (:func:`check_buffers`), get
    ``spec``'s kernel, copy numpy inputs to ``device``, allocate the outputs ``outs``
    (``(name, shape, dtype)``), launch on ``grid`` (three ints) and return
    ``(host, {name: output})``: ``host`` is True when every input was numpy (the outputs are
    then numpy too), else the outputs are device arrays, allocated on and written by the
    launch stream (``device.launch_stream``: torch's current stream when it is not the
    default one, so the ops can be captured in a CUDA graph; else the inputs' stream).

    Per call it only does what depends on the values: the kernel's argument order is cached
    (:data:`_ORDERS`), and device arrays of ``device`` pass their checks by type.
    """
    np, DeviceArray = _launch_modules()
    host, checked, some_host = True, True, False
    for v in buffers.values():
        if type(v) is np.ndarray:
            some_host = True
            continue
        host = False
        if type(v) is not DeviceArray or v.device is not device:
            checked = False
    foreign = {} if checked else _checked_foreign(buffers, device)
    kernel = get_kernel(spec, build)
    order = _arg_order(kernel, tuple(o[0] for o in outs))
    if host:
        buffers = {n: device.to_device(np.ascontiguousarray(v)) for n, v in buffers.items()}
    elif not checked or some_host:  # device memory mixed with numpy inputs: copy the latter
        if foreign and hasattr(device, "check_foreign_memory"):  # a GpuDevice
            buffers = _borrowed(buffers, foreign, device, kernel)
        buffers = {n: device.to_device(np.ascontiguousarray(v)) if isinstance(v, np.ndarray)
                   else v for n, v in buffers.items()}
    # GPUs: the outputs are allocated (stream-ordered) on the stream the launch will use
    pick = getattr(device, "launch_stream", None)
    stream = pick(buffers.values()) if pick is not None else None
    out = {name: device.alloc(shape, dtype, stream) for name, shape, dtype in outs}
    args = [out[n] if k == 0 else buffers[n] if k == 1 else scalars[n] for k, n in order]
    if not (type(grid) is tuple and len(grid) == 3):
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(tuple(grid)))
    if stream is None:
        device.launch(kernel, grid, args)
    else:
        device.launch(kernel, grid, args, stream)
    if host:
        return True, {n: device.to_host(v) for n, v in out.items()}
    return False, out


#: (target argument, id(device)) -> (device, resolved target name): resolve_target's answers
_TARGETS: dict[tuple[Any, int], tuple[Any, str]] = {}


def resolve_target(target: str | None, device: Any) -> str:
    """The target name for a call: ``target`` if given, else the one matching the device
    (CUDA compute capability, AMD arch), else the default target (interpreter). Answers are
    remembered per (target, device) (errors are not)."""
    try:
        hit = _TARGETS.get((target, id(device)))
    except TypeError:  # an unhashable target: checked (and rejected) below
        hit = None
    if hit is not None and hit[0] is device:
        return hit[1]
    name = _resolve_target(target, device)
    if len(_TARGETS) > 1024:
        _TARGETS.clear()
    try:
        _TARGETS[(target, id(device))] = (device, name)
    except TypeError:
        pass
    return name


def _resolve_target(target: str | None, device: Any) -> str:
    from blockscale.compiler import targets as T  # pure python, no mlir

    if target is not None:
        name = T.GPUTarget.parse(target).name
        check_target_device(name, device)
        return name
    capability = getattr(device, "capability", None)
    if getattr(device, "name", "") == "cuda" and capability:
        return T.target_for_cuda_capability(tuple(capability)).name
    arch = getattr(device, "arch", None)
    if getattr(device, "name", "") == "hip" and isinstance(arch, str):
        return T.target_for_amd_arch(arch).name
    return T.DEFAULT_TARGET.name


def check_target_device(target: str, device: Any) -> None:
    """ValueError (before anything is compiled) when kernels built for ``target`` cannot run
    on ``device``: the interpreter runs every target; a GPU needs its binary kind and arch."""
    from blockscale.compiler import targets as T  # pure python, no mlir

    kind = getattr(device, "binary_kind", None)
    if kind is None:
        return
    t = T.GPUTarget.parse(target)
    where = getattr(device, "name", type(device).__name__)
    if t.binary_kind != kind:
        raise ValueError(f"target {t.name!r} builds a {t.binary_kind}, which cannot run on "
                         f"device {where!r}; expected a target that builds a {kind}")
    capability = getattr(device, "capability", None)
    if where == "cuda" and capability:
        from blockscale.runtime.device import cubin_runs_on

        if not cubin_runs_on(t.name, tuple(capability)):
            raise ValueError(f"target {t.name!r} does not run on device {where!r} of compute "
                             f"capability {tuple(capability)}; expected the device's target")
    arch = getattr(device, "arch", None)
    if where == "hip" and isinstance(arch, str) and t.chip != arch:
        raise ValueError(f"target {t.name!r} does not run on device {where!r} ({arch}); "
                         f"expected target {arch!r}")


def check_buffers(buffers: dict[str, Any], device: Any) -> None:
    """Host checks of launch buffers, before compiling: numpy arrays are always fine (they
    are copied, contiguous, to the device); anything else must be contiguous device memory
    that ``device`` can use. TypeError / ValueError name the argument."""
    _checked_foreign(buffers, device)


def _checked_foreign(buffers: dict[str, Any], device: Any) -> dict[str, Any]:
    """:func:`check_buffers`, returning the ``DeviceBuffer`` of each buffer that is device
    memory other than our DeviceArrays (torch, CUDA Array Interface, DLPack)."""
    import numpy as np

    from blockscale.runtime.arrays import DeviceArray, as_device_buffer

    where = getattr(device, "name", type(device).__name__)
    gpu = getattr(device, "binary_kind", None) is not None
    foreign: dict[str, Any] = {}
    for name, value in buffers.items():
        if value is None or isinstance(value, np.ndarray):
            continue
        if type(value) is DeviceArray and value.device is device:
            continue  # ours, on this device: contiguous device memory by construction
        if not gpu:
            raise TypeError(f"{name}: device {where!r} takes numpy arrays, got "
                            f"{type(value).__name__} (device memory?); pass a numpy array or "
                            "choose a GPU device")
        buf = as_device_buffer(value, name)  # host / non-contiguous / unknown memory raise here
        owner = value.device if isinstance(value, DeviceArray) else None
        if owner is not None and owner is not device:
            raise ValueError(f"{name}: expected memory of device {device!r}, got memory of "
                             f"device {owner!r}")
        if owner is None:
            foreign[name] = buf
    return foreign


def _borrowed(buffers: dict[str, Any], foreign: dict[str, Any], device: Any,
              kernel: KernelBinary) -> dict[str, Any]:
    """``buffers`` with each foreign device buffer (resolved once by :func:`_checked_foreign`)
    replaced by a borrowed DeviceArray of ``device`` over the same memory and stream, so the
    launch takes its fast path; the launch's own checks of such memory (another GPU's, a
    null pointer) run here, naming the kernel argument."""
    import math

    _, DeviceArray = _launch_modules()
    out = dict(buffers)
    for name, buf in foreign.items():
        where = f"kernel {kernel.name!r} arg {name!r}"
        device.check_foreign_memory(buffers[name], where)
        if math.prod(buf.shape) and not buf.ptr:
            raise ValueError(f"{where}: null pointer")
        out[name] = DeviceArray._view_of(device, buf, buffers[name])
    return out
