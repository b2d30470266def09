"""The two-phase sm_90a NVFP4 / MXFP4 matmul (dequantize to stage-ordered bf16 workspaces,
then a bf16 wgmma GEMM fed by cp.async.bulk through an mbarrier ring), and the interpreter's
cp.async.bulk model.

* interp: the pair of kernels against the float64 value with the fp32 bound of
  test_matmul_common.py (MX: the fold kernel's extra k16 rounding per 32-block), and bit for
  bit against matmul_wgmma's fold kernel (same bf16 operands, same k16 wgmma order); M/N/K
  tails (K not a multiple of the step, rows past the tile), both ksteps, 2 .. max stages;
  the workspace layout; the bulk-copy model completes the mbarrier's
  transaction bytes (a wait before the bytes arrive deadlocks) and its bytes need no proxy
  fence for a wgmma.
* lower: sm_90a SASS: HGMMA.64x256x16.F32.BF16 and UBLKCP (bulk copy) + SYNCS (mbarriers),
  no LDGSTS / LDG / MEMBAR, no spills; phase 1: 128-bit loads and stores.
* gpu: the bound on sampled rows on an H100/H200 (``make gpu-bundle`` collects
  ``matmul_twophase.bundle_specs``)::

      BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_twophase.py
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    exact_dense,
    f32_error_bound,
    random_dense_case,
)

from blockscale.formats import MXFP8, NVFP4, Format
from blockscale.ops import matmul_twophase as TP
from blockscale.ops import matmul_wgmma


def _check(m, n, k, fmt, out_dtype, kstep=None, stages=None, device="interp", rows=None,
           identical=True, bm=128, swizzle="none", schedule="tiles"):
    """The bound and, in the interpreter, bit-identity with the wgmma fold kernel."""
    rng = np.random.default_rng(m * 131 + n * 7 + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 0.375, rows)
    extra = fmt.kblocks(k) if fmt.is_mx else 0
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1 + extra)
    got = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, fmt, alpha=0.375,
                                          out_dtype=out_dtype, kstep=kstep, stages=stages,
                                          bm=bm, swizzle=swizzle, schedule=schedule,
                                          device=device)
    assert got.shape == (m, n)
    sel = got if rows is None else got[rows]
    if out_dtype == "float32":
        assert_f32_within_bound(sel, exact, bound)
    else:
        assert_bf16_consistent(sel, exact, bound)
    if identical:
        ref = matmul_wgmma.block_scaled_matmul_wgmma(
            a, b, sfa5, sfb5, fmt, alpha=0.375, out_dtype=out_dtype, tiles=(128, 256),
            dequant="lut", kstep=64, scaling="fold", device=device)
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 300, 224), 64, None, "float32"),  # M, N tails; 4 steps (ring wraps)
    ("nvfp4", (70, 260, 96), 32, None, "bfloat16"),  # K = 96: a half step of K padding
    ("nvfp4", (128, 256, 352), 64, 3, "float32"),  # K tail
    ("nvfp4", (128, 256, 352), 64, 2, "bfloat16"),  # one step ahead
    ("nvfp4", (64, 256, 352), 32, 9, "float32"),  # 11 steps over 9 stages
    ("mxfp4", (130, 300, 224), 64, None, "bfloat16"),
    ("mxfp4", (200, 100, 352), 32, 4, "float32"),
    ("nvfp4", (1, 5, 32), 64, None, "float32"),  # one step, mostly padding
    ("nvfp4", (200, 300, 352), 64, None, "float32", 192),  # 192 x 256 tiles: 3 warpgroups
    ("mxfp4", (400, 40, 96), 32, 3, "bfloat16", 192),
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-k{c[2]}-s{c[3]}-{c[4]}"
   + (f"-bm{c[5]}" if len(c) > 5 else ""))
def test_interp(case):
    fmt, (m, n, k), kstep, stages, out_dtype, *bm = case
    _check(m, n, k, Format.from_name(fmt), out_dtype, kstep, stages, bm=bm[0] if bm else 128)


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 300, 224), None, "float32", 128),  # M, N tails; 4 steps (ring wraps)
    ("nvfp4", (128, 256, 352), 2, "bfloat16", 128),  # K tail, one step ahead
    ("mxfp4", (130, 300, 224), None, "bfloat16", 128),
    ("nvfp4", (200, 300, 352), None, "float32", 192),  # 3 warpgroups: A atoms at 8 KiB
    ("nvfp4", (1, 5, 32), None, "float32", 128),  # one step, mostly padding
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-s{c[2]}-{c[3]}-bm{c[4]}")
def test_interp_sw128(case):
    """The 128B-swizzled pair: bit-identical to the wgmma fold kernel (so to the no-swizzle
    pair) in the interpreter, whose wgmma model reads the operands through the swizzled
    descriptor (absolute address bits [4:6] ^= [7:9])."""
    fmt, (m, n, k), stages, out_dtype, bm = case
    _check(m, n, k, Format.from_name(fmt), out_dtype, 64, stages, bm=bm, swizzle="128b")


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (260, 520, 224), 64, 3, "float32", 128, 2),  # 6 tiles / 2 CTAs; K 4 steps
    ("nvfp4", (130, 300, 352), 64, 2, "bfloat16", 128, 3),  # 4 tiles / 3 CTAs: 2 and 1
    ("mxfp4", (390, 260, 160), 64, 4, "float32", 128, 2),  # 6 tiles; 3 steps < 4 stages
    ("nvfp4", (300, 260, 96), 32, 4, "bfloat16", 128, 4),  # 6 tiles over 4 CTAs; kstep 32
    ("nvfp4", (200, 300, 224), 64, 3, "float32", 192, 3),  # 192 x 256: 4 tiles / 3 CTAs
    ("nvfp4", (130, 300, 96), 64, 2, "float32", 128, 64),  # more CTAs than tiles: 4
    ("nvfp4", (520, 260, 64), 64, 4, "float32", 128, 2),  # 1 step a tile: refills 3 tiles on
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-k{c[2]}-s{c[3]}-{c[4]}-bm{c[5]}"
   f"-ctas{c[6]}")
def test_interp_persistent(case):
    """schedule "persistent" on a small grid (several tiles per CTA, the ring's phases
    running on across tiles, the next tile's copies issued during this tile's last steps):
    bit-identical to the one-CTA-per-tile kernel (and so to the wgmma fold kernel); M, N, K
    tails, fewer k-steps than stages, 2..4 stages."""
    fmt, (m, n, k), kstep, stages, out_dtype, bm, ctas = case
    fmt = Format.from_name(fmt)
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(m + n + k), fmt, m, n, k)
    got, want = (TP.block_scaled_matmul_twophase(
        a, b, sfa5, sfb5, fmt, alpha=0.375, out_dtype=out_dtype, kstep=kstep, stages=stages,
        bm=bm, schedule=sch, ctas=ctas, device="interp") for sch in TP.SCHEDULES)
    tiles = TP.grid(m, n, bm)[0]
    assert TP.grid(m, n, bm, "persistent", ctas) == (min(tiles, ctas), 1, 1)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.interp
def test_interp_persistent_fused_epilogue():
    """A fused epilogue (bias + relu) on the persistent kernel, 6 tiles on 2 CTAs: the same
    bytes as one CTA per tile."""
    from blockscale.ops import matmul_epilogue as ep

    m, n, k = 130, 520, 96
    rng = np.random.default_rng(6)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    got, want = (TP.block_scaled_matmul_twophase(
        a, b, sfa5, sfb5, NVFP4, alpha=0.5, epilogue=ep.chain(ep.bias(), ep.relu()),
        epilogue_inputs={"bias": bias}, schedule=sch, ctas=2, device="interp")
        for sch in TP.SCHEDULES)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert (got.astype(np.float32) >= 0).all() and got.astype(np.float32).max() > 0


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 264, 224), 64, None, "bfloat16", 128),  # M, N tails (N % 8 == 0)
    ("nvfp4", (128, 256, 352), 64, 3, "float32", 128),  # f32 rows: 1040-byte pitch
    ("mxfp4", (70, 520, 96), 32, None, "bfloat16", 128),  # kstep 32, 2 column tiles
    ("nvfp4", (200, 300, 224), 64, None, "float32", 192),  # 3 warpgroups; N % 4 == 0
    ("nvfp4", (1, 8, 32), 64, None, "bfloat16", 128),  # one row of 16 bytes
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-k{c[2]}-s{c[3]}-{c[4]}-bm{c[5]}")
def test_interp_staged_store(case):
    """store "staged" (the tile through shared memory, one bulk copy per row): the same
    bytes as the direct stores, M / N tails included (the interpreter's bulk-copy model also
    checks the proxy fence and that every copied byte was written)."""
    fmt, (m, n, k), kstep, stages, out_dtype, bm = case
    fmt = Format.from_name(fmt)
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(m + n + k), fmt, m, n, k)
    got, want = (TP.block_scaled_matmul_twophase(
        a, b, sfa5, sfb5, fmt, alpha=0.375, out_dtype=out_dtype, kstep=kstep, stages=stages,
        bm=bm, store=st, device="interp") for st in ("staged", "direct"))
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 400, 224), 192, "staged", "bfloat16"),  # 3 column tiles, N tail
    ("mxfp4", (70, 200, 96), 192, "staged", "float32"),  # N tail inside the 2nd tile
    ("nvfp4", (130, 390, 160), 192, "direct", "float32"),  # N % 8 != 0: direct stores
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-bn{c[2]}-{c[3]}-{c[4]}")
def test_interp_tile_width(case):
    """Tiles 128 x 192 (``wgmma m64n192k16``, B's workspace made for that width): the same
    bytes as 128 x 256 tiles (the same k16 order per element); 128 is refused."""
    fmt, (m, n, k), bn, store, out_dtype = case
    fmt = Format.from_name(fmt)
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(m + n + k), fmt, m, n, k)
    got, want = (TP.block_scaled_matmul_twophase(
        a, b, sfa5, sfb5, fmt, alpha=0.375, out_dtype=out_dtype, bn=w, store=st,
        device="interp") for w, st in ((bn, store), (256, "direct")))
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert TP.grid(m, n, bn=bn) == (-(-m // 128) * -(-n // bn), 1, 1)
    with pytest.raises(ValueError, match="bn must be one of"):
        TP.TwophaseMatmulSpec("nvfp4", bn=128)


@pytest.mark.interp
def test_interp_staged_store_persistent():
    """The persistent schedule with the staged store (the tile staged after the ring and its
    mbarriers, 3 stages): 6 tiles on 2 CTAs give the one-CTA-per-tile direct stores' bytes,
    M / N tails included."""
    m, n, k = 260, 520, 224
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(5), NVFP4, m, n, k)
    got, want = (TP.block_scaled_matmul_twophase(
        a, b, sfa5, sfb5, NVFP4, alpha=0.375, schedule=sch, store=st, ctas=2, device="interp")
        for sch, st in (("persistent", "staged"), ("tiles", "direct")))
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    spec = TP.TwophaseMatmulSpec("nvfp4", schedule="persistent", store="staged")
    assert spec.stages == 3 and spec.staging_bytes == 128 * (512 + 16)
    assert spec.dynamic_shared_bytes == 3 * 384 * 128 + 3 * 16 + spec.staging_bytes


@pytest.mark.interp
def test_interp_staged_store_fused_epilogue():
    """A fused epilogue with an input (bias) and a residual on the staged store: the same
    bytes as the direct store (the epilogue's loads stay inside C)."""
    from blockscale.ops import matmul_epilogue as ep

    m, n, k = 130, 264, 96
    rng = np.random.default_rng(8)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    inputs = {"bias": rng.standard_normal(n).astype(np.float32)}
    got, want = (TP.block_scaled_matmul_twophase(
        a, b, sfa5, sfb5, NVFP4, alpha=0.5, epilogue=ep.chain(ep.bias(), ep.relu()),
        epilogue_inputs=inputs, store=st, device="interp") for st in ("staged", "direct"))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert (got.astype(np.float32) >= 0).all() and got.astype(np.float32).max() > 0


@pytest.mark.interp
def test_interp_staged_store_needs_proxy_fence(monkeypatch):
    """Without the proxy fence the bulk copies would read generic-proxy stores the async
    proxy need not see: the interpreter's model refuses it."""
    from blockscale.compiler.arch import wgmma as W
    from blockscale.runtime.interpreter.ops_wgmma import WgmmaOrderError

    m, n, k = 64, 64, 64
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(2), NVFP4, m, n, k)
    wa, wb = TP.dequantize_operands(a, b, sfa5, sfb5, NVFP4, device="interp")
    spec = TP.TwophaseMatmulSpec("nvfp4", "float32", store="staged")
    for fenced in (True, False):  # the kernel cache is bypassed: build the IR here
        if not fenced:
            monkeypatch.setattr(W, "fence_proxy_async_shared", lambda **kw: None)
        c = np.zeros(m * n, np.float32)
        run = lambda c=c: _run_phase2(spec, (1, 1, 1), wa, wb, c, m, n, k)
        if fenced:
            run()
            assert np.abs(c).max() > 0
            continue
        with pytest.raises(WgmmaOrderError, match="fence.proxy.async"):
            run()


def test_staged_store_dispatch_choice(monkeypatch):
    """The dispatch stages the epilogue where rows of C are 16-byte aligned, unless
    BLOCKSCALE_SM90_STAGED_STORE=0 (tools/sanitize.sh's initcheck pass)."""
    from blockscale.ops import _staged_store_ir as S

    assert [S.dispatch_store("bfloat16", n) for n in (5760, 12)] == ["staged", "direct"]
    assert [S.dispatch_store("float32", n) for n in (12, 6)] == ["staged", "direct"]
    monkeypatch.setenv(S.ENV_SWITCH, "0")
    assert S.dispatch_store("bfloat16", 5760) == "direct"
    assert TP.fast_path("sm_90a", NVFP4, 8192, 5760, 2944, "bfloat16", None) is not None


def test_staged_store_arguments():
    """Clear errors: an unknown store, a ring too small for the staged f32 tile, rows that
    are not 16-byte aligned."""
    with pytest.raises(ValueError, match="store"):
        TP.TwophaseMatmulSpec("nvfp4", store="tma")
    with pytest.raises(ValueError, match="stages=2"):
        TP.TwophaseMatmulSpec("nvfp4", "float32", kstep=64, stages=2, store="staged")
    spec = TP.TwophaseMatmulSpec("nvfp4", store="staged")
    assert spec.kernel_name == "bs_twophase_nvfp4_128x256_k64_s4_bf16_st"
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(1), NVFP4, 8, 12, 32)
    with pytest.raises(ValueError, match="n=12"):
        TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, NVFP4, store="staged",
                                        device="interp")


