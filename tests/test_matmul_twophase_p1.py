"""The two-phase matmul's phase 1 for both operands in one launch
(:mod:`blockscale.ops.matmul_twophase_p1`, issue #9).

* interp: the workspaces are byte-identical to ``matmul_twophase.dequantize_operands``' (two
  launches) for NVFP4 / MXFP4, bn 256 / 240 (bm 128, one 192), M / N / K tails (rows past
  the operand and K past k are zeros), 1 / 2 / 4 pieces a thread, both tile-row orders, and
  5-D scale padding that is not zero (a K-block past k must not reach the bytes); phase 2 on
  them gives the pair's bytes;
* ir / lower: the trigger first, every load before the first conversion, sm_90a SASS (128-bit
  loads and stores per piece, no spills, registers);
* gpu: byte-equal to the two-launch phase 1 on the H200, and the pair with PDL::

      BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_twophase_p1.py
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_matmul_common import random_dense_case

from blockscale.formats import Format
from blockscale.ops import matmul_twophase as TP
from blockscale.ops import matmul_twophase_p1 as P1


def _case(fmt, m, n, k, pad_byte=None):
    fmt = Format.from_name(fmt)
    a, b, _, _, sfa, sfb = random_dense_case(np.random.default_rng(m * 7 + n + k), fmt, m, n, k)
    if pad_byte is not None:  # the 5-D padding (rows past M, K-blocks past k) not zero
        for s, rows in ((sfa, m), (sfb, n)):
            u = s.view(np.uint8)
            kb = fmt.kblocks(k)
            flat = u.reshape(u.shape[0], u.shape[1], 32, 4, 4)
            r = np.arange(u.shape[0] * 128)
            for j in range(u.shape[1] * 4):
                for rr in r:
                    if rr >= rows or j >= kb:
                        flat[rr // 128, j // 4, rr % 32, (rr % 128) // 32, j % 4] = pad_byte
    return fmt, a, b, sfa, sfb


def _same(fmt, m, n, k, bm=128, bn=256, pad_byte=None, device="interp", **kw):
    fmt, a, b, sfa, sfb = _case(fmt, m, n, k, pad_byte)
    want = TP.dequantize_operands(a, b, sfa, sfb, fmt, k=k, bm=bm, bn=bn, device=device)
    got = P1.dequantize_both(a, b, sfa, sfb, fmt, k=k, bm=bm, bn=bn, device=device, **kw)
    for name, g, w in zip(("wa", "wb"), got, want, strict=True):
        assert g.shape == w.shape, name
        assert np.array_equal(np.asarray(g), np.asarray(w)), name
    return got


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 300, 224), 128, 256, 2, "reversed"),  # M, N tails; 4 pieces: 2 groups
    ("nvfp4", (130, 300, 224), 128, 240, 4, "rows"),  # a warp straddles B's tile-rows
    ("mxfp4", (70, 250, 96), 128, 240, 4, "reversed"),  # K = 96: half a piece past K
    ("mxfp4", (200, 100, 352), 128, 256, 1, "reversed"),  # K tail; 6 pieces
    ("nvfp4", (200, 100, 352), 128, 240, 4, "reversed"),  # 6 pieces over 2 groups of 4
    ("nvfp4", (1, 5, 32), 128, 256, 2, "reversed"),  # one row each, mostly padding
    ("nvfp4", (260, 40, 160), 192, 240, 2, "rows"),  # bm 192
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}x{c[3]}-p{c[4]}-{c[5]}")
def test_interp_same_bytes(case):
    fmt, (m, n, k), bm, bn, p, order = case
    _same(fmt, m, n, k, bm, bn, pieces=p, order=order)


@pytest.mark.interp
@pytest.mark.parametrize("fmt,pad", [("nvfp4", 0x7E), ("mxfp4", 0xFF)])
def test_interp_scale_padding_ignored(fmt, pad):
    """K-blocks past k (and rows past M) whose 5-D scale bytes are not zero (MXFP4 0xFF is
    NaN): the workspaces still hold zeros there, as the two-launch phase 1's."""
    wa, wb = _same(fmt, 40, 70, 96, bn=240, pad_byte=pad, pieces=2)
    kp = TP.k_padded(96)
    assert wa.size == 2 * 128 * kp and wb.size == 2 * 240 * kp


