"""The decode kernels (blockscale/ops/matmul_decode.py) lower to the intended sm_90a SASS:
16-byte weight loads (LDG.E.128, 4 per lane per window, issued one window ahead), 16-byte
shared activation reads (LDS.128), HFMA2 (FP4: exact f16x2 products) or FFMA (MXFP8) dot
products, a butterfly reduction (SHFL.BFLY), <= 128 registers (two 256-thread CTAs per SM)
and no register spill between the in-loop weight loads and the last dot-product instruction
(ptxas spills a few loop-invariant addresses under the 128-register cap, outside that span).
"""

from __future__ import annotations

import re

import pytest

from blockscale.ops import matmul_decode

pytestmark = pytest.mark.lower

_INSN = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def _ops(sass: str) -> list[str]:
    return [m.group(1) for line in sass.splitlines() if (m := _INSN.match(line))]


SIMT = [s for s in matmul_decode.bundle_specs("sm_90a") if s.variant == "simt"]
MMA = [s for s in matmul_decode.bundle_specs("sm_90a")  # (one-shot and lean variants: their
       if s.variant != "simt" and s.variant not in matmul_decode.SHOT_KCAP  # own test files)
       and s.variant not in matmul_decode.LEAN_VARIANTS  # (and the solo variant:
       and s.variant not in matmul_decode.SOLO_VARIANTS  # test_matmul_decode_solo.py;
       and s.variant not in matmul_decode.MX8_VARIANTS]  # MXFP8: test_mx8_sass)
MX8 = [s for s in matmul_decode.bundle_specs("sm_90a") if s.variant in matmul_decode.MX8_VARIANTS]


@pytest.mark.parametrize("spec", MX8, ids=lambda s: s.kernel_name)
def test_mx8_sass(spec):
    """mma_x8*: per K step 8 blocks x 2 HMMA.16816.F32 (per n-tile) on f16 operands from the
    hardware E4M3 unpack (F2FP ... E4M3), within the variant's register cap, no spill inside
    the step loop."""
    kernel = matmul_decode.kernel(spec)
    meta, ops = kernel.meta, _ops(kernel.asm["sass"])
    assert 0 < meta["registers"] <= matmul_decode.VARIANT_REGISTERS[spec.variant], meta
    assert sum(o.startswith("HMMA.16816.F32") for o in ops) >= 16
    assert any(o.startswith("F2FP") and "E4M3" in o for o in ops)
    loop = _step_loop(kernel.asm["sass"])
    assert sum(o.startswith("HMMA.16816.F32") for o in loop) >= 16 * matmul_decode.MX8_NTILES[
        spec.variant]
    assert not [o for o in loop if o.startswith(("STL", "LDL"))], "spill in the step loop"


@pytest.mark.parametrize("spec", SIMT, ids=lambda s: s.kernel_name)
def test_decode_sass(spec):
    kernel = matmul_decode.kernel(spec)
    meta, ops = kernel.meta, _ops(kernel.asm["sass"])
    assert 0 < meta["registers"] <= matmul_decode.MAX_REGISTERS, meta
    # one per weight row, twice: the first window before the loop, the next one in it
    assert ops.count("LDG.E.128") == 8, ops.count("LDG.E.128")
    assert ops.count("LDS.128") >= 4 * 4 * (8 if spec.format.is_fp4 else 4) // 2
    if spec.format.is_fp4:  # 16 f16x2 FMAs per (weight row, activation row, chunk)
        hfma = sum(o in ("HFMA2", "HFMA2.MMA") for o in ops)  # ptxas splits the two pipes
        assert hfma >= 4 * 4 * 16, hfma
    else:
        assert ops.count("FFMA") >= 4 * 4 * 16
    assert ops.count("SHFL.BFLY") >= 5 * 4 * 4
    first = len(ops) - 1 - ops[::-1].index("LDG.E.128") - 3  # the in-loop loads
    last_bar = len(ops) - 1 - ops[::-1].index("BAR.SYNC.DEFER_BLOCKING")
    last_ffma = len(ops) - 1 - ops[::-1].index("HADD2.F32" if spec.format.is_fp4 else "FFMA")
    loop = ops[first:last_ffma]  # weight loads .. the last dot-product FMA
    assert not [o for o in loop if o.startswith(("STL", "LDL"))], "spill in the weight loop"
    assert first < last_bar
    assert meta["static_shared_bytes"] <= 48 * 1024


_LINE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")