@pytest.mark.interp
@pytest.mark.parametrize("broken", [False, True])
def test_interp_persistent_phases_continue(broken, monkeypatch):
    """The persistent ring counts its steps over the CTA's life: restarting the step count
    (and so the mbarrier parities) at each tile deadlocks or reads a stale stage in the
    interpreter's mbarrier model."""
    from blockscale.ops import _twophase_ir as T
    from blockscale.runtime.interpreter.ops_tma import MBarrierDeadlockError

    if broken:  # consume / refill see the tile-local k-step instead of the CTA step
        consume, refill = T._Ring.consume, T._Ring.refill
        local = lambda ring, step: T.bir.urem(step, ring.steps)
        monkeypatch.setattr(T._Ring, "consume", lambda ring, step, acc: consume(
            ring, local(ring, step), acc))
        monkeypatch.setattr(T._Ring, "refill", lambda ring, step, nxt, total, fill: refill(
            ring, local(ring, step), nxt, total, fill))
    m, n, k = 260, 256, 192  # 3 tiles on 1 CTA, 3 steps each over 2 stages
    rng = np.random.default_rng(4)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    wa, wb = TP.dequantize_operands(a, b, sfa5, sfb5, NVFP4, device="interp")
    spec = TP.TwophaseMatmulSpec("nvfp4", "float32", stages=2, schedule="persistent")
    c = np.zeros(m * n, np.float32)
    run = lambda: _run_phase2(spec, (1, 1, 1), wa, wb, c, m, n, k)
    if broken:
        with pytest.raises(MBarrierDeadlockError):
            run()
        return
    run()
    want = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, NVFP4, out_dtype="float32",
                                           stages=2, device="interp")
    np.testing.assert_array_equal(c.reshape(m, n), want)


