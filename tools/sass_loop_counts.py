"""SASS instructions of a kernel's loops, by pipe class, per element (no GPU needed).

Usage::

    python tools/sass_loop_counts.py KERNEL.sass [ELEMENTS_PER_ITERATION]
    python tools/sass_loop_counts.py --quantize [ELEMENTS]   # the sm_90a quantize kernels
    python tools/sass_loop_counts.py --moe stream2,wide      # grouped / fused hot paths

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
#: a branch and its target address (an optional predicate operand, an optional label)
_BRA = re.compile(r"BRA (?:!?U?P\w+, )?(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")
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
        m = _BRA.search(text)
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


def hot_path(text: str) -> tuple[int, int, collections.Counter]:
    """(instructions, local loads/stores, per-pipe counts) of the hot path of the longest loop:
    minus forward branches over store-free code holding a loop (the grouped kernels' group
    search), the cold branches within 12 instructions after an ``FSETP ... +INF`` (the NVFP4
    NaN-sign fix and rare-reciprocal branches) or an ``LDS`` (the wide kernels' table miss),
    those after an ``FSETP.GEU ... 7`` (the fused bulk kernels' saturating NVFP4 packing) and
    the div.rn slow-path calls."""
    ins = parse(text)
    prev = {a: ins[i - 1][1] for i, (a, _) in enumerate(ins) if i}
    # not a loop: an out-of-line block's jump back (an unconditional BRA right after a
    # branch, e.g. the return from the mbarrier try-wait retry of the bulk kernels)
    lps = [lp for lp in loops(ins) if not ("BRA" in prev.get(lp[1], "") and any(
        a == lp[1] and t.startswith("BRA") for a, t in ins))]
    lo, hi, _ = max(lps, key=lambda t: t[1] - t[0])
    inner = [(a, b) for a, b, _ in lps if (a, b) != (lo, hi) and lo <= a and b <= hi]
    skip, around = [], {}
    for i, (addr, text_i) in enumerate(ins):
        m = _BRA.search(text_i)
        if lo <= addr <= hi and m and int(m.group(1), 16) > addr:
            tgt = int(m.group(1), 16)
            # the outermost forward branch around each inner loop that stores nothing (the
            # group search; not a guard around a whole row visit)
            quiet = not any(lo_ <= a_ < tgt and ("STG" in t or ".128" in t)
                            for a_, t in ins for lo_ in (addr,))
            for a, b in inner:
                if quiet and addr < a and b < tgt and (
                        a not in around or tgt - addr > around[a][1] - around[a][0]):
                    around[a] = (addr, tgt)
            pm = re.match(r"@(P\d) BRA", text_i)
            sat = pm is not None and any(
                re.search(rf"FSETP\.GEU\.AND {pm.group(1)}, PT, R\d+, 7, PT", t)
                for _, t in ins[max(0, i - 48):i])
            if sat:  # the branch jumps to the saturating copy; the fast one falls through
                # to a BRA over it: skip [target, that BRA's target)
                jm = _BRA.match(dict(ins).get(tgt - 0x10, ""))
                if jm:
                    skip.append((tgt - 0x10, int(jm.group(1), 16)))
            elif any(("FSETP" in t and "+INF" in t) or "LDS" in t
                     for _, t in ins[max(0, i - 12):i]):
                skip.append((addr, tgt))
        if lo <= addr <= hi and "CALL.REL" in text_i:
            skip.append((addr - 0x30, addr + 0x10))
    skip += around.values()
    body = [t for a, t in ins if lo <= a <= hi and not any(s < a < e for s, e in skip)]
    return len(body), sum(1 for t in body if "LDL" in t or "STL" in t), collections.Counter(
        pipe(t) for t in body)


def _moe(schedules: list[str]) -> None:
    """Hot-path SASS per element of the sm_90a grouped / fused (SILU) quantize kernels of
    ``schedules`` (elements per iteration: 16 x chunks per visit x rows per iteration)."""
    from blockscale.activations import GatedActivation
    from blockscale.formats import Format
    from blockscale.ops import quantize as q
    from blockscale.ops import quantize_grouped as qg
    from blockscale.ops import quantize_silu as qs
    from blockscale.ops.quantize import QuantizeSpec

    for mode in ("grouped", "silu"):
        for sch in schedules:
            for fmt in ("nvfp4", "mxfp4", "mxfp8"):
                if mode == "grouped":
                    spec = qg.with_schedule(QuantizeSpec(
                        fmt, "sm_90a", None, "tcgen5d", True, "grouped",
                        name="grouped_quantize_dynamic_scaled"), sch)
                else:
                    spec = qs._spec(Format.from_name(fmt), "sm_90a", GatedActivation.SILU, True,
                                    sch)
                k = q.kernel(spec)
                wide = getattr(spec, "wide", 0)
                elems = 16 * (wide * spec.unroll if wide else 1)
                n, local, pipes = hot_path(k.asm["sass"])
                print(f"{mode:7s} {fmt:6s} {sch:12s} {n / elems:5.1f}/elem ({n} / {elems})  "
                      f"ALU {pipes['ALU']} FMA {pipes['FMA']}  "
                      f"regs {k.meta.get('registers')} spill {k.meta.get('spill_stores')} "
                      f"loop LDL/STL {local}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--quantize":
        _quantize(float(sys.argv[2]) if len(sys.argv) > 2 else 16)
    elif len(sys.argv) > 2 and sys.argv[1] == "--moe":
        _moe(sys.argv[2].split(","))
    elif len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            report(sys.argv[1], f.read(), float(sys.argv[2]) if len(sys.argv) > 2 else 16)
    else:
        print(__doc__)
