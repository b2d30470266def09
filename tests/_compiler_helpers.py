"""Shared fixtures and skip helpers of the compiler/interleave tests (not a test module)."""

from __future__ import annotations

import pytest


def amdgpu_skip_reason() -> str | None:
    """None when llc/ld.lld with AMDGPU are found, else a skip message saying how to enable."""
    from blockscale.compiler import toolchain

    reason = toolchain.amdgpu_tools_reason()
    return None if reason is None else f"AMD lowering tests disabled: {reason}"


def ptxas_skip_reason() -> str | None:
    from blockscale.compiler import toolchain

    reason = toolchain.cuda_tools_reason()
    return None if reason is None else f"CUDA lowering tests disabled: {reason}"


def skip_unless_toolchain(target_name: str) -> None:
    """pytest.skip with the how-to-enable message when ``target_name``'s tools are missing."""
    from blockscale.compiler.targets import GPUTarget

    target = GPUTarget.parse(target_name)
    reason = ptxas_skip_reason() if target.is_cuda else amdgpu_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty on-disk cache in tmp_path, no bundle dir, no dumps; returns the cache dir."""
    from blockscale.ops import _core

    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("BLOCKSCALE_CACHE_DIR", str(cache_dir))
    for var in ("BLOCKSCALE_DUMP_DIR", "BLOCKSCALE_DUMP_PASSES", "BLOCKSCALE_DISABLE_CACHE",
                "BLOCKSCALE_BUNDLE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # no ./build/gpu bundle
    _core.clear_memory()
    yield cache_dir
    _core.clear_memory()