@pytest.mark.interp
def test_interp_sw128_layouts_must_match():
    """Phase 2 reading workspaces of the other layout gives other bytes (the swizzle is not
    a no-op on either side); the matching pair equals the no-swizzle result."""
    from blockscale import runtime

    m, n, k = 64, 256, 128
    rng = np.random.default_rng(11)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    dev = runtime.get_device("interp")
    ops = [dev.to_device(np.ascontiguousarray(x)) for x in (a, b, sfa5, sfb5)]
    out = {}
    for ws_sw in TP.SWIZZLES:
        wa, wb = TP.dequantize_operands(*ops, NVFP4, swizzle=ws_sw, device=dev)
        for sw in TP.SWIZZLES:
            c = TP.matmul_workspaces(wa, wb, NVFP4, m, n, k, out_dtype="float32", swizzle=sw,
                                     device=dev)
            out[ws_sw, sw] = np.asarray(dev.to_host(c)).view(np.uint32)
    assert np.array_equal(out["none", "none"], out["128b", "128b"])
    assert not np.array_equal(out["none", "none"], out["none", "128b"])
    assert not np.array_equal(out["none", "none"], out["128b", "none"])


def test_interp_swizzled_descriptor_model():
    """ops_wgmma's 128B model: row r, K byte b of an operand at a 1024-aligned atom + 32 h
    is at atom + 1024 (r // 8) + 128 (r % 8) + (((2 h + b // 16) ^ (r % 8)) * 16) + b % 16;
    starts past the atom's first row, SBOs off the 1024-byte repeat and base offsets are
    refused (not modeled)."""
    from blockscale.compiler.arch.wgmma import descriptor_bits
    from blockscale.runtime.interpreter.ops_wgmma import operand_addresses

    r = np.arange(64)[:, None]
    b = np.arange(32)[None, :]
    for h in range(4):
        got = operand_addresses(descriptor_bits(0x2000 + 32 * h, 16, 1024, "128b"), 64)
        want = 0x2000 + 1024 * (r // 8) + 128 * (r % 8) + (((2 * h + b // 16) ^ (r % 8)) * 16
                                                           + b % 16)
        np.testing.assert_array_equal(got, want)
    for desc in (descriptor_bits(0x2000 + 128, 16, 1024, "128b"),  # row 1 of the atom
                 descriptor_bits(0x2000 + 112, 16, 1024, "128b"),  # K bytes cross the row
                 descriptor_bits(0x2000, 16, 1024 + 128, "128b"),
                 descriptor_bits(0x2000, 16, 1024, "128b", base_offset=1)):
        with pytest.raises(NotImplementedError):
            operand_addresses(desc, 64)


