"""GPU targets: the single place where architecture strings live.

A :class:`GPUTarget` is a frozen description of one compilation target: backend ("cuda" or
"hip"), chip, LLVM features (the PTX ISA version for NVPTX), warp size, the kind of binary the
toolchain produces and the name of the assembly stage. Everything else in the package takes a
``GPUTarget`` (or a name accepted by :meth:`GPUTarget.parse`) and never spells an arch itself.

This module does not import MLIR at import time; :meth:`GPUTarget.target_attr` does, lazily.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class GPUTarget:
    """One compilation target.

    Attributes:
        name: the public name ("sm_90a", "sm_100a", "gfx942", "gfx950").
        backend: "cuda" (NVVM -> PTX -> cubin) or "hip" (ROCDL -> AMDGCN -> hsaco).
        chip: the chip given to the MLIR target attribute, ptxas ``-arch`` or llc ``-mcpu``.
        features: LLVM target features (``+ptxNN`` selects the PTX ISA version on NVPTX).
        warp_size: threads per warp (32) or wavefront (64).
        triple: the LLVM target triple.
        description: the hardware, for humans.
    """

    name: str
    backend: str
    chip: str
    features: str
    warp_size: int
    triple: str
    description: str = ""

    @property
    def binary_kind(self) -> str:
        """"cubin" for CUDA targets, "hsaco" for HIP targets."""
        return "cubin" if self.backend == "cuda" else "hsaco"

    @property
    def asm_stage(self) -> str:
        """Name of the assembly stage in ``Kernel.asm``: "ptx" or "amdgcn"."""
        return "ptx" if self.backend == "cuda" else "amdgcn"

    @property
    def is_cuda(self) -> bool:
        return self.backend == "cuda"

    @property
    def is_hip(self) -> bool:
        return self.backend == "hip"

    @property
    def ptx_version(self) -> tuple[int, int] | None:
        """The PTX ISA version selected by ``features`` (e.g. (8, 6)), None for HIP."""
        for feat in self.features.split(","):
            if feat.startswith("+ptx"):
                digits = feat[4:]
                return int(digits[:-1]), int(digits[-1])
        return None

    def target_attr_text(self) -> str:
        """The MLIR target attribute of the gpu.module, as text.

        ``#nvvm.target<chip = "sm_90a", features = "+ptx86">`` or
        ``#rocdl.target<chip = "gfx950">``.
        """
        if self.is_cuda:
            return f'#nvvm.target<O = 3, chip = "{self.chip}", features = "{self.features}">'
        feats = f', features = "{self.features}"' if self.features else ""
        return f'#rocdl.target<O = 3, chip = "{self.chip}"{feats}>'

    def target_attr(self) -> Any:
        """The target attribute as an ``mlir.ir.Attribute`` in the current context."""
        from mlir import ir

        return ir.Attribute.parse(self.target_attr_text())

    def lower_to_llvm_pass(self) -> str:
        """The gpu.module-level pass converting gpu/arith/memref/vector to the LLVM dialect."""
        if self.is_cuda:
            return "convert-gpu-to-nvvm{index-bitwidth=64}"
        return f"convert-gpu-to-rocdl{{chipset={self.chip} index-bitwidth=64}}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, value: str | GPUTarget) -> GPUTarget:
        """Return the target named ``value`` (a GPUTarget is returned unchanged).

        Raises ValueError listing the known targets for an unknown name, TypeError for a
        value that is neither a string nor a GPUTarget.
        """
        if isinstance(value, GPUTarget):
            return value
        if not isinstance(value, str):
            raise TypeError(f"target must be a str or GPUTarget, got {type(value).__name__}: "
                            f"{value!r}")
        key = value.strip().lower()
        for target in TARGETS:
            if target.name == key:
                return target
        raise ValueError(f"target must be one of {[t.name for t in TARGETS]}, got {value!r}")


_NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
_AMDGCN_TRIPLE = "amdgcn-amd-amdhsa"

SM90A = GPUTarget("sm_90a", "cuda", "sm_90a", "+ptx86", 32, _NVPTX_TRIPLE,
                  "NVIDIA Hopper (H100/H200)")
SM100A = GPUTarget("sm_100a", "cuda", "sm_100a", "+ptx88", 32, _NVPTX_TRIPLE,
                   "NVIDIA Blackwell datacenter (B200)")
GFX942 = GPUTarget("gfx942", "hip", "gfx942", "", 64, _AMDGCN_TRIPLE, "AMD CDNA3 (MI300)")
GFX950 = GPUTarget("gfx950", "hip", "gfx950", "", 64, _AMDGCN_TRIPLE, "AMD CDNA4 (MI355X)")

#: Every supported target, CUDA first.
TARGETS: tuple[GPUTarget, ...] = (SM90A, SM100A, GFX942, GFX950)

#: The target the project's GPUs run (and the default when none is given).
DEFAULT_TARGET = SM90A


def target_for_cuda_capability(capability: tuple[int, int]) -> GPUTarget:
    """The CUDA target for a device of compute capability ``(major, minor)``: the exact
    arch-specific target when we have one (10.0 -> sm_100a), else sm_90a (what runs on 9.x)."""
    major, minor = capability
    for t in TARGETS:
        if t.is_cuda and t.chip == f"sm_{major}{minor}a":
            return t
    return SM90A


def target_for_amd_arch(arch: str) -> GPUTarget:
    """The HIP target for an AMD GPU arch name such as "gfx942:sramecc+:xnack-"."""
    base = arch.split(":")[0].strip().lower()
    for t in TARGETS:
        if t.is_hip and t.chip == base:
            return t
    raise ValueError(f"AMD GPU arch must be one of {[t.chip for t in TARGETS if t.is_hip]}, "
                     f"got {arch!r}")


def target_names() -> tuple[str, ...]:
    """Names of all targets, in TARGETS order."""
    return tuple(t.name for t in TARGETS)