@pytest.mark.interp
@pytest.mark.parametrize("fmt,bn,out_dtype", [("nvfp4", 240, "bfloat16"),
                                              ("mxfp4", 256, "float32")])
def test_interp_pair_same_bytes(fmt, bn, out_dtype):
    """Phase 2 on this phase 1's workspaces: the pair's bytes (matmul_twophase)."""
    f, a, b, sfa, sfb = _case(fmt, 130, 264, 224)
    got = P1.pair(a, b, sfa, sfb, f, k=224, alpha=0.375, out_dtype=out_dtype, bn=bn,
                  pdl=True, device="interp")
    want = TP.block_scaled_matmul_twophase(a, b, sfa, sfb, f, alpha=0.375,
                                           out_dtype=out_dtype, store="staged", bn=bn,
                                           device="interp")
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.interp
def test_interp_grid_counts():
    """A's blocks then B's; only each operand's last block is partly idle."""
    # 8192 x 5760 x 2944, bn 240: 46 pieces a row; 2 a thread -> 23 groups
    assert P1.operand_blocks(8192, 2944, 2) == 8192 * 23 // 256
    assert P1.grid(8192, 5760, 2944, 128, 240, 2) == (736 + 518, 1, 1)
    assert P1.grid(8192, 5760, 2944, 128, 240, 4) == (384 + 270, 1, 1)  # 12 groups (last: 2)
    assert P1.grid(1, 5, 32, 128, 256, 1) == (1 + 1, 1, 1)