@pytest.mark.interp
@pytest.mark.parametrize("bm,swizzle", [(128, "none"), (192, "none"), (128, "128b"),
                                        (192, "128b")])
def test_interp_workspace_layout(bm, swizzle):
    """Phase 1 alone: the workspace is the [rows_pad, k_pad] bf16 dequantization with the
    scales folded in (NVFP4: exact), zeros outside the operand, stored stage-ordered: per
    tile-row (128 rows of A, 256 of B) the 16-byte K chunks, chunk-major; 128B-swizzled:
    per tile-row and 64-element K block the rows' 128-byte lines, chunk c of row r at
    ``(c ^ (r % 8)) * 16``."""
    import ml_dtypes

    from blockscale.formats import decode_e2m1, decode_e4m3

    m, n, k = 140, 3, 96
    rng = np.random.default_rng(5)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    ws, wsb = TP.dequantize_operands(a, b, sfa5, sfb5, NVFP4, bm=bm, swizzle=swizzle,
                                     device="interp")
    assert ws.size + wsb.size == TP.workspace_bytes(m, n, k, bm)
    kp = TP.k_padded(k)
    for x, sf, w, rows, tile in ((a, sfa, ws, m, bm), (b, sfb, wsb, n, 256)):
        if swizzle == "none":
            w = w.view(ml_dtypes.bfloat16).reshape(-1, kp // 8, tile, 8)  # tile, chunk, row, 8
            w = w.transpose(0, 2, 1, 3).reshape(-1, kp).astype(np.float64)
        else:  # tile, k64 block, row, physical chunk, 8
            w = w.view(ml_dtypes.bfloat16).reshape(-1, kp // 64, tile, 8, 8)
            phys = np.arange(8)[None, :] ^ (np.arange(tile) % 8)[:, None]  # [row, logical c]
            w = w[:, :, np.arange(tile)[:, None], phys]  # tile, block, row, c, 8
            w = w.transpose(0, 2, 1, 3, 4).reshape(-1, kp).astype(np.float64)
        codes = np.stack([x & 0xF, x >> 4], axis=-1).reshape(rows, k)
        vals = decode_e2m1(codes).astype(np.float64) * np.repeat(
            np.abs(decode_e4m3(sf).astype(np.float64)), 16, axis=1)[:, :k]
        np.testing.assert_array_equal(w[:rows, :k], vals)
        assert w.shape[0] == TP.padded(rows, tile)
        assert not w[rows:].any() and not w[:, k:].any()


@pytest.mark.ir
def test_spec_validation_and_bundle():
    with pytest.raises(ValueError, match="fmt must be one of"):
        TP.TwophaseMatmulSpec("mxfp8")
    with pytest.raises(ValueError, match="kstep must be one of"):
        TP.TwophaseMatmulSpec("nvfp4", kstep=16)
    with pytest.raises(ValueError, match=r"stages must be an int in \[2, 4\]"):
        TP.TwophaseMatmulSpec("nvfp4", kstep=64, stages=5)
    with pytest.raises(ValueError, match="bm must be one of"):
        TP.TwophaseMatmulSpec("nvfp4", bm=256)
    with pytest.raises(ValueError, match="swizzle '128b' needs kstep 64"):
        TP.TwophaseMatmulSpec("nvfp4", kstep=32, swizzle="128b")
    with pytest.raises(ValueError, match="swizzle must be one of"):
        TP.TwophaseMatmulSpec("nvfp4", swizzle="64b")
    with pytest.raises(ValueError, match="swizzle must be one of"):
        TP.DequantSpec("nvfp4", swizzle="32b")
    assert TP.TwophaseMatmulSpec("nvfp4", swizzle="128b").kernel_name.endswith("_bf16_sw128")
    s = TP.TwophaseMatmulSpec("nvfp4", bm=192)
    assert (s.stages, s.block, s.dynamic_shared_bytes) == (4, (384, 1, 1), 4 * 448 * 128 + 64)
    assert TP.TwophaseMatmulSpec("nvfp4", kstep=32, bm=192).stages == 8
    with pytest.raises(ValueError, match="target must be one of"):
        TP.DequantSpec("nvfp4", "sm_100a")
    with pytest.raises(ValueError, match="tile must be one of"):
        TP.DequantSpec("nvfp4", tile=64)
    s = TP.TwophaseMatmulSpec("nvfp4")
    assert (s.kstep, s.stages, s.dynamic_shared_bytes) == (64, 4, 4 * 384 * 128 + 4 * 16)
    assert TP.TwophaseMatmulSpec("nvfp4", kstep=32).stages == 8  # a power of two above 4
    assert max(TP.TwophaseMatmulSpec("nvfp4", kstep=ks, bm=bm).dynamic_shared_bytes
               for ks in TP.KSTEPS for bm in TP.BMS) <= 227 * 1024
    assert TP.workspace_bytes(8192, 5760, 2944) == 2 * 2944 * (8192 + 5888)
    specs = TP.bundle_specs("sm_90a")
    assert len(specs) == (2 * 5 * 2 + 2 * 2 * 2 + 2 * 2 + 2 * 2 * 2 + 2 * 2 + 2 * 2 * 4 + 2
                          + 2 * 2 + 2 * 2 + 2 * 2 * 2 + 2 * 2
                          + 2 * 2 * 2 + 2 * 2  # cluster=2: staged bf16 / f32, + pdl bf16
                          + 2 * 2 * 3 + 2 * 2 * 2)  # 192-row staged at 3 widths, + pdl
    with pytest.raises(ValueError, match="schedule must be one of"):
        TP.TwophaseMatmulSpec("nvfp4", schedule="stream-k")
    with pytest.raises(ValueError, match="ctas must be a positive int"):
        TP.grid(8192, 5760, 128, "persistent", 0)
    p = TP.TwophaseMatmulSpec("nvfp4", schedule="persistent")
    assert p.kernel_name == "bs_twophase_nvfp4_128x256_k64_s4_bf16_persistent"
    assert p.args() == TP.TwophaseMatmulSpec("nvfp4").args()  # the grid is the only change
    assert TP.grid(8192, 5760) == (1472, 1, 1)
    assert TP.grid(8192, 5760, schedule="persistent") == (TP.SM_COUNT, 1, 1)
    assert TP.bundle_specs("sm_100a") == []
    assert all(TP.build(x).operation.verify() for x in specs[:3])


@pytest.mark.interp
def test_host_validation():
    rng = np.random.default_rng(0)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, MXFP8, 4, 4, 32)
    with pytest.raises(ValueError, match="fmt must be one of"):
        TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, MXFP8, device="interp")
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, 4, 4, 48)
    with pytest.raises(ValueError, match="k % 32 == 0"):
        TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, NVFP4, device="interp")
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, 4, 4, 32)
    with pytest.raises(ValueError, match="stages must be"):
        TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, NVFP4, device="interp", stages=1)
    empty = TP.block_scaled_matmul_twophase(a[:0], b, sfa5[:0], sfb5, NVFP4, device="interp")
    assert empty.shape == (0, 4)


