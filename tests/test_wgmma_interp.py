"""The wgmma helpers (compiler/arch/wgmma.py) and their interpreter model (ops_wgmma.py).

* descriptor bits: every field round-trips through the model's decoder;
* operand addressing: shared-memory images built here from the ISA's canonical layouts (no
  swizzle: core matrices placed by LBO / SBO; 32/64/128B swizzle: the TMA model's swizzled
  tile image, :func:`ops_tma.swizzle_offsets`) are read back as the logical matrices;
* fragment layout: the D registers of a warpgroup cover the 64 x N tile exactly once, and
  each warp's n8 slices are the ``mma.m16n8`` C layout;
* a kernel built with the helpers (global -> shared copy, fence.proxy.async, barrier,
  wgmma.fence, chained mma_async over K, commit, wait) runs in the interpreter and gives
  A @ B^T for every swizzle mode, several N and LBO/SBO choices; leaving out a fence or
  overwriting an operand before the wait raises;
* the same kernel lowers to HGMMA.64xNx16.F32.BF16 in sm_90a SASS (``lower`` marker).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("mlir")

from blockscale.runtime.interpreter import ops_tma, ops_wgmma

SPANS = {"32b": 32, "64b": 64, "128b": 128}


# ---- pure model checks ------------------------------------------------------------------


def test_descriptor_fields_round_trip():
    from blockscale.compiler.arch import wgmma as W

    rng = np.random.default_rng(0)
    for sw in W.SWIZZLE_MODES:
        for _ in range(200):
            start, lbo, sbo = (int(x) * 16 for x in rng.integers(0, 1 << 14, 3))
            off = int(rng.integers(0, 8))
            d = ops_wgmma.decode_descriptor(W.descriptor_bits(start, lbo, sbo, sw, off))
            assert d == {"start": start, "lbo": lbo, "sbo": sbo, "base_offset": off,
                         "swizzle": W.SWIZZLE_MODES[sw]}
    with pytest.raises(ValueError):
        W.descriptor_bits(8, 16, 16)
    with pytest.raises(ValueError):
        W.descriptor_bits(1 << 18, 16, 16)


def _core_matrix_image(mat: np.ndarray, lbo: int, sbo: int, size: int) -> np.ndarray:
    """[rows, K] bf16 -> the no-swizzle K-major image: core matrix (row group g, K chunk c)
    of 8 rows x 16 bytes at g*SBO + c*LBO, its row i at +16 i."""
    rows, k = mat.shape
    raw = mat.view(np.uint8).reshape(rows, 2 * k)
    img = np.zeros(size, np.uint8)
    for g in range(rows // 8):
        for c in range(2 * k // 16):
            for i in range(8):
                o = g * sbo + c * lbo + 16 * i
                img[o:o + 16] = raw[8 * g + i, 16 * c:16 * c + 16]
    return img


def _swizzled_image(mat: np.ndarray, swizzle: str) -> np.ndarray:
    """[rows, S/2] bf16 -> the tile the TMA model writes for a box of rows of S bytes."""
    raw = mat.view(np.uint8).reshape(-1)
    img = np.zeros(raw.size, np.uint8)
    img[ops_tma.swizzle_offsets(raw.size, swizzle)] = raw
    return img


def _rand_bf16(rng, shape) -> np.ndarray:
    """Small integers times powers of two: every product and sum below is exact."""
    v = rng.integers(-8, 9, shape) * 2.0 ** rng.integers(-3, 4, shape)
    return v.astype(ml_dtypes.bfloat16)


def _read(img: np.ndarray, desc: int, rows: int) -> np.ndarray:
    return ops_wgmma.read_operand(img, ops_wgmma.operand_addresses(desc, rows))


@pytest.mark.parametrize("rows", [64, 8, 256])
@pytest.mark.parametrize("order", ["k_contiguous", "rows_contiguous"])
def test_no_swizzle_addresses(rows, order):
    from blockscale.compiler.arch import wgmma as W

    rng = np.random.default_rng(rows)
    mat = _rand_bf16(rng, (rows, 64))
    lbo, sbo = (128, 1024) if order == "k_contiguous" else (rows // 8 * 128, 128)
    img = _core_matrix_image(mat, lbo, sbo, rows * 128)
    for ks in range(4):
        got = _read(img, W.descriptor_bits(ks * 2 * lbo, lbo, sbo, "none"), rows)
        assert np.array_equal(got, mat[:, 16 * ks:16 * ks + 16].astype(np.float64))


@pytest.mark.parametrize("swizzle", list(SPANS))
@pytest.mark.parametrize("rows", [64, 128])
def test_swizzled_addresses_match_tma_tiles(swizzle, rows):
    from blockscale.compiler.arch import wgmma as W

    span = SPANS[swizzle]
    rng = np.random.default_rng(span + rows)
    mat = _rand_bf16(rng, (rows, span // 2))
    img = _swizzled_image(mat, swizzle)
    for ks in range(span // 32):
        desc = W.descriptor_bits(32 * ks, 16, 8 * span, swizzle)
        got = _read(img, desc, rows)
        assert np.array_equal(got, mat[:, 16 * ks:16 * ks + 16].astype(np.float64))
    if span > 32:  # without the swizzle the rows read differently
        plain = _read(img.reshape(-1), W.descriptor_bits(0, 16, 8 * span, "none"), rows)
        assert not np.array_equal(plain, mat[:, :16].astype(np.float64))


@pytest.mark.parametrize("n", [8, 64, 256])
def test_fragment_layout(n):
    from blockscale.runtime.interpreter import ops_mma

    rows, cols = ops_wgmma.fragment_coords(n)
    hit = np.zeros((64, n), int)
    np.add.at(hit, (rows, cols), 1)
    assert (hit == 1).all()
    # warp w, n8 tile j: mma.m16n8 C element e of lane l is D[16w + row, 8j + col]
    c = np.arange(32 * 4, dtype=np.float32).reshape(1, 32, 4)
    tile = np.zeros((16, 8))
    g, t = np.arange(32) >> 2, np.arange(32) & 3
    for e in range(4):
        tile[g + 8 * (e >> 1), 2 * t + (e & 1)] = c[0, :, e]
    zero_a = np.zeros((1, 32, 4, 2))
    zero_b = np.zeros((1, 32, 2, 2))
    assert np.array_equal(ops_mma.mma_m16n8k16(zero_a, zero_b, c)[0], c[0])  # same C map
    for w in range(4):
        for j in range(n // 8):
            for e in range(4):
                lanes = np.arange(32)
                assert (rows[32 * w + lanes, 4 * j + e] == 16 * w + g + 8 * (e >> 1)).all()
                assert (cols[32 * w + lanes, 4 * j + e] == 8 * j + 2 * t + (e & 1)).all()


# ---- a kernel through the interpreter ------------------------------------------------------


def build_probe(n: int, lbo: int, sbo: int, swizzle: str, b_off: int, ksteps: int,
                kstep_bytes: int, img_bytes: int, *, wgmma_fence: bool = True,
                proxy_fence: bool = True, overwrite: bool = False):
    """One warpgroup: img (global) -> shared, then D = sum over ksteps of A_k @ B_k^T with
    A at shared byte 0 and B at ``b_off``; thread t writes its N/2 registers to
    out[t*N/2 : (t+1)*N/2]."""
    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import wgmma as W
    from blockscale.launch import KernelArg
    from blockscale.ops._mma_ir import workgroup_buffer

    args = (KernelArg("img", "buffer", "uint8"), KernelArg("out", "buffer", "float32"))
    name = f"wgmma_probe_n{n}"
    with bir.kernel_module(name, "sm_90a", args, (128, 1, 1)) as kb:
        smem = workgroup_buffer(kb, img_bytes, bir.i8())
        tid = bir.thread_idx("x")
        v16 = bir.vec(16, bir.i8())
        for it in range(img_bytes // 16 // 128):
            o = bir.mul(bir.add(tid, it * 128), 16)
            bir.vector_store(bir.vector_load(v16, kb.arg("img"), o, alignment=16), smem, o,
                             alignment=16)
        if proxy_fence:
            W.fence_proxy_async_shared()
        bir.barrier()
        base = W.shared_address(smem)
        da = W.descriptor(base, lbo=lbo, sbo=sbo, swizzle=swizzle)
        db = W.advance(da, b_off)
        if wgmma_fence:
            W.fence()
        acc = W.zero_accumulator(n)
        for ks in range(ksteps):
            acc = W.mma_async_bf16(acc, W.advance(da, ks * kstep_bytes),
                                   W.advance(db, ks * kstep_bytes), n, accumulate=ks > 0)
        W.commit_group()
        if overwrite:
            bir.vector_store(bir.const(0, v16), smem, bir.mul(tid, 16), alignment=16)
        W.wait_group(0)
        for i, v in enumerate(W.accumulator_values(acc, n)):
            bir.store(v, kb.arg("out"), bir.add(bir.mul(tid, n // 2), i))
    return kb.module, name, args


def _probe_case(n: int, swizzle: str, order: str = "k_contiguous", seed: int = 0):
    """(build kwargs, image, A, B) for a 64 x n x K problem in the given layout."""
    rng = np.random.default_rng(seed + n)
    if swizzle == "none":
        k = 64
        a, b = _rand_bf16(rng, (64, k)), _rand_bf16(rng, (n, k))
        lbo, sbo = (128, 1024) if order == "k_contiguous" else (8 * 128, 128)
        if order != "k_contiguous" and n != 64:
            pytest.skip("rows-contiguous needs one LBO for A and B (n = 64)")
        a_img = _core_matrix_image(a, lbo, sbo, 64 * 128)
        b_img = _core_matrix_image(b, lbo, sbo, n * 128)
        kw = {"lbo": lbo, "sbo": sbo, "ksteps": 4, "kstep_bytes": 2 * lbo}
    else:
        span = SPANS[swizzle]
        k = span // 2
        a, b = _rand_bf16(rng, (64, k)), _rand_bf16(rng, (n, k))
        a_img, b_img = _swizzled_image(a, swizzle), _swizzled_image(b, swizzle)
        kw = {"lbo": 16, "sbo": 8 * span, "ksteps": span // 32, "kstep_bytes": 32}
    b_off = -(-a_img.size // 1024) * 1024
    img = np.zeros(b_off + -(-b_img.size // 2048) * 2048, np.uint8)
    img[:a_img.size] = a_img
    img[b_off:b_off + b_img.size] = b_img
    kw.update(swizzle=swizzle, b_off=b_off, img_bytes=img.size)
    return kw, img, a, b


def _run_probe(n, kw, img, **flags):
    from blockscale.runtime.interpreter import run_kernel

    module, name, _ = build_probe(n, **kw, **flags)
    out = np.zeros(128 * n // 2, np.float32)
    run_kernel(str(module), name, (1, 1, 1), (128, 1, 1), [img.copy(), out], "sm_90a")
    rows, cols = ops_wgmma.fragment_coords(n)
    d = np.full((64, n), np.nan, np.float32)
    d[rows, cols] = out.reshape(128, n // 2)
    return d


@pytest.mark.interp
@pytest.mark.parametrize("swizzle,n,order", [("none", 64, "k_contiguous"),
                                             ("none", 64, "rows_contiguous"),
                                             ("none", 8, "k_contiguous"),
                                             ("none", 256, "k_contiguous"),
                                             ("32b", 128, "k_contiguous"),
                                             ("64b", 72, "k_contiguous"),
                                             ("128b", 128, "k_contiguous")])
def test_probe_kernel_computes_ab(swizzle, n, order):
    kw, img, a, b = _probe_case(n, swizzle, order)
    d = _run_probe(n, kw, img)
    assert np.array_equal(d, (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32))


@pytest.mark.interp
@pytest.mark.parametrize("flag,msg", [({"wgmma_fence": False}, "without a wgmma.fence"),
                                      ({"proxy_fence": False}, "fence.proxy.async"),
                                      ({"overwrite": True}, "overwritten")])
def test_probe_ordering_errors(flag, msg):
    kw, img, _, _ = _probe_case(64, "128b")
    with pytest.raises(ops_wgmma.WgmmaOrderError, match=msg):
        _run_probe(64, kw, img, **flag)


@pytest.mark.lower
@pytest.mark.parametrize("n", [64, 128])
def test_probe_lowers_to_hgmma(n):
    from blockscale.compiler import pipeline

    kw, _, _, _ = _probe_case(n, "128b")
    module, name, args = build_probe(n, **kw)
    k = pipeline.compile_module(module, "sm_90a", kernel_name=name, args=args,
                                block=(128, 1, 1))
    sass = k.asm["sass"]
    assert sass.count(f"HGMMA.64x{n}x16.F32.BF16") == kw["ksteps"]
    assert "WARPSYNC" in sass or "WARPGROUP" in sass
    assert k.meta["spill_stores"] == 0