def _step_loop(sass: str) -> list[str]:
    """Opcodes of the innermost loop (backward branch) that holds the HMMAs."""
    ins = [(int(m.group(1), 16), m.group(2), m.group(3)) for line in sass.splitlines()
           if (m := _LINE.match(line))]
    best = None
    for addr, op, rest in ins:
        t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if t and int(t.group(1), 16) < addr:
            body = [o for a, o, _ in ins if int(t.group(1), 16) <= a <= addr]
            if "HMMA.16816.F32" in body and (best is None or len(body) < len(best)):
                best = body
    assert best is not None, "no loop with HMMA"
    return best


@pytest.mark.parametrize("spec", MMA, ids=lambda s: s.kernel_name)
def test_decode_mma_sass(spec):
    """The mma variants: HMMA.16816.F32 (32 per step and n-tile: the one- and two-n-tile
    paths) in the step loop with the next step's 16-byte weight loads, the variant's register
    cap (mma: 4 CTAs of 128 threads per SM, mma2: 3), <= 48 KB static shared memory; in the
    step loop no spill store and only a few reloads of spilled loop-invariant addresses
    (ptxas; a handful of L1 hits per 16 KB step). The 8-row variants ("mma_c8*": one n-tile
    path, 32 HMMAs): no spill in the step loop at 128 registers, <= 8 / 24 reloads a step at
    96 / 80; the tail variants ("mma_c8t", "mma_c8s*", "mma_c8d2") hold a second copy of the
    HMMAs (the peeled last step), "mma_c8d2" <= 12 reloads a step at 168 registers."""
    kernel = matmul_decode.kernel(spec)
    meta, ops = kernel.meta, _ops(kernel.asm["sass"])
    assert 0 < meta["registers"] <= matmul_decode.VARIANT_REGISTERS[spec.variant], meta
    paths = 1 if matmul_decode.STAGING.get(spec.variant) == "cf8" else 3
    peeled = 2 if spec.variant in matmul_decode.TAIL_VARIANTS else 1  # (+ the last step)
    assert ops.count("HMMA.16816.F32") == 32 * paths * peeled, ops.count("HMMA.16816.F32")
    loop = _step_loop(kernel.asm["sass"])
    assert loop.count("HMMA.16816.F32") == 32 * paths
    if spec.variant in matmul_decode.RING:  # the weights by TMA into the shared ring
        assert loop.count("LDG.E.128") <= 1 and ops.count("UTMALDG.2D") >= 2  # (1: the
        # activation chunk)
    else:
        assert loop.count("LDG.E.128") >= 8  # the next step's weights
    assert not [o for o in loop if o.startswith("STL")], "spill store in the step loop"
    # <= 32 of the ~2300 instructions of a step (mma2: <= 26, mma: <= 8); mma_p5 (96
    # registers for 5 CTAs per SM): <= 48
    cap = {"mma_p5": 48, "mma_c8": 0, "mma_c85": 8, "mma_c86": 24, "mma_c8t": 0,
           "mma_c8s2": 0, "mma_c8s4": 0, "mma_c8d2": 12}.get(spec.variant, 32)
    assert sum(o.startswith("LDL") for o in loop) <= cap, "spill reloads in the step loop"
    if spec.variant == "mma_c8":  # (a word or two spilled outside the passes)
        assert meta["spill_stores"] <= 8 and meta["spill_loads"] <= 8, meta
    assert meta["static_shared_bytes"] <= 48 * 1024


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_mma_p_step_is_shorter(fmt):
    """The prmt decode ("mma_p") against "mma" on the same kernel: the step loop (staging
    plus both n-tile paths) is >= 10 % shorter, its E2M1 -> f16 decode one PRMT per f16
    pair (4 per word of 8 codes: 2 rows per unit pair, 16 unit pairs, the one- and two-n-tile
    paths)."""
    def loop(variant: str) -> list[str]:
        spec = matmul_decode.DecodeSpec(fmt, "grouped", "bfloat16", False, "sm_90a", variant)
        return _step_loop(matmul_decode.kernel(spec).asm["sass"])

    old, new = loop("mma"), loop("mma_p")
    assert len(new) <= 0.9 * len(old), (len(new), len(old))
    assert new.count("PRMT") >= 4 * 2 * 16 * 2, new.count("PRMT")


def test_report_registers(capsys):
    """Registers / spills / shared memory of the decode kernels (printed for the report)."""
    for spec in matmul_decode.bundle_specs("sm_90a"):
        k = matmul_decode.kernel(spec)
        with capsys.disabled():
            print(f"{k.name}: {k.meta['registers']} regs, spills {k.meta['spill_stores']}/"
                  f"{k.meta['spill_loads']}, {k.meta['static_shared_bytes']} B smem")