@pytest.mark.interp
def test_interp_conversion_exhaustive():
    """fp4x8_bf16x2 (sign-replicate prmt) gives _wgmma_ir._fp4x8_lut's bits for every byte
    value (every pair of E2M1 codes, both signs) in each of the four byte positions."""
    from blockscale.compiler import ir as bir
    from blockscale.launch import KernelArg
    from blockscale.ops import _twophase_p1_ir as P
    from blockscale.ops import _wgmma_ir as X
    from blockscale.runtime.interpreter import run_kernel

    args = (KernelArg("w", "buffer", "int32"), KernelArg("o", "buffer", "int32", "out"))
    with bir.kernel_module("conv", "sm_90a", args, 256) as kb:
        t = bir.global_thread_idx()
        w = bir.load(kb.arg("w"), t)
        for j, (mine, lut) in enumerate(zip(P.fp4x8_bf16x2(w), X._fp4x8_lut(w), strict=True)):
            bir.store(mine, kb.arg("o"), bir.add(bir.mul(t, 8), j))
            bir.store(lut, kb.arg("o"), bir.add(bir.mul(t, 8), 4 + j))
    b = np.arange(256, dtype=np.uint32)
    words = np.concatenate([b << (8 * i) | ((255 - b) << (8 * ((i + 1) % 4))) for i in range(4)])
    out = np.zeros(8 * words.size, np.int32)
    run_kernel(str(kb.module), "conv", (words.size // 256, 1, 1), (256, 1, 1),
               [words.view(np.int32), out], "sm_90a")
    out = out.reshape(-1, 2, 4)
    assert np.array_equal(out[:, 0], out[:, 1])
    assert len(np.unique(out[:, 0] & 0xFFFF)) == 16  # every code, as the low bf16


@pytest.mark.ir
def test_args_checked():
    fmt, a, b, sfa, sfb = _case("nvfp4", 8, 8, 64)
    with pytest.raises(ValueError, match="swizzle must be 'none'"):
        P1.dequantize_both(a, b, sfa, sfb, fmt, k=64, swizzle="128b", device="interp")
    with pytest.raises(ValueError, match="pieces must be one of"):
        P1.BothSpec("nvfp4", pieces=3)
    with pytest.raises(ValueError, match="order must be one of"):
        P1.BothSpec("nvfp4", order="random")
    with pytest.raises(ValueError, match="bn must be one of"):
        P1.BothSpec("nvfp4", bn=128)
    with pytest.raises(ValueError, match="fmt must be one of"):
        P1.BothSpec("mxfp8")
    with pytest.raises(TypeError, match="pdl must be a bool"):
        P1.BothSpec("nvfp4", pdl=1)
    with pytest.raises(ValueError, match="k % 32 == 0"):
        P1.dequantize_both(a[:, :8], b[:, :8], sfa, sfb, fmt, k=16, device="interp")
    assert P1.BothSpec("mxfp4", 128, 240, 4, "rows", True).kernel_name == (
        "bs_twophase_p1_mxfp4_128x240_p4_rows_pdl")


@pytest.mark.ir
@pytest.mark.parametrize("p", P1.PIECES)
def test_ir_trigger_and_loads_first(p):
    """``pdl``: launch_dependents before anything; per operand every vector.load (2 data +
    1 scale per piece) before the first bf16 multiply; 8 stores per piece; no barrier."""
    text = str(P1.build(P1.BothSpec("nvfp4", 128, 240, p, pdl=True)))
    assert text.count("nvvm.griddepcontrol") == 1
    assert text.index("launch_dependents") < text.index("vector.load")
    assert "gpu.barrier" not in text
    # A's code, then B's: L = a load, M = a bf16 multiply, S = a store
    seq = "".join({"vector.load": "L", "arith.mulf": "M", "vector.store": "S"}[t]
                  for t in re.findall(r"vector\.load|arith\.mulf|vector\.store", text))
    op = f"L{{{3 * p}}}(?:M+S+)+"
    assert re.fullmatch(op + op, seq), seq
    assert seq.count("S") == 2 * 8 * p
    assert "griddepcontrol" not in str(P1.build(P1.BothSpec("nvfp4", pdl=False)))


def _sass_ops(spec):
    sass = P1.kernel(spec).asm["sass"]
    return [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*(@!?U?P\w+\s+)?", "", ln).split()[0].rstrip(";")
            for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", ln)]


@pytest.mark.lower
@pytest.mark.parametrize("fmt,p", [("nvfp4", 2), ("mxfp4", 2), ("nvfp4", 4)])
def test_sass(fmt, p):
    """Per operand and piece: two LDG.E.128 + one scale load, eight STG.E.128, 32 HMUL2
    (bf16x2 scale products); the loads of a thread's pieces precede its first HMUL2; no
    local memory; registers within 4 blocks of 256 threads per SM at 2 pieces."""
    spec = P1.BothSpec(fmt, 128, 240, p)
    ops = _sass_ops(spec)
    assert ops.count("LDG.E.128") == 2 * 2 * p
    assert sum(op in ("LDG.E", "LDG.E.U16") for op in ops) == 2 * p
    assert ops.count("STG.E.128") == 2 * 8 * p
    assert sum(op.startswith("HMUL2") for op in ops) == 2 * 32 * p
    assert not any(op.startswith(("LDL", "STL")) for op in ops)
    first_mul = ops.index(next(op for op in ops if op.startswith("HMUL2")))
    assert sum(op.startswith("LDG") for op in ops[:first_mul]) == 3 * p
    regs = P1.kernel(spec).meta["registers"]
    assert regs <= (64 if p <= 2 else 96), regs


# ---- GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", P1.FORMATS)
@pytest.mark.parametrize("case", [(P1.GPU_SHAPES[0], p) for p in P1.PIECES]
                         + [(s, P1.DEFAULT_PIECES) for s in P1.GPU_SHAPES[1:]],
                         ids=lambda c: f"{'x'.join(map(str, c[0]))}-p{c[1]}")
@pytest.mark.parametrize("bn", [256, 240], ids=lambda b: f"bn{b}")
def test_gpu_same_bytes(fmt, case, bn):
    """On the H200: the one-launch workspaces equal the two-launch phase 1's bytes."""
    (m, n, k), p = case
    _same(fmt, m, n, k, 128, bn, device="cuda", pieces=p)


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", P1.FORMATS)
@pytest.mark.parametrize("pdl", [False, True], ids=lambda v: f"pdl{int(v)}")
def test_gpu_pair_same_bytes(fmt, pdl):
    """On the H200 at 8192 x 5760 x 2944, bn 240, staged: this phase 1 + phase 2 (with PDL:
    phase 2 overlapping this grid's tail) writes the bytes of the two-launch pair."""
    m, n, k = P1.GPU_SHAPES[0]
    f, a, b, sfa, sfb = _case(fmt, m, n, k)
    got = P1.pair(a, b, sfa, sfb, f, k=k, alpha=0.375, bn=240, pdl=pdl, device="cuda")
    want = TP.block_scaled_matmul_twophase(a, b, sfa, sfb, f, alpha=0.375, store="staged",
                                           bn=240, device="cuda")
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
