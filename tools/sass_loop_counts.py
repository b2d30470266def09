"""SASS instructions of a kernel's loops, by pipe class, per element (no GPU needed).

Usage::

    python tools/sass_loop_counts.py KERNEL.sass [ELEMENTS_PER_ITERATION]
    python tools/sass_loop_counts.py --quantize [ELEMENTS]   # the sm_90a quantize kernels

Every backward branch is a loop ``[target, branch]``; its static instruction count (cold
branches inside it included, out-of-line slow paths such as div.rn's not) is split into FMA
pipe (FFMA/FMUL/FADD/IMAD/HFMA2), ALU (LOP3/SHF/IADD3/ISETP/SEL/PRMT/FMNMX/LEA/...), MEM
(global/shared/local loads and stores, shuffles), MUFU, CONV (F2F/F2FP/I2F...), CTRL and
uniform/system instructions, then divided by the elements a thread handles per iteration
(16 for the aligned quantize kernels). The quantize kernels' row loop is the innermost long one.
"""

from __future__ import annotations

import collections
import re
import sys

_FMA = {"FFMA", "FMUL", "FADD", "IMAD", "HFMA2", "HADD2", "HMUL2", "DFMA"}
_ALU = {"LOP3", "SHF", "IADD3", "ISETP", "FSETP", "SEL", "FSEL", "PRMT", "FMNMX", "IMNMX",
        "VIMNMX", "VIMNMX3", "LEA", "SGXT", "FLO", "POPC", "BMSK", "PLOP3", "P2R", "R2P", "IABS",
        "VIADD", "VIADDMNMX", "FCHK", "ISCADD", "MOV"}
_MEM = {"LDG", "STG", "LDS", "STS", "LDL", "STL", "SHFL", "LD", "ST", "LDC", "LDGSTS", "ATOM",
        "RED", "LDSM"}
_CTRL = {"BRA", "EXIT", "BSSY", "BSYNC", "CALL", "RET", "BAR", "WARPSYNC", "NOP", "JMP",
         "ENDCOLLECTIVE"}
_CONV = {"F2I", "I2F", "F2F", "I2FP", "F2FP", "FRND", "F2IP"}


def parse(text: str) -> list[tuple[int, str]]:
    """(address, instruction) of each SASS line of ``cuobjdump -sass`` / nvdisasm text."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def pipe(instr: str) -> str:
    op = re.sub(r"^@!?U?P\w+\s+", "", instr).split()[0].split(".")[0]
    for name, ops in (("FMA", _FMA), ("ALU", _ALU), ("MEM", _MEM), ("CTRL", _CTRL),
                      ("CONV", _CONV)):
        if op in ops:
            return name
    if op == "MUFU":
        return "MUFU"
    if op.startswith("U") or op in ("S2R", "S2UR", "CS2R", "R2UR"):
        return "UNIFORM"
    return "OTHER"


def loops(ins: list[tuple[int, str]]) -> list[tuple[int, int, collections.Counter]]:
    """(start, end, per-pipe counts) of every backward branch's range."""
    out = []
    for addr, text in ins:
        m = re.search(r"BRA (?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            out.append((lo, addr, collections.Counter(pipe(t) for a, t in ins if lo <= a <= addr)))
    return out


def report(name: str, text: str, elems: float) -> None:
    print(f"== {name}")
    for lo, hi, c in loops(parse(text)):
        tot = sum(c.values())
        parts = "  ".join(f"{k}={v / elems:.2f}" for k, v in sorted(c.items()))
        print(f"  loop {lo:#06x}-{hi:#06x}: {tot} instr = {tot / elems:.2f}/elem  {parts}")


def _quantize(elems: float) -> None:
    from blockscale.ops import quantize as q
    from blockscale.ops.quantize import QuantizeSpec

    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        rounding = None if fmt == "nvfp4" else "up"
        for mode, name in (("dense", "quantize_dynamic_scaled_fp4fp8"),
                           ("grouped", "grouped_quantize_dynamic_scaled"),
                           ("silu", "fused_silu_quantize")):
            spec = QuantizeSpec(fmt, "sm_90a", rounding, "tcgen5d", True, mode, name=name)
            k = q.kernel(spec)
            meta = {n: k.meta.get(n) for n in ("registers", "spill_stores", "spill_loads")}
            report(f"{mode} {fmt} {meta}", k.asm["sass"], elems)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--quantize":
        _quantize(float(sys.argv[2]) if len(sys.argv) > 2 else 16)
    elif len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            report(sys.argv[1], f.read(), float(sys.argv[2]) if len(sys.argv) > 2 else 16)
    else:
        print(__doc__)
