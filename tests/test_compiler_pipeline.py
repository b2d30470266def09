"""Staged lowering to cubin / hsaco, inspection, dumps, repro (tier lower: real toolchain)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time

import pytest

from blockscale.compiler.targets import TARGETS, GPUTarget
from tests._compiler_helpers import fresh_cache, skip_unless_toolchain  # noqa: F401

pytestmark = pytest.mark.lower

ALL_TARGETS = [t.name for t in TARGETS]


@pytest.fixture(scope="module")
def compiled():
    """The interleave kernel compiled once per target (cache disabled: real compiles)."""
    from blockscale.ops import interleave

    out = {}
    mp = pytest.MonkeyPatch()
    mp.setenv("BLOCKSCALE_DISABLE_CACHE", "1")
    mp.delenv("BLOCKSCALE_DUMP_DIR", raising=False)
    try:
        for name in ALL_TARGETS:
            t = GPUTarget.parse(name)
            from blockscale.compiler import toolchain

            if (toolchain.cuda_tools_reason() if t.is_cuda else toolchain.amdgpu_tools_reason()):
                continue
            t0 = time.perf_counter()
            out[name] = (interleave.kernel("uint8", target=name), time.perf_counter() - t0)
    finally:
        mp.undo()
    return out


def _get(compiled, name):
    skip_unless_toolchain(name)
    return compiled[name][0]


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_every_stage_is_kept(compiled, target):
    k = _get(compiled, target)
    t = GPUTarget.parse(target)
    assert list(k.asm) == ["mlir", "lowered", "llvm", t.asm_stage, t.binary_kind]
    assert "gpu.func @block_scales_interleave" in k.asm["mlir"]
    assert "llvm.func @block_scales_interleave" in k.asm["lowered"]
    assert "define" in k.asm["llvm"] and "@block_scales_interleave" in k.asm["llvm"]
    b = k.binary
    assert (b.name, b.target, b.binary_kind, b.block) == \
        ("block_scales_interleave", target, t.binary_kind, (256, 1, 1))
    assert b.mlir == k.asm["mlir"] and b.binary == k.asm[t.binary_kind]
    assert k.meta["registers"] > 0 and k.meta["spill_stores"] == 0


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_cubin_and_sass(compiled, target):
    k = _get(compiled, target)
    assert f".target {target}" in k.asm["ptx"]
    assert re.search(r"st\.global\.v(4\.b32|2\.b64)", k.asm["ptx"])  # one 16-byte store
    assert k.asm["cubin"][:4] == b"\x7fELF"
    assert "Used" in k.meta["ptxas_log"] and k.meta["static_shared_bytes"] == 0
    sass = k.asm["sass"]
    assert "Function : block_scales_interleave" in sass
    assert "STG.E.128" in sass


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_hsaco_elf_note_symbol_and_disassembly(compiled, target):
    k = _get(compiled, target)
    hsaco = k.asm["hsaco"]
    assert hsaco[:4] == b"\x7fELF"
    assert f"amdgcn-amd-amdhsa--{target}".encode() in hsaco  # amdhsa.target in the note
    assert b"amdhsa.target" in hsaco and b"block_scales_interleave" in hsaco
    assert f'.amdgcn_target "amdgcn-amd-amdhsa--{target}"' in k.asm["amdgcn"]
    dis = k.asm["sass"]  # llvm-objdump -d for hsaco
    assert "<block_scales_interleave>:" in dis
    assert "store_dwordx4" in dis
    assert "__ockl" not in k.asm["llvm"]


def test_cold_compile_is_fast(compiled):
    skip_unless_toolchain("sm_90a")
    assert compiled["sm_90a"][1] < 2.0


@pytest.mark.usefixtures("fresh_cache")
def test_second_compile_is_a_cache_hit():
    skip_unless_toolchain("sm_90a")
    from blockscale.compiler import cache
    from blockscale.ops import interleave

    first = interleave.kernel("float8_e4m3fn", target="sm_90a")
    t0 = time.perf_counter()
    second = interleave.kernel("float8_e4m3fn", target="sm_90a")
    assert time.perf_counter() - t0 < 0.020
    assert second is first
    # a new process (empty memory front) reads it from disk, checksums verified
    cache.default_cache().clear_memory()
    t0 = time.perf_counter()
    third = interleave.kernel("float8_e4m3fn", target="sm_90a")
    assert time.perf_counter() - t0 < 0.020
    assert third is not first and third.asm["cubin"] == first.asm["cubin"]
    assert third.asm["mlir"] == first.asm["mlir"]


@pytest.mark.usefixtures("fresh_cache")
def test_dump_every_stage_also_on_cache_hit(tmp_path, monkeypatch):
    skip_unless_toolchain("sm_90a")
    from blockscale.ops import interleave

    interleave.kernel("uint8", target="sm_90a")  # warm the cache
    dump = tmp_path / "dump"
    monkeypatch.setenv("BLOCKSCALE_DUMP_DIR", str(dump))
    interleave.kernel("uint8", target="sm_90a")  # a hit: still dumped
    d = dump / "block_scales_interleave" / "sm_90a"
    names = sorted(os.listdir(d))
    assert names[:5] == ["00_mlir.mlir", "01_lowered.mlir", "02_llvm.ll", "03_ptx.ptx",
                         "04_cubin.cubin"]
    assert "cache hit" in (d / "meta.json").read_text()
    assert 'loc("' in (d / "00_mlir.mlir").read_text()  # source locations in the dump


@pytest.mark.usefixtures("fresh_cache")
def test_dump_passes_writes_ir_after_every_pass(tmp_path, monkeypatch):
    skip_unless_toolchain("gfx950")
    from blockscale.ops import interleave

    monkeypatch.setenv("BLOCKSCALE_DUMP_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("BLOCKSCALE_DUMP_PASSES", "1")
    interleave.kernel("uint8", target="gfx950")
    passes = tmp_path / "d" / "block_scales_interleave" / "gfx950" / "passes"
    files = [os.path.join(r, f) for r, _, fs in os.walk(passes) for f in fs]
    assert any("convert-gpu-to-rocdl" in f for f in files), files
    assert any("reconcile-unrealized-casts" in f for f in files), files


def test_broken_pipeline_raises_with_runnable_repro(tmp_path):
    skip_unless_toolchain("sm_90a")
    from blockscale.compiler import errors, pipeline
    from blockscale.compiler.errors import CompilationError
    from blockscale.ops import interleave

    spec = interleave.InterleaveSpec("uint8", "sm_90a")
    module = interleave.build(spec)
    # the bare-pointer calling convention cannot lower dynamic memref<?xi8> params: fails
    broken = ["gpu.module(convert-scf-to-cf)",
              "gpu.module(convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1})",
              "reconcile-unrealized-casts"]
    with pytest.raises(CompilationError) as info:
        pipeline.compile_module(module, "sm_90a", kernel_name=spec.kernel_name,
                                args=spec.args(), block=spec.block, passes=broken,
                                dump_dir=str(tmp_path))
    err = info.value
    assert err.stage == "lowered" and err.diagnostics
    assert os.path.exists(err.repro_file) and "repro" in err.repro_command
    assert err.pipeline == pipeline.join_pipeline(broken)
    proc = subprocess.run(shlex.split(err.repro_command) + ["--quiet"], check=False,
                          capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert err.diagnostics[0].split(": ", 1)[1] in proc.stderr
    # the correct pipeline on the same file succeeds
    ok = subprocess.run(shlex.split(errors.repro_command(
        err.repro_file, pipeline.join_pipeline(pipeline.pass_pipeline("sm_90a")))),
        check=False, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "llvm.func @block_scales_interleave" in ok.stdout


def test_incomplete_lowering_is_a_compilation_error():
    skip_unless_toolchain("sm_90a")
    from blockscale.compiler import pipeline
    from blockscale.compiler.errors import CompilationError
    from blockscale.ops import interleave

    spec = interleave.InterleaveSpec()
    incomplete = ["gpu.module(convert-gpu-to-nvvm)", "reconcile-unrealized-casts"]  # no scf->cf
    with pytest.raises(CompilationError, match="outside the LLVM-level dialects") as info:
        pipeline.compile_module(interleave.build(spec), "sm_90a", kernel_name="k",
                                args=spec.args(), block=spec.block, passes=incomplete)
    assert any("scf." in d or "cf." in d for d in info.value.diagnostics)
    assert info.value.repro_command


def test_wrong_target_lowering_is_caught_before_llvm_codegen():
    skip_unless_toolchain("sm_90a")
    from blockscale.compiler import pipeline
    from blockscale.compiler.errors import CompilationError
    from blockscale.ops import interleave

    spec = interleave.InterleaveSpec()
    amd_passes = pipeline.pass_pipeline("gfx950")  # ROCDL intrinsics in a CUDA kernel
    with pytest.raises(CompilationError, match="outside the LLVM-level dialects"):
        pipeline.compile_module(interleave.build(spec), "sm_90a", kernel_name="k",
                                args=spec.args(), block=spec.block, passes=amd_passes)


def test_unparsable_pipeline_is_a_compilation_error():
    skip_unless_toolchain("sm_90a")
    from blockscale.compiler import pipeline
    from blockscale.compiler.errors import CompilationError
    from blockscale.ops import interleave

    spec = interleave.InterleaveSpec()
    with pytest.raises(CompilationError, match="no-such-pass|invalid pass pipeline"):
        pipeline.compile_module(interleave.build(spec), "sm_90a", kernel_name="k",
                                args=spec.args(), block=spec.block, passes=["no-such-pass"])


def test_ptxas_failure_carries_command_and_log():
    skip_unless_toolchain("sm_90a")
    from blockscale.compiler import toolchain
    from blockscale.compiler.errors import CompilationError

    with pytest.raises(CompilationError) as info:
        toolchain.ptxas(".version 8.6\n.target sm_90a\n.address_size 64\nbogus;\n", "sm_90a")
    assert info.value.stage == "cubin" and "ptxas" in info.value.command[0]
    assert "bogus" in info.value.log or "syntax" in info.value.log.lower()