LOWER_SPECS = [pytest.param(s, id=s.kernel_name,
                            marks=[pytest.mark.slow] if "f32" in s.kernel_name else [])
               for s in TP.bundle_specs("sm_90a")]


@pytest.mark.lower
@pytest.mark.parametrize("spec", LOWER_SPECS)
def test_kernel_sass(spec):
    """Phase 2: kstep / 16 HGMMA.64x256x16 per step, two bulk copies (UBLKCP) per step
    (stages - 1 prologue steps and once in the loop), mbarrier ops (SYNCS), no LDGSTS, no
    LDG, no MEMBAR (no proxy fence), no spills. Phase 1: two 128-bit loads and eight 128-bit
    stores per thread (128B-swizzled: staged through shared memory, 8 STS / LDS.128)."""
    kernel = TP.kernel(spec)
    sass, meta = kernel.asm["sass"], kernel.meta
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0
    if isinstance(spec, TP.DequantSpec):
        assert len(re.findall(r"LDG\.E\.128", sass)) == 2
        assert len(re.findall(r"STG\.E\.128", sass)) == 8
        staged = 8 if spec.swizzle == "128b" else 0  # lines staged in shared memory
        assert len(re.findall(r"STS\.128", sass)) == len(re.findall(r"LDS\.128", sass)) == staged
        return
    assert len(re.findall(rf"HGMMA\.64x{spec.bn}x16\.F32\.BF16", sass)) == spec.kstep // 16
    # persistent: the K loop's refill of this tile's k-step or (by division) a later tile's
    persistent, staged = spec.schedule == "persistent", spec.store == "staged"
    # staged: one more bulk copy (shared -> global, a row of C per thread), no global stores,
    # one 4- / 8-byte shared store per accumulator pair, the epilogue's proxy fence
    assert len(re.findall(r"\bUBLKCP\b", sass)) == 2 * spec.stages + 2 * persistent + staged
    assert re.search(r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT", sass)
    assert re.search(r"SYNCS\.ARRIVE\.TRANS64", sass)
    assert not re.search(r"\b(LDGSTS|LDG)\b", sass)
    # cluster=2: the release arrive on the cluster barrier after the K loop (.CTA + .GPU)
    assert len(re.findall(r"\bMEMBAR\b", sass)) == staged + 2 * (spec.cluster > 1)
    assert (len(re.findall(r"\bSTG\b", sass)) == 0) == staged
    assert len(re.findall(r"\bSTS(\.64)?\b", sass)) == spec.bn // 4 * staged  # 2 pairs a n8
    # the wgmmas of a step are not serialized (ptxas C7515): one wait per step, after all
    assert len(re.findall(r"WARPGROUP\.DEPBAR", sass)) == 2
    assert meta["registers"] <= 255
    assert meta["dynamic_shared_bytes"] == spec.dynamic_shared_bytes
    assert meta["static_shared_bytes"] == 0  # one .extern buffer: ring + mbarriers (issue #9)
    # the descriptors' constant bits: SWIZZLE_128B (bit 62), SBO 1024, LBO 16; a 1024-byte
    # aligned ring (each stage and B span start on an atom: base offset 0)
    ptx = kernel.asm["ptx"]
    sw_bits = (1 << 62) | (1024 >> 4) << 32 | (16 >> 4) << 16
    assert (str(sw_bits) in ptx) == (spec.swizzle == "128b")
    align = 1024 if spec.swizzle == "128b" else 128
    assert f".extern .shared .align {align} .b8" in ptx
    # persistent: a tile loop, whose back edge follows the epilogue's last store and goes
    # back before the K loop (the shortest loop around the HGMMAs); one CTA per tile: only
    # the out-of-line mbarrier retry blocks branch back from past the stores (into the K loop)
    loops, mmas = _sass_loops(sass), _sass_at(sass, "HGMMA")
    k_loop = min((x for x in loops if x[0] <= min(mmas) and max(mmas) <= x[1]),
                 key=lambda x: x[1] - x[0])
    last_store = max(_sass_at(sass, "UBLKCP" if staged else "STG"))
    tile_loops = [x for x in loops if x[0] < k_loop[0] and x[1] > last_store]
    assert len(tile_loops) == persistent


def _sass_at(sass, op):
    """Addresses of the SASS instructions ``op`` (predicated or not)."""
    return [int(a, 16) for a in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?"
                                           + op + r"\b", sass)]


