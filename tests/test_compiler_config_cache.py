"""Env knobs (docs/env.md), toolchain discovery, the on-disk kernel cache."""

from __future__ import annotations

import os
import pathlib

import pytest

from tests._compiler_helpers import skip_unless_toolchain

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_docs_env_md_matches_the_registry():
    from blockscale.compiler import config

    assert (ROOT / "docs" / "env.md").read_text() == config.env_markdown(), \
        "regenerate docs/env.md from blockscale.compiler.config.env_markdown()"


def test_knobs_are_typed_and_read_at_use(monkeypatch):
    from blockscale.compiler import config

    monkeypatch.setenv("BLOCKSCALE_DISABLE_CACHE", "yes")
    assert config.knobs.disable_cache is True
    monkeypatch.setenv("BLOCKSCALE_DISABLE_CACHE", "maybe")
    with pytest.raises(ValueError, match="BLOCKSCALE_DISABLE_CACHE must be one of"):
        config.knobs.disable_cache  # noqa: B018
    monkeypatch.delenv("BLOCKSCALE_DISABLE_CACHE")
    assert config.knobs.disable_cache is False
    text = config.help()
    assert all(k.name in text for k in config.knobs.all())


def test_bad_ptxas_override_is_a_clear_error(monkeypatch):
    from blockscale.compiler import toolchain
    from blockscale.compiler.errors import ToolNotFoundError

    monkeypatch.setenv("BLOCKSCALE_PTXAS", "/nonexistent/ptxas")
    toolchain.clear_caches()
    try:
        with pytest.raises(ToolNotFoundError, match="BLOCKSCALE_PTXAS"):
            toolchain.find_cuda_tool("ptxas")
    finally:
        monkeypatch.delenv("BLOCKSCALE_PTXAS")
        toolchain.clear_caches()


@pytest.mark.lower
def test_toolchain_versions_are_found():
    skip_unless_toolchain("sm_90a")
    from blockscale.compiler import toolchain

    versions = dict(toolchain.toolchain_versions("cuda"))
    assert "release" in versions["ptxas"] and versions["mlir-bindings"]


def _kernel():
    from blockscale.compiler import pipeline
    from blockscale.compiler.targets import GPUTarget
    from blockscale.launch import KernelArg

    asm = pipeline._Stages({"mlir": "module {}", "lowered": "x", "llvm": "y", "ptx": "p",
                            "cubin": b"\x7fELF-cubin-bytes"}, binary_kind="cubin")
    return pipeline.Kernel("k", GPUTarget.parse("sm_90a"),
                           (KernelArg("a", "buffer", "uint8"),), (32, 1, 1), asm,
                           {"registers": 3})


@pytest.mark.ir
def test_cache_roundtrip_and_corruption(tmp_path):
    from blockscale.compiler.cache import KernelCache, cache_key

    key = cache_key("op-1", "sm_90a", ["p"], [("ptxas", "v")])
    assert key != cache_key("op-1", "sm_100a", ["p"], [("ptxas", "v")])
    assert key != cache_key("op-1", "sm_90a", ["p"], [("ptxas", "v2")])
    KernelCache(str(tmp_path)).put(key, _kernel())
    got = KernelCache(str(tmp_path)).get(key)  # fresh memory front: from disk
    assert got.asm["cubin"] == b"\x7fELF-cubin-bytes" and got.meta == {"registers": 3}
    assert got.binary.args == _kernel().args
    cubin = tmp_path / key[:2] / key / "cubin.cubin"
    cubin.write_bytes(b"\x7fELF-cub")  # truncated
    with pytest.warns(RuntimeWarning, match="corrupted"):
        assert KernelCache(str(tmp_path)).get(key) is None
    assert not (tmp_path / key[:2] / key).exists()  # removed, will be rebuilt


@pytest.mark.ir
def test_unwritable_cache_dir_falls_back_to_temp(tmp_path):
    from blockscale.compiler.cache import KernelCache

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = KernelCache(str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="not writable"):
        cache.put("ab" * 32, _kernel())
    assert cache.directory != str(blocker / "cache") and os.path.isdir(cache.directory)
    cache.clear_memory()
    assert cache.get("ab" * 32).asm["ptx"] == "p"
