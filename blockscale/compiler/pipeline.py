"""Staged compilation of a kernel module to a cubin or hsaco.

Stages (each kept in ``Kernel.asm`` under its name)::

    mlir      the kernel module as built (gpu.module + gpu.func), what the interpreter runs
    lowered   after the MLIR pass pipeline (LLVM/NVVM/ROCDL dialects)
    llvm      LLVM IR of the gpu.module (mlir.dialects.llvm.translate_module_to_llvmir)
    ptx       PTX (gpu-module-to-binary{format=isa}, in-process NVPTX)       [cuda]
    cubin     ptxas -v -arch=<chip>                                            [cuda]
    amdgcn    llc -filetype=asm                                                [hip]
    hsaco     llc -filetype=obj | ld.lld -shared                               [hip]
    sass      cuobjdump -sass / llvm-objdump -d, computed lazily on first access

Pass pipelines are lists of pass-fragment strings per backend (:func:`pass_pipeline`), joined
into ``builtin.module(...)`` only when run. MLIR failures raise :class:`CompilationError` with
the diagnostics and a runnable repro command.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from blockscale.compiler import toolchain
from blockscale.compiler.config import knobs
from blockscale.compiler.errors import (
    CompilationError,
    format_diagnostic,
    write_repro_file,
)
from blockscale.compiler.targets import GPUTarget
from blockscale.launch import KernelArg, KernelBinary

#: file extension of each stage in dumps.
STAGE_EXTENSIONS = {"mlir": "mlir", "lowered": "mlir", "llvm": "ll", "ptx": "ptx",
                    "amdgcn": "s", "cubin": "cubin", "hsaco": "hsaco", "sass": "sass"}


def pass_pipeline(target: GPUTarget | str) -> list[str]:
    """The MLIR pass fragments that take a kernel module to the LLVM dialect for ``target``."""
    target = GPUTarget.parse(target)
    fragments = ["gpu.module(canonicalize,cse)", "gpu.module(convert-scf-to-cf)"]
    if target.is_cuda:  # nvgpu TMA / mbarrier ops (no-ops for kernels without them)
        fragments.append("gpu.module(convert-nvgpu-to-nvvm)")
    fragments.append(f"gpu.module({target.lower_to_llvm_pass()})")
    if target.is_cuda:  # NVVM ops without an LLVM intrinsic (mbarrier.try_wait.parity) -> PTX
        fragments.append("gpu.module(convert-nvvm-to-llvm)")
    return fragments + ["gpu.module(canonicalize,cse)", "reconcile-unrealized-casts"]


def ptx_pipeline() -> str:
    """The fragment producing PTX from the lowered module (NVPTX is built into the bindings)."""
    return "gpu-module-to-binary{format=isa}"


def join_pipeline(fragments: Sequence[str]) -> str:
    """``builtin.module(<f1>,<f2>,...)``."""
    return "builtin.module(" + ",".join(fragments) + ")"


class _Stages(dict):
    """``Kernel.asm``: a dict of stage -> text/bytes that computes "sass" on first access."""

    def __init__(self, *args: Any, binary_kind: str = "cubin", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.binary_kind = binary_kind

    def __missing__(self, key: str) -> Any:
        if key in ("sass", "disasm") and self.binary_kind in self:
            text = toolchain.disassemble(self[self.binary_kind], self.binary_kind)
            self[key] = text
            return text
        raise KeyError(f"no stage {key!r}; stages: {sorted(self) + ['sass']}")


@dataclasses.dataclass
class Kernel:
    """A compiled kernel: every stage in ``asm``, the launch binary and metadata.

    ``meta`` holds: kernel name, target, registers and spill bytes (from ``ptxas -v`` or the
    AMDGCN asm), static shared memory, dynamic shared memory, block, compile seconds, tool
    versions.
    """

    name: str
    target: GPUTarget
    args: tuple[KernelArg, ...]
    block: tuple[int, int, int]
    asm: dict[str, Any]
    meta: dict[str, Any]
    dynamic_shared_bytes: int = 0

    @property
    def binary(self) -> KernelBinary:
        """The :class:`blockscale.launch.KernelBinary` the runtime launches."""
        kind = self.target.binary_kind
        return KernelBinary(name=self.name, target=self.target.name, binary_kind=kind,
                            binary=self.asm[kind], args=self.args, block=self.block,
                            dynamic_shared_bytes=self.dynamic_shared_bytes,
                            mlir=self.asm["mlir"], meta=dict(self.meta))

    def stages(self) -> list[str]:
        """Names of the stages available (sass/disasm computed on demand)."""
        return list(self.asm)


# ----------------------------------------------------------------------------- MLIR stages


def _run_passes(text: str, pipeline: str, *, kernel_name: str, stage: str,
                passes_dir: str | None = None, repro_dir: str | None = None) -> Any:
    """Parse ``text`` in a fresh context and run ``pipeline`` on it; return the module."""
    from mlir import ir, passmanager

    ctx = ir.Context()
    handled: list[str] = []

    def on_diagnostic(diag: Any) -> bool:
        handled.extend(format_diagnostic(diag))
        return True

    handler = ctx.attach_diagnostic_handler(on_diagnostic)
    try:
        with ctx:
            module = ir.Module.parse(text)
            pm = passmanager.PassManager.parse(pipeline)
            if passes_dir:
                os.makedirs(passes_dir, exist_ok=True)
                pm.enable_ir_printing(print_after_all=True, tree_printing_dir_path=passes_dir)
            pm.run(module.operation)
            return module
    except ir.MLIRError as e:
        diags = [line for d in e.error_diagnostics for line in format_diagnostic(d)]
        repro = write_repro_file(text, kernel_name, repro_dir)
        raise CompilationError(f"{stage}: MLIR pass pipeline failed for kernel "
                               f"{kernel_name!r}", stage=stage, diagnostics=diags or handled,
                               repro_file=repro, pipeline=pipeline) from None
    except ValueError as e:  # a pipeline string that does not parse
        repro = write_repro_file(text, kernel_name, repro_dir)
        raise CompilationError(f"{stage}: invalid pass pipeline {pipeline!r}: {e}",
                               stage=stage, diagnostics=handled, repro_file=repro,
                               pipeline=pipeline) from None
    finally:
        handler.detach()


def _gpu_module_op(module: Any) -> Any:
    for op in module.body.operations:
        if op.operation.name in ("gpu.module", "gpu.binary"):
            return op
    raise CompilationError("module has no gpu.module", stage="lowered")


def _check_fully_lowered(module: Any, target: GPUTarget, kernel_name: str, mlir_text: str,
                         pipeline: str, repro_dir: str | None) -> None:
    """Raise CompilationError when ops outside the LLVM-level dialects of ``target`` survive
    the pipeline: translating them fails, and a wrong-target intrinsic aborts the process
    inside LLVM codegen."""
    from mlir import ir

    allowed = ("llvm", "builtin", "nvvm" if target.is_cuda else "rocdl")

    leftovers: list[str] = []

    def visit(op: Any) -> Any:
        name = op.name
        if name not in ("gpu.module", "gpu.binary") and \
                name.split(".")[0] not in allowed:
            leftovers.append(f"{op.location}: {name}")
        return ir.WalkResult.ADVANCE

    gmod = _gpu_module_op(module)
    with module.context:
        gmod.operation.walk(visit)
    if leftovers:
        repro = write_repro_file(mlir_text, kernel_name, repro_dir)
        raise CompilationError(
            f"lowered: the pass pipeline left {len(leftovers)} op(s) outside the LLVM-level "
            f"dialects {allowed} in kernel {kernel_name!r}", stage="lowered",
            diagnostics=[f"{x}: not lowered" for x in leftovers[:20]], repro_file=repro,
            pipeline=pipeline)


def _translate_to_llvm_ir(module: Any, target: GPUTarget) -> str:
    """LLVM IR of the (lowered) gpu.module: its body cloned into a builtin module carrying
    the target triple and data layout, then translated."""
    from mlir import ir
    from mlir.dialects.llvm import translate_module_to_llvmir

    with module.context, ir.Location.unknown():
        gmod = _gpu_module_op(module)
        out = ir.Module.create()
        out.operation.attributes["llvm.target_triple"] = ir.StringAttr.get(target.triple)
        if "llvm.data_layout" in gmod.attributes:
            out.operation.attributes["llvm.data_layout"] = gmod.attributes["llvm.data_layout"]
        with ir.InsertionPoint(out.body):
            for op in gmod.regions[0].blocks[0].operations:
                op.clone()
        try:
            return str(translate_module_to_llvmir(out.operation))
        except ir.MLIRError as e:
            diags = [line for d in e.error_diagnostics for line in format_diagnostic(d)]
            raise CompilationError("llvm: translation to LLVM IR failed", stage="llvm",
                                   diagnostics=diags) from None


def _ptx_of(lowered_text: str, kernel_name: str, repro_dir: str | None) -> str:
    from mlir.dialects import gpu

    module = _run_passes(lowered_text, join_pipeline([ptx_pipeline()]),
                         kernel_name=kernel_name, stage="ptx", repro_dir=repro_dir)
    with module.context:
        binary = _gpu_module_op(module)
        obj = gpu.ObjectAttr(binary.attributes["objects"][0])
        return obj.object.decode("utf-8")


# ----------------------------------------------------------------------------- metadata


def parse_ptxas_log(log: str) -> dict[str, int]:
    """registers, spill_stores, spill_loads, stack_frame, static_shared_bytes, barriers from
    ``ptxas -v`` output."""
    meta: dict[str, int] = {}
    patterns = {
        "registers": r"Used (\d+) registers",
        "barriers": r"used (\d+) barriers",
        "stack_frame": r"(\d+) bytes stack frame",
        "spill_stores": r"(\d+) bytes spill stores",
        "spill_loads": r"(\d+) bytes spill loads",
        "static_shared_bytes": r"(\d+) bytes smem",
    }
    for key, pat in patterns.items():
        m = re.search(pat, log)
        meta[key] = int(m.group(1)) if m else 0
    return meta


def parse_amdgcn_asm(asm: str) -> dict[str, int]:
    """vgprs, sgprs, scratch (spill) bytes, static LDS bytes from llc's AMDGCN asm."""
    meta: dict[str, int] = {}
    patterns = {
        "registers": r"; NumVgprs:\s+(\d+)",
        "sgprs": r"; NumSgprs:\s+(\d+)",
        "agprs": r"; NumAgprs:\s+(\d+)",
        "scratch_bytes": r"; ScratchSize:\s+(\d+)",
        "static_shared_bytes": r"; LDSByteSize:\s+(\d+)",
        "occupancy": r"; Occupancy:\s+(\d+)",
    }
    for key, pat in patterns.items():
        m = re.search(pat, asm)
        meta[key] = int(m.group(1)) if m else 0
    meta["spill_stores"] = len(re.findall(r"Spill", asm)) and meta["scratch_bytes"]
    return meta