def _sass_loops(sass):
    """(target, branch) address pairs of the backward branches."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?BRA\s+(?:\S+,\s*)?0x([0-9a-f]+)",
                     line)
        if m and int(m.group(2), 16) < int(m.group(1), 16):
            out.append((int(m.group(2), 16), int(m.group(1), 16)))
    return out


GPU_SHAPES = [(8192, 5760, 2944), (777, 2560, 8192), (1000, 1024, 1056)]


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", TP.FORMATS)
@pytest.mark.parametrize("kstep,bm,swizzle,schedule", [
    pytest.param(ks, bm, sw, sch, id=f"k{ks}-bm{bm}" + ("-sw128" if sw == "128b" else "")
                 + ("-persistent" if sch == "persistent" else ""))
    for ks, bm, sw, sch in ((64, 128, "none", "tiles"), (32, 128, "none", "tiles"),
                            (64, 192, "none", "tiles"), (64, 128, "128b", "tiles"),
                            (64, 192, "128b", "tiles"), (64, 128, "none", "persistent"))])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gpu(shape, out_dtype, kstep, bm, swizzle, schedule, fmt):
    """The stated fp32 bound (f32) / bf16 consistency on sampled rows (HGMMA rounds
    differently from the interpreter's model, so no bit-identity on hardware); the swizzled
    pair and the persistent kernel also equal the default pair bit for bit (same operands,
    same HGMMA order per tile)."""
    m, n, k = shape
    rng = np.random.default_rng(m + n)
    rows = np.unique(np.concatenate([np.arange(min(m, 64)), np.arange(max(0, m - 64), m),
                                     rng.integers(0, m, 64)]))
    fmt = Format.from_name(fmt)
    _check(m, n, k, fmt, out_dtype, kstep, device="cuda", rows=rows, identical=False, bm=bm,
           swizzle=swizzle, schedule=schedule)
    if swizzle != "none" or schedule != "tiles":
        a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(m * 131 + n * 7 + k),
                                                   fmt, m, n, k)
        got, ref = (TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, fmt, alpha=0.375,
                                                    out_dtype=out_dtype, kstep=kstep, bm=bm,
                                                    swizzle=sw, schedule=sch, device="cuda")
                    for sw, sch in ((swizzle, schedule), ("none", "tiles")))
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", TP.FORMATS)
@pytest.mark.parametrize("shape", [*GPU_SHAPES, (300, 264, 512)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bn", TP.BNS, ids=lambda b: f"bn{b}")
def test_gpu_staged_store(shape, out_dtype, fmt, bn):
    """store "staged" (shared memory + one bulk copy per row) writes the direct stores' bytes
    on the H200, M / N tails included (300 x 264: a 8-column last tile); 128 x 192 tiles
    too (the same HGMMA k16 order per element as 128 x 256)."""
    m, n, k = shape
    fmt = Format.from_name(fmt)
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(m + n + k), fmt, m, n, k)
    got, ref = (TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, fmt, alpha=0.375,
                                                out_dtype=out_dtype, store=st, bn=w,
                                                device="cuda")
                for st, w in (("staged", bn), ("direct", 256)))
    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", TP.FORMATS)
@pytest.mark.parametrize("shape", [(8192, 5760, 2944), (300, 264, 512)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_staged_store_persistent(shape, fmt):
    """The persistent schedule with the staged store (tile staged after the ring): the bytes
    of one CTA per tile with direct stores, on the H200."""
    m, n, k = shape
    fmt = Format.from_name(fmt)
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(m + n + k), fmt, m, n, k)
    got, ref = (TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, fmt, alpha=0.375,
                                                schedule=sch, store=st, device="cuda")
                for sch, st in (("persistent", "staged"), ("tiles", "direct")))
    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


def _run_phase2(spec, grid, wa, wb, c, m, n, k):
    """Phase 2 of ``spec`` built here (past the kernel cache: the tests patch IR helpers)
    and run in the interpreter on workspaces ``wa`` / ``wb`` into ``c`` (alpha 1)."""
    from blockscale.runtime.interpreter import run_kernel

    run_kernel(str(TP.build(spec)), spec.kernel_name, grid, spec.block,
               [wa, wb, c, m, n, k, 1.0], "sm_90a",
               dynamic_shared_bytes=spec.dynamic_shared_bytes)


def _bulk_kernel(mode: str) -> str:
    """One block of 32 threads: thread 0 inits an mbarrier, expects 256 bytes and bulk-copies
    this block's 256 bytes of ``x`` into shared memory (``mode``: "ok"; "short": copies only
    128 bytes; "none": no copy); everyone waits on the mbarrier and stores the bytes of
    thread ``31 - t`` to ``y``."""
    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import cpasync, tma
    from blockscale.compiler.arch import wgmma as W
    from blockscale.launch import KernelArg

    args = (KernelArg("x", "buffer", "uint8"), KernelArg("y", "buffer", "uint8", "out"))
    with bir.kernel_module("k", "sm_90a", args, 32) as kb:
        sh = tma.shared_buffer(kb, "1024xi8", align=128)
        base = W.shared_address(sh)
        bar = bir.add(base, bir.as_i64(bir.const(512)))
        tid = bir.thread_idx("x")
        goff = bir.as_i64(bir.mul(bir.block_idx("x"), 256))
        with bir.when(bir.eq(tid, 0)):
            cpasync.mbarrier_init(bar, 1)
            tma.fence_mbarrier_init()
        bir.barrier()
        with bir.when(bir.eq(tid, 0)):
            cpasync.mbarrier_arrive_expect_tx(bar, 256)
            if mode != "none":
                n = 256 if mode == "ok" else 128
                cpasync.bulk_copy(base, bir.add(cpasync.global_address(kb.arg("x")), goff), n,
                                  bar)
        cpasync.mbarrier_wait(bar, bir.as_i32(bir.const(0)))
        v = bir.vector_load(bir.vec(8, bir.i8()), sh, bir.mul(bir.sub(31, tid), 8),
                            alignment=8)
        bir.vector_store(v, kb.arg("y"), bir.add(bir.mul(bir.block_idx("x"), 256),
                                                 bir.mul(tid, 8)), alignment=8)
    return str(kb.module)


@pytest.mark.interp
@pytest.mark.parametrize("mode", ["ok", "short", "none"])
def test_interp_bulk_copy_completes_the_mbarrier(mode):
    """cp.async.bulk lands its bytes and completes their transaction count: the wait passes
    once every expected byte arrived; too few bytes leave the phase open (deadlock)."""
    from blockscale.runtime.interpreter import run_kernel
    from blockscale.runtime.interpreter.ops_tma import MBarrierDeadlockError

    text = _bulk_kernel(mode)
    x = np.arange(2 * 256, dtype=np.uint8) ^ 0x5A
    y = np.zeros_like(x)
    if mode != "ok":
        with pytest.raises(MBarrierDeadlockError):
            run_kernel(text, "k", (2, 1, 1), (32, 1, 1), [x, y], "sm_90a")
        return
    run_kernel(text, "k", (2, 1, 1), (32, 1, 1), [x, y], "sm_90a")
    want = x.reshape(2, 32, 8)[:, ::-1].reshape(-1)
    np.testing.assert_array_equal(y, want)


@pytest.mark.interp
def test_interp_phase2_alone():
    """matmul_workspaces (phase 2 on phase 1's workspaces) equals the pair bit for bit; a
    workspace of the wrong size is refused."""
    from blockscale import runtime

    m, n, k = 130, 300, 160
    rng = np.random.default_rng(3)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    dev = runtime.get_device("interp")
    ops = [dev.to_device(np.ascontiguousarray(x)) for x in (a, b, sfa5, sfb5)]
    wa, wb = TP.dequantize_operands(*ops, NVFP4, device=dev)
    got = dev.to_host(TP.matmul_workspaces(wa, wb, NVFP4, m, n, k, alpha=0.5, device=dev))
    want = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, NVFP4, alpha=0.5, device=dev)
    assert np.array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))
    with pytest.raises(ValueError, match="wb must hold"):
        TP.matmul_workspaces(wa, wa, NVFP4, m, n, k, device=dev)


@pytest.mark.interp
@pytest.mark.parametrize("broken", [False, True])
def test_interp_ring_release_after_retire(broken, monkeypatch):
    """The ring releases a stage only after the wgmmas that read it retired: a kernel that
    waits one group less (``wait_group 2``, so the stage of step s - 1 is refilled while its
    wgmmas may still read it) fails in the interpreter's wgmma model."""
    from blockscale.ops import _twophase_ir as T
    from blockscale.runtime.interpreter.ops_wgmma import WgmmaOrderError

    if broken:
        real = T.W.wait_group
        monkeypatch.setattr(T.W, "wait_group", lambda n, **kw: real(n + 1 if n else n, **kw))
    m, n, k = 128, 256, 320  # 5 steps of k64 over 3 stages: every stage is refilled
    rng = np.random.default_rng(9)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    wa, wb = TP.dequantize_operands(a, b, sfa5, sfb5, NVFP4, device="interp")
    spec = TP.TwophaseMatmulSpec("nvfp4", "float32", stages=3)
    c = np.zeros(m * n, np.float32)
    run = lambda: _run_phase2(spec, TP.grid(m, n), wa, wb, c, m, n, k)
    if broken:
        with pytest.raises(WgmmaOrderError, match="overwritten before the wait_group"):
            run()
        return
    run()
    want = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, NVFP4, out_dtype="float32",
                                           stages=3, device="interp")
    np.testing.assert_array_equal(c.reshape(m, n), want)


