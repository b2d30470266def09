"""The on-disk kernel cache survives races and corruption (blockscale.compiler.cache).

* 8 processes compiling the same kernels into one empty cache directory at the same moment
  all succeed, and the entries left behind are complete (every checksum verifies);
* a truncated, bit-flipped, or half-deleted entry is detected by its checksums (a warning),
  rebuilt, and left intact again;
* a cache directory that cannot be created or written (here: a path under a regular FILE,
  which even root cannot turn into a directory) falls back to a temporary directory with a
  warning, and compiling still works.

Kernels: the interleave kernel (uint8, e8m0) for sm_90a — the cheapest real compile.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

pytest.importorskip("mlir")

from blockscale.compiler import cache as kcache  # noqa: E402
from blockscale.ops import _core  # noqa: E402
from blockscale.ops.interleave import InterleaveSpec  # noqa: E402

pytestmark = pytest.mark.lower
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = [InterleaveSpec("uint8", "sm_90a"), InterleaveSpec("float8_e8m0fnu", "sm_90a")]


def _entries(directory: str) -> list[str]:
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(directory, "*", "*",
                                                                     "meta.json")))


def _verify(entry: str) -> None:
    """Every file the entry's meta.json lists exists with the recorded size and sha256."""
    import hashlib

    with open(os.path.join(entry, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    assert meta["files"], entry
    for stage, (fname, digest, size) in meta["files"].items():
        with open(os.path.join(entry, fname), "rb") as f:
            data = f.read()
        assert len(data) == size and hashlib.sha256(data).hexdigest() == digest, (entry, stage)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("BLOCKSCALE_CACHE_DIR", str(d))
    monkeypatch.delenv("BLOCKSCALE_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("BLOCKSCALE_DUMP_DIR", raising=False)
    _core.clear_memory()
    yield str(d)
    kcache._CACHES.pop(str(d), None)
    _core.clear_memory()


def _compile(spec):
    kcache.default_cache().clear_memory()
    return _core.compile_kernel(spec)


_WORKER = textwrap.dedent("""
    import os, sys, time
    start = sys.argv[1]
    from blockscale.ops import _core
    from blockscale.ops.interleave import InterleaveSpec
    while not os.path.exists(start):   # all workers compile at the same moment
        time.sleep(0.005)
    for dtype in ("uint8", "float8_e8m0fnu"):
        k = _core.compile_kernel(InterleaveSpec(dtype, "sm_90a"))
        print(dtype, len(k.binary.binary))
""")


def test_eight_processes_compile_same_kernels(cache_dir, tmp_path):
    start = str(tmp_path / "go")
    env = {**os.environ, "BLOCKSCALE_CACHE_DIR": cache_dir, "PYTHONPATH": ROOT,
           "PYTHONWARNINGS": "error::RuntimeWarning"}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, start], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    open(start, "w").close()
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
        assert "cache directory" not in err and "corrupted" not in err, err[-2000:]
        assert len(out.split()) == 4
    binaries = {tuple(out.split()) for out, _ in results}
    assert len(binaries) == 1, binaries  # every process got the same kernels
    entries = _entries(cache_dir)
    assert len(entries) == 2, entries
    for e in entries:
        _verify(e)
    leftovers = [p for p in glob.glob(os.path.join(cache_dir, "*", "*")) if p not in entries]
    assert leftovers == [], leftovers  # no temporary or half-written directories remain
    with warnings.catch_warnings():  # and they load cleanly in this process
        warnings.simplefilter("error")
        for spec in SPECS:
            assert _compile(spec).binary.binary


def _only_entry(cache_dir: str) -> str:
    (entry,) = _entries(cache_dir)
    return entry


@pytest.mark.parametrize("damage", ["truncate_binary", "flip_ptx_byte", "drop_llvm_file",
                                    "garbage_meta", "meta_wrong_shape", "drop_meta"])
def test_damaged_entry_is_detected_and_rebuilt(cache_dir, damage):
    good = _compile(SPECS[0])
    entry = _only_entry(cache_dir)
    with open(os.path.join(entry, "meta.json"), encoding="utf-8") as f:
        files = {stage: fname for stage, (fname, _, _) in json.load(f)["files"].items()}
    path = {"truncate_binary": files["cubin"], "flip_ptx_byte": files["ptx"],
            "drop_llvm_file": files["llvm"]}.get(damage, "meta.json")
    path = os.path.join(entry, path)
    if damage == "truncate_binary":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif damage == "flip_ptx_byte":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x01]))
    elif damage in ("drop_llvm_file", "drop_meta"):
        os.unlink(path)
    elif damage == "garbage_meta":
        with open(path, "w") as f:
            f.write('{"format": 1, "key": ')
    else:
        with open(path, "w") as f:
            json.dump([1, 2, 3], f)
    with pytest.warns(RuntimeWarning, match="corrupted"):
        rebuilt = _compile(SPECS[0])
    assert rebuilt.binary.binary == good.binary.binary
    _verify(_only_entry(cache_dir))  # the entry is whole again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compile(SPECS[0]).binary.binary == good.binary.binary  # a clean hit now


def test_cache_dir_under_a_regular_file_falls_back_with_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a regular file")
    bad = str(blocker / "cache")
    monkeypatch.setenv("BLOCKSCALE_CACHE_DIR", bad)
    _core.clear_memory()
    try:
        with pytest.warns(RuntimeWarning, match="not writable") as rec:
            kernel = _compile(SPECS[1])
        assert kernel.binary.binary
        assert bad in str(rec[0].message)
        store = kcache.default_cache()
        assert store.directory != bad and os.path.isdir(store.directory)
        _verify(_only_entry(store.directory))  # the entry went to the fallback directory
        assert blocker.read_text() == "a regular file"
    finally:
        fallback = kcache._CACHES.pop(bad, None)
        if fallback is not None and fallback.directory != bad:
            import shutil

            shutil.rmtree(fallback.directory, ignore_errors=True)
        _core.clear_memory()


def test_store_publishes_whole_entries_only(cache_dir):
    """A second writer of an existing valid entry keeps it (no error, no duplicate)."""
    k = _compile(SPECS[0])
    store = kcache.default_cache()
    (key,) = [os.path.basename(e) for e in _entries(cache_dir)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.put(key, k)  # races with itself: the rename finds the entry in place
    assert len(_entries(cache_dir)) == 1
    assert os.listdir(os.path.dirname(_only_entry(cache_dir))) == [key]
    _verify(_only_entry(cache_dir))