# ----------------------------------------------------------------------------- driver


def dump_directory(kernel_name: str, target: GPUTarget, dump_dir: str | None = None) -> str | None:
    """``<dump_dir>/<kernel>/<target>`` when dumping is on (argument or BLOCKSCALE_DUMP_DIR)."""
    base = dump_dir or knobs.dump_dir
    return os.path.join(base, kernel_name, target.name) if base else None


def dump_kernel(kernel: Kernel, directory: str, *, note: str = "") -> None:
    """Write every stage of ``kernel`` as ``NN_<stage>.<ext>`` plus ``meta.json``."""
    os.makedirs(directory, exist_ok=True)
    for i, stage in enumerate(kernel.asm):
        data = kernel.asm[stage]
        path = os.path.join(directory, f"{i:02d}_{stage}.{STAGE_EXTENSIONS.get(stage, 'txt')}")
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    meta = dict(kernel.meta)
    if note:
        meta["dump_note"] = note
    with open(os.path.join(directory, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


def module_text(module: Any, *, debug_info: bool = True) -> str:
    """The module as text (with ``loc(...)`` source locations when ``debug_info``)."""
    return module.operation.get_asm(enable_debug_info=debug_info)


def compile_module(module: Any, target: GPUTarget | str, *, kernel_name: str,
                   args: Sequence[KernelArg], block: Sequence[int],
                   dynamic_shared_bytes: int = 0, passes: Sequence[str] | None = None,
                   dump_dir: str | None = None) -> Kernel:
    """Compile a kernel module (``ir.Module`` or its text) for ``target``.

    ``passes`` overrides :func:`pass_pipeline` (for experiments and tests). Every stage is
    dumped when ``dump_dir`` or BLOCKSCALE_DUMP_DIR is set; with BLOCKSCALE_DUMP_PASSES=1
    the IR after every pass goes to ``<dump>/passes/``.
    """
    target = GPUTarget.parse(target)
    block3 = tuple(int(b) for b in block) + (1,) * (3 - len(block))
    if len(block3) != 3:
        raise ValueError(f"block must have at most 3 dims, got {tuple(block)}")
    t0 = time.perf_counter()
    if isinstance(module, str):
        mlir_text = module
    else:
        module.operation.verify()
        mlir_text = module_text(module)
    dump = dump_directory(kernel_name, target, dump_dir)
    passes_dir = os.path.join(dump, "passes") if dump and knobs.dump_passes else None
    fragments = list(passes) if passes is not None else pass_pipeline(target)
    pipeline = join_pipeline(fragments)

    asm = _Stages(binary_kind=target.binary_kind)
    asm["mlir"] = mlir_text
    meta: dict[str, Any] = {"kernel": kernel_name, "target": target.name,
                            "block": list(block3), "pipeline": pipeline,
                            "dynamic_shared_bytes": int(dynamic_shared_bytes)}
    try:
        lowered = _run_passes(mlir_text, pipeline, kernel_name=kernel_name, stage="lowered",
                              passes_dir=passes_dir, repro_dir=dump)
        asm["lowered"] = module_text(lowered, debug_info=False)
        _check_fully_lowered(lowered, target, kernel_name, mlir_text, pipeline, dump)
        asm["llvm"] = _translate_to_llvm_ir(lowered, target)
        if target.is_cuda:
            asm["ptx"] = _ptx_of(asm["lowered"], kernel_name, dump)
            cubin, log = toolchain.ptxas(asm["ptx"], target.chip)
            asm["cubin"] = cubin
            meta["ptxas_log"] = log
            meta.update(parse_ptxas_log(log))
        else:
            asm["amdgcn"] = toolchain.llc_amdgcn(asm["llvm"], target.chip, target.triple,
                                                 filetype="asm").decode("utf-8")
            obj = toolchain.llc_amdgcn(asm["llvm"], target.chip, target.triple,
                                       filetype="obj")
            asm["hsaco"] = toolchain.lld_shared(obj)
            meta.update(parse_amdgcn_asm(asm["amdgcn"]))
    finally:
        if dump:  # dump whatever stages exist, also when a later stage failed
            dump_kernel(Kernel(kernel_name, target, tuple(args), block3, asm, meta), dump)
    meta["toolchain"] = dict(toolchain.toolchain_versions(target.backend))
    meta["compile_seconds"] = round(time.perf_counter() - t0, 4)
    return Kernel(kernel_name, target, tuple(args), block3, asm, meta,
                  int(dynamic_shared_bytes))