def test_dispatch_hook():
    """fast_path: sm_90a NVFP4 / MXFP4, K % 32 == 0, M >= MIN_M, workspaces within the cap,
    unless BLOCKSCALE_SM90_TWOPHASE=0; registered before the wgmma kernel."""
    from blockscale.ops import matmul

    m = TP.MIN_M
    assert TP.fast_path("sm_90a", NVFP4, m, 5760, 2944, "bfloat16", None) is not None
    for args in (("sm_90a", NVFP4, m - 1, 5760, 2944), ("sm_90a", MXFP8, m, 5760, 2944),
                 ("sm_90a", NVFP4, m, 5760, 2960), ("sm_100a", NVFP4, m, 5760, 2944),
                 ("sm_90a", NVFP4, 1 << 17, 8192, 8192)):  # 2.3 GB of workspaces
        assert TP.fast_path(*args, "bfloat16", None) is None, args
    paths = matmul.FAST_PATHS
    assert paths.index(TP.fast_path) < paths.index(matmul_wgmma.fast_path)


@pytest.mark.interp
def test_dispatch_runs_both_phases(monkeypatch):
    """The dense dispatch (MIN_M lowered to this small case) returns the direct call's bytes;
    switched off, the wgmma kernel runs instead."""
    from blockscale.ops import matmul

    m, n, k = 130, 264, 96
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(3), NVFP4, m, n, k)
    direct = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, NVFP4, alpha=0.5,
                                             out_dtype="float32", device="interp")
    monkeypatch.setattr(TP, "MIN_M", 100)
    got = matmul.block_scaled_matmul(a, b, sfa5, sfb5, NVFP4, alpha=0.5, out_dtype="float32",
                                     device="interp", target="sm_90a")
    np.testing.assert_array_equal(got.view(np.uint32), direct.view(np.uint32))
    monkeypatch.setenv(TP.ENV_SWITCH, "0")
    assert TP.fast_path("sm_90a", NVFP4, m, n, k, "float32", None) is None


