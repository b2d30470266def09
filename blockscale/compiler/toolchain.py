"""Discovery, versions and wrappers of the external tools: ptxas, cuobjdump, nvdisasm (CUDA);
llc, ld.lld, llvm-objdump with the AMDGPU target (HIP).

Discovery is ``functools.lru_cache``d; call :func:`clear_caches` after changing the
environment. Each wrapper runs one tool and raises :class:`CompilationError` with the command
and its log on failure, or :class:`ToolNotFoundError` saying how to install the tool.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

from blockscale.compiler.config import knobs
from blockscale.compiler.errors import CompilationError, ToolNotFoundError


@dataclasses.dataclass(frozen=True)
class Tool:
    """A found tool: its path and its version line."""

    name: str
    path: str
    version: str


_CUDA_HINT = ("install the `nvidia-cuda-nvcc`, `nvidia-cuda-cuobjdump` and "
              "`nvidia-cuda-nvdisasm` wheels (pip install -e .), or set CUDA_HOME / "
              "BLOCKSCALE_PTXAS")
_LLVM_HINT = ("install LLVM with the AMDGPU target (e.g. Debian/Ubuntu `llvm-22 lld-22`, "
              "`make amdgpu-tools`, or ROCm) or set BLOCKSCALE_LLVM_BIN to its bin directory")


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _wheel_cuda_bin_dirs() -> list[str]:
    """``site-packages/nvidia/cu*/bin`` of the running interpreter, newest CUDA first."""
    dirs: list[str] = []
    for base in sys.path:
        dirs.extend(sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "bin")), reverse=True))
    return dirs


def _cuda_dirs() -> list[str]:
    dirs = _wheel_cuda_bin_dirs()
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "bin"))
    return dirs


def _version_line(path: str, flag: str = "--version") -> str:
    try:
        out = subprocess.run([path, flag], check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    text = (out.stdout or out.stderr).strip().splitlines()
    for line in text:
        if "release" in line or "version" in line.lower():
            return line.strip()
    return text[-1].strip() if text else "unknown"


def _find_in(name: str, dirs: list[str]) -> str | None:
    for d in dirs:
        p = os.path.join(d, name)
        if _executable(p):
            return p
    return shutil.which(name)


@functools.cache
def find_cuda_tool(name: str) -> Tool | None:
    """``ptxas`` | ``cuobjdump`` | ``nvdisasm``: BLOCKSCALE_PTXAS (ptxas only, or its
    directory for the others), the nvidia wheels, CUDA_HOME, PATH."""
    dirs = []
    override = knobs.ptxas
    if override:
        if name == "ptxas":
            if not _executable(override):
                raise ToolNotFoundError(f"BLOCKSCALE_PTXAS={override!r} is not an executable")
            return Tool(name, override, _version_line(override))
        dirs.append(os.path.dirname(override))
    path = _find_in(name, dirs + _cuda_dirs())
    return Tool(name, path, _version_line(path)) if path else None


def _llvm_dirs() -> list[str]:
    dirs = []
    if knobs.llvm_bin:
        dirs.append(knobs.llvm_bin)
    if os.environ.get("ROCM_PATH"):
        dirs.append(os.path.join(os.environ["ROCM_PATH"], "llvm", "bin"))
    dirs.append("/opt/rocm/llvm/bin")

    def llvm_version(d: str) -> int:
        m = re.search(r"llvm-(\d+)", d)
        return int(m.group(1)) if m else 0

    dirs.extend(sorted(glob.glob("/usr/lib/llvm-*/bin"), key=llvm_version, reverse=True))
    path_dirs = os.environ.get("PATH", "").split(os.pathsep)
    return dirs + [d for d in path_dirs if d]


@functools.cache
def llvm_amdgpu_bin() -> str | None:
    """First LLVM bin directory whose ``llc --version`` lists the amdgcn target and which
    also holds ``ld.lld``."""
    for d in _llvm_dirs():
        llc = os.path.join(d, "llc")
        if not (_executable(llc) and _executable(os.path.join(d, "ld.lld"))):
            continue
        try:
            out = subprocess.run([llc, "--version"], check=False, capture_output=True, text=True,
                                 timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "amdgcn" in out:
            return d
    return None


@functools.cache
def find_llvm_tool(name: str) -> Tool | None:
    """``llc`` | ``ld.lld`` | ``llvm-objdump`` | ``opt`` from the AMDGPU-capable LLVM."""
    d = llvm_amdgpu_bin()
    if d is None:
        return None
    path = os.path.join(d, name)
    if not _executable(path):
        return None
    return Tool(name, path, _version_line(path))


def require_cuda_tool(name: str) -> Tool:
    tool = find_cuda_tool(name)
    if tool is None:
        raise ToolNotFoundError(f"{name} not found; {_CUDA_HINT}")
    return tool


def require_llvm_tool(name: str) -> Tool:
    tool = find_llvm_tool(name)
    if tool is None:
        raise ToolNotFoundError(f"{name} with the AMDGPU target not found; {_LLVM_HINT}")
    return tool


def amdgpu_tools_reason() -> str | None:
    """None when llc + ld.lld with AMDGPU are available, else how to get them."""
    if find_llvm_tool("llc") and find_llvm_tool("ld.lld"):
        return None
    return f"no llc/ld.lld with the AMDGPU target found; {_LLVM_HINT}"


def cuda_tools_reason() -> str | None:
    """None when ptxas is available, else how to get it."""
    return None if find_cuda_tool("ptxas") else f"ptxas not found; {_CUDA_HINT}"


def clear_caches() -> None:
    """Forget discovered tools (after changing BLOCKSCALE_PTXAS / BLOCKSCALE_LLVM_BIN...)."""
    find_cuda_tool.cache_clear()
    llvm_amdgpu_bin.cache_clear()
    find_llvm_tool.cache_clear()
    toolchain_versions.cache_clear()


@functools.cache
def toolchain_versions(backend: str) -> tuple[tuple[str, str], ...]:
    """(tool, version) pairs that determine the binaries of ``backend`` (for cache keys)."""
    names = ("ptxas",) if backend == "cuda" else ("llc", "ld.lld")
    finder = find_cuda_tool if backend == "cuda" else find_llvm_tool
    out = []
    for n in names:
        tool = finder(n)
        out.append((n, tool.version if tool else "missing"))
    try:
        from importlib.metadata import version

        out.append(("mlir-bindings", version("xtc-mlir-python-bindings")))
    except Exception:  # noqa: BLE001 - metadata missing in odd installs
        out.append(("mlir-bindings", "unknown"))
    return tuple(out)


# ----------------------------------------------------------------------------- wrappers


def run_tool(cmd: list[str], *, stage: str, input_name: str = "") -> str:
    """Run ``cmd``; return its combined output; raise CompilationError on failure."""
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    except OSError as e:
        raise CompilationError(f"{stage}: could not run {cmd[0]}: {e}", stage=stage,
                               command=cmd) from e
    log = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise CompilationError(f"{stage}: {os.path.basename(cmd[0])} failed with exit code "
                               f"{proc.returncode}{' on ' + input_name if input_name else ''}",
                               stage=stage, command=cmd, log=log)
    return log


def ptxas(ptx: str, chip: str, *, workdir: str | None = None) -> tuple[bytes, str]:
    """Assemble PTX into a cubin with ``ptxas -v``; return (cubin, the -v log)."""
    tool = require_cuda_tool("ptxas")
    with tempfile.TemporaryDirectory(prefix="blockscale-ptxas-", dir=workdir) as tmp:
        src, dst = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w", encoding="utf-8") as f:
            f.write(ptx)
        log = run_tool([tool.path, "-v", f"-arch={chip}", "-O3", "-o", dst, src], stage="cubin")
        with open(dst, "rb") as f:
            return f.read(), log


def llc_amdgcn(llvm_ir: str, chip: str, triple: str, *, filetype: str) -> bytes:
    """``llc -mtriple=<triple> -mcpu=<chip> -O3 -filetype=asm|obj``; returns the output."""
    tool = require_llvm_tool("llc")
    with tempfile.TemporaryDirectory(prefix="blockscale-llc-") as tmp:
        src, dst = os.path.join(tmp, "kernel.ll"), os.path.join(tmp, f"kernel.{filetype}")
        with open(src, "w", encoding="utf-8") as f:
            f.write(llvm_ir)
        run_tool([tool.path, f"-mtriple={triple}", f"-mcpu={chip}", "-O3",
                  f"-filetype={filetype}", src, "-o", dst],
                 stage="amdgcn" if filetype == "asm" else "hsaco")
        with open(dst, "rb") as f:
            return f.read()


def lld_shared(obj: bytes) -> bytes:
    """Link an AMDGPU object into a code object (hsaco) with ``ld.lld -shared``."""
    tool = require_llvm_tool("ld.lld")
    with tempfile.TemporaryDirectory(prefix="blockscale-lld-") as tmp:
        src, dst = os.path.join(tmp, "kernel.o"), os.path.join(tmp, "kernel.hsaco")
        with open(src, "wb") as f:
            f.write(obj)
        run_tool([tool.path, "-shared", src, "-o", dst], stage="hsaco")
        with open(dst, "rb") as f:
            return f.read()


def disassemble(binary: bytes, binary_kind: str) -> str:
    """SASS of a cubin (``cuobjdump -sass``, nvdisasm on PATH) or the AMDGCN disassembly of
    an hsaco (``llvm-objdump -d``)."""
    with tempfile.TemporaryDirectory(prefix="blockscale-dis-") as tmp:
        path = os.path.join(tmp, f"kernel.{binary_kind}")
        with open(path, "wb") as f:
            f.write(binary)
        if binary_kind == "cubin":
            cuobjdump = require_cuda_tool("cuobjdump")
            nvdisasm = require_cuda_tool("nvdisasm")
            env = dict(os.environ)
            env["PATH"] = os.path.dirname(nvdisasm.path) + os.pathsep + env.get("PATH", "")
            proc = subprocess.run([cuobjdump.path, "-sass", path], check=False, capture_output=True,
                                  text=True, env=env, timeout=120)
            cmd = [cuobjdump.path, "-sass", path]
        else:
            objdump = require_llvm_tool("llvm-objdump")
            cmd = [objdump.path, "-d", path]
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise CompilationError("disassembly failed", stage="disasm", command=cmd,
                                   log=proc.stdout + proc.stderr)
        return proc.stdout
