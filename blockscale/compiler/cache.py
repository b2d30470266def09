"""On-disk kernel cache with an in-memory front.

An entry is a directory ``<root>/<key[:2]>/<key>/`` holding one file per compile stage and a
``meta.json`` (written last) that records each file's sha256 and size plus the kernel's launch
metadata. Files are written atomically (temporary file + ``os.replace``); a reader verifies
every checksum and treats a truncated or corrupted entry as a miss (it is deleted and rebuilt).

The key (:func:`cache_key`) covers the op key (spec fields + generator and compiler source
fingerprint + package version, from ``ops._core.kernel_key``), the target, the pass pipeline
strings and the toolchain versions. A read-only cache directory falls back to a temporary
directory with a warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from blockscale.compiler.config import knobs
from blockscale.compiler.pipeline import STAGE_EXTENSIONS, Kernel, _Stages
from blockscale.compiler.targets import GPUTarget
from blockscale.launch import KernelArg

_FORMAT_VERSION = 1


def cache_key(op_key: str, target: GPUTarget | str, pipeline: Sequence[str],
              toolchain: Sequence[tuple[str, str]], package_version: str = "") -> str:
    """sha256 (hex) over everything that determines a compiled kernel."""
    target = GPUTarget.parse(target)
    payload = json.dumps({
        "format": _FORMAT_VERSION, "op_key": op_key, "target": dataclasses.asdict(target),
        "pipeline": list(pipeline), "toolchain": [list(t) for t in toolchain],
        "package": package_version,
    }, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def default_cache_dir() -> str:
    """BLOCKSCALE_CACHE_DIR, else ``~/.cache/blockscale``."""
    return knobs.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "blockscale")


def _atomic_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class KernelCache:
    """A cache of compiled :class:`Kernel` objects under ``directory``."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or default_cache_dir()
        self._memory: dict[str, Kernel] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _entry_dir(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key)

    # -- read

    def get(self, key: str) -> Kernel | None:
        """The cached kernel for ``key`` (memory, then disk), or None."""
        with self._lock:
            kernel = self._memory.get(key)
        if kernel is None:
            kernel = self._load(key)
            if kernel is not None:
                with self._lock:
                    self._memory[key] = kernel
        if kernel is None:
            self.misses += 1
        else:
            self.hits += 1
        return kernel

    def _load(self, key: str) -> Kernel | None:
        entry = self._entry_dir(key)
        meta_path = os.path.join(entry, "meta.json")
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            if meta.get("key") != key or meta.get("format") != _FORMAT_VERSION:
                raise ValueError("key or format mismatch")
            stages = _Stages(binary_kind=meta["binary_kind"])
            for stage, (fname, digest, size) in meta["files"].items():
                with open(os.path.join(entry, fname), "rb") as f:
                    data = f.read()
                if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
                    raise ValueError(f"checksum mismatch in {fname}")
                stages[stage] = data if stage in ("cubin", "hsaco") else data.decode("utf-8")
        except FileNotFoundError as e:
            if not os.path.isdir(entry):
                return None  # a plain miss
            err: Exception = e  # an entry missing meta.json or a stage file: corrupted
            warnings.warn(f"blockscale cache entry {entry} is corrupted ({err}); rebuilding",
                          RuntimeWarning, stacklevel=3)
            _discard(entry)
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(f"blockscale cache entry {entry} is corrupted ({e}); rebuilding",
                          RuntimeWarning, stacklevel=3)
            _discard(entry)
            return None
        k = meta["kernel"]
        return Kernel(name=k["name"], target=GPUTarget.parse(k["target"]),
                      args=tuple(KernelArg(**a) for a in k["args"]), block=tuple(k["block"]),
                      asm=stages, meta=k["meta"],
                      dynamic_shared_bytes=k["dynamic_shared_bytes"])

    # -- write

    def put(self, key: str, kernel: Kernel) -> None:
        """Store ``kernel`` in memory and on disk (falling back to a temp dir if the cache
        directory is not writable)."""
        with self._lock:
            self._memory[key] = kernel
        try:
            self._store(key, kernel)
        except OSError as e:
            fallback = tempfile.mkdtemp(prefix="blockscale-cache-")
            warnings.warn(f"blockscale cache directory {self.directory!r} is not writable "
                          f"({e}); using {fallback!r} for this process", RuntimeWarning,
                          stacklevel=2)
            self.directory = fallback
            self._store(key, kernel)

    def _store(self, key: str, kernel: Kernel) -> None:
        """Write the entry into a private temporary directory, then publish it with one
        atomic rename: readers (and racing writers) see no entry or a complete one."""
        entry = self._entry_dir(key)
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(entry), prefix=f".{key[:12]}-",
                               suffix=".tmp")
        try:
            self._write_entry(tmp, key, kernel)
            try:
                os.rename(tmp, entry)
            except OSError:
                if not os.path.isdir(entry):
                    raise
                # another process published this key first; a valid entry is kept, a
                # corrupted one (removed by _load) is replaced by ours
                if self._load(key) is None and not os.path.isdir(entry):
                    try:
                        os.rename(tmp, entry)
                    except OSError:
                        if not os.path.isdir(entry):
                            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _write_entry(self, entry: str, key: str, kernel: Kernel) -> None:
        files = {}
        for stage, data in dict(kernel.asm).items():
            if stage in ("sass", "disasm"):
                continue
            raw = data if isinstance(data, bytes) else data.encode("utf-8")
            fname = f"{stage}.{STAGE_EXTENSIONS.get(stage, 'txt')}"
            _atomic_write(os.path.join(entry, fname), raw)
            files[stage] = [fname, hashlib.sha256(raw).hexdigest(), len(raw)]
        meta = {
            "format": _FORMAT_VERSION, "key": key, "binary_kind": kernel.target.binary_kind,
            "files": files,
            "kernel": {"name": kernel.name, "target": kernel.target.name,
                       "args": [dataclasses.asdict(a) for a in kernel.args],
                       "block": list(kernel.block), "meta": kernel.meta,
                       "dynamic_shared_bytes": kernel.dynamic_shared_bytes},
        }
        _atomic_write(os.path.join(entry, "meta.json"),
                      json.dumps(meta, sort_keys=True, default=str).encode())

    def clear_memory(self) -> None:
        """Forget the in-memory front (the disk entries stay)."""
        with self._lock:
            self._memory.clear()


def _discard(entry: str) -> None:
    """Remove a corrupted entry: rename it away first (atomic, so no other process ever
    sees it half deleted), then delete the renamed copy."""
    trash = f"{entry}.corrupt-{os.getpid()}-{threading.get_ident()}"
    try:
        os.rename(entry, trash)
    except OSError:
        return  # already gone (another process discarded it) or not ours to move
    shutil.rmtree(trash, ignore_errors=True)


_CACHES: dict[str, KernelCache] = {}


def default_cache() -> KernelCache:
    """The process-wide cache for the current BLOCKSCALE_CACHE_DIR."""
    directory = default_cache_dir()
    cache = _CACHES.get(directory)
    if cache is None:
        cache = _CACHES[directory] = KernelCache(directory)
    return cache


def describe(kernel: Kernel) -> dict[str, Any]:
    """A short JSON-able summary of a kernel (for the CLI and logs)."""
    return {"name": kernel.name, "target": kernel.target.name, "block": kernel.block,
            "stages": list(kernel.asm), **{k: kernel.meta.get(k) for k in
                                           ("registers", "spill_stores", "spill_loads",
                                            "static_shared_bytes", "compile_seconds")}}