@pytest.mark.interp
@pytest.mark.parametrize("broken", [False, True])
def test_interp_sw128_phase1_staging_barrier(broken, monkeypatch):
    """The swizzled phase 1 copies other threads' staged lines out after a CTA barrier:
    without it the interpreter's race checker fails the kernel."""
    from blockscale.ops import _twophase_ir as T
    from blockscale.runtime.interpreter import SharedMemoryRaceError, run_kernel

    if broken:
        monkeypatch.setattr(T.bir, "barrier", lambda **kw: None)
    rows, k = 40, 128
    a, _, _, _, sfa5, _ = random_dense_case(np.random.default_rng(2), NVFP4, rows, 8, k)
    spec = TP.DequantSpec("nvfp4", tile=128, swizzle="128b")
    ws = np.zeros(2 * 128 * k, np.uint8)
    run = lambda: run_kernel(str(TP.build(spec)), spec.kernel_name, TP.dequant_grid(128, k),
                             spec.block, [a, sfa5, ws, rows, 128, k], "sm_90a")
    if broken:
        with pytest.raises(SharedMemoryRaceError):
            run()
        return
    run()
    want, _ = TP.dequantize_operands(a, a, sfa5, sfa5, NVFP4, swizzle="128b", device="interp")
    np.testing.assert_array_equal(ws, want)
