"""The sm_90a wgmma block-scaled matmul (the default sm_90a dispatch for M > 16).

* interp: the kernel IR (wgmma modeled by runtime/interpreter/ops_wgmma.py from the PTX ISA)
  against the float64 value on exactly dequantized operands with the fp32 bound of
  test_matmul_common.py, and bit for bit against the portable kernel (same fp32 roundings
  in the same order in the interpreter's model, see blockscale/ops/_wgmma_ir.py); M/N/K
  tails; the dispatch and its BLOCKSCALE_SM90_WGMMA=0 opt-out.
* lower: HGMMA.64xNx16.F32.BF16 in the sm_90a SASS, no spills.
* gpu: the bound checks on an H100/H200 (not bit-identity: HGMMA rounds differently; run
  with the bundle, ``make gpu-bundle`` collects ``matmul_wgmma.bundle_specs``)::

      BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_wgmma.py
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import (
    assert_bf16_consistent,
    assert_f32_within_bound,
    exact_dense,
    f32_error_bound,
    random_dense_case,
)

from blockscale import layouts
from blockscale.formats import MXFP4, MXFP8, NVFP4, Format
from blockscale.ops import matmul, matmul_sm90, matmul_wgmma

#: (fmt, dequant, scaling, kstep) of every variant built
VARIANTS = [(f, dq, sc, ks) for f, v in matmul_wgmma.VARIANTS.items()
            for (dq, sc), ksteps in v.items() for ks in ksteps]


def _extra_roundings(fmt, scaling, k):
    """MX "fold": the two k16 wgmmas of a 32-block each round the accumulator (J more)."""
    return fmt.kblocks(k) if fmt.is_mx and scaling == "fold" else 0


def _identical_to(fmt, scaling, dequant=None):
    """What the interpreter's result equals bit for bit: the portable kernel (FP4 except MX
    "fold"), the mma.sync kernel (MXFP8 "cvt": the same two k16 roundings per block), or
    None."""
    if dequant == "copy":  # one k32 per block: one rounding (the model), not the mma's two
        return None
    if fmt.name == "mxfp8":
        return "mma"
    return None if fmt.is_mx and scaling == "fold" else "portable"


def _check(m, n, k, alpha, out_dtype, device, run, rows=None, bound_only=False, fmt=NVFP4,
           extra=0, identical="portable"):
    rng = np.random.default_rng(m * 31 + n + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, alpha, rows)
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1 + extra)
    got = run(a, b, sfa5, sfb5, alpha, out_dtype)
    assert got.shape == (m, n)
    sel = got if rows is None else got[rows]
    if out_dtype == "float32":
        assert_f32_within_bound(sel, exact, bound)
    else:
        assert_bf16_consistent(sel, exact, bound)
    if bound_only or identical is None:
        return
    if identical == "mma":
        ref = matmul_sm90.block_scaled_matmul_sm90(a, b, sfa5, sfb5, fmt, alpha=alpha,
                                                   out_dtype=out_dtype, device=device)
    else:
        ref = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha,
                                               out_dtype=out_dtype, device=device,
                                               target="sm_90a")
    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


def _direct(tiles, device, dequant="lut", kstep=32, fmt=NVFP4, scaling=None):
    def run(a, b, sfa5, sfb5, alpha, out_dtype):
        return matmul_wgmma.block_scaled_matmul_wgmma(a, b, sfa5, sfb5, fmt, alpha=alpha,
                                                      out_dtype=out_dtype, tiles=tiles,
                                                      dequant=dequant, kstep=kstep,
                                                      scaling=scaling, device=device)
    return run


@pytest.mark.interp
@pytest.mark.parametrize("kstep", matmul_wgmma.KSTEPS)
@pytest.mark.parametrize("dequant", matmul_wgmma.DEQUANT)
@pytest.mark.parametrize("tiles", [(64, 64), (128, 128)])
@pytest.mark.parametrize("mnk", [(64, 64, 128), (130, 72, 256), (1, 64, 64), (70, 130, 96)],
                         ids=lambda s: "x".join(map(str, s)))
def test_interp_matches_exact_and_portable(mnk, tiles, dequant, kstep):
    m, n, k = mnk
    out_dtype = "float32" if (m + n + tiles[0]) % 2 else "bfloat16"
    _check(m, n, k, 0.225, out_dtype, "interp", _direct(tiles, "interp", dequant, kstep))


@pytest.mark.interp
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[0] != "nvfp4"],
                         ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("tiles", [(64, 64), (128, 128)])
@pytest.mark.parametrize("mnk", [(130, 72, 256), (70, 130, 96), (1, 64, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_interp_mx(mnk, tiles, variant):
    """MXFP4 / MXFP8 variants: the bound (MX "fold": J more roundings), bit-identity where
    :func:`_identical_to` says so."""
    name, dequant, scaling, kstep = variant
    fmt = Format.from_name(name)
    m, n, k = mnk
    out_dtype = "float32" if (m + n + tiles[0]) % 2 else "bfloat16"
    _check(m, n, k, 0.5, out_dtype, "interp",
           _direct(tiles, "interp", dequant, kstep, fmt, scaling), fmt=fmt,
           extra=_extra_roundings(fmt, scaling, k),
           identical=_identical_to(fmt, scaling, dequant))


@pytest.mark.interp
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("tiles", [pytest.param((64, 64), marks=pytest.mark.slow), (128, 128),
                                   pytest.param((128, 256), marks=pytest.mark.slow)])
def test_interp_late_loads(tiles, variant):
    """pipeline="late" (the next step's loads after the wgmma issue): same results."""
    name, dequant, scaling, kstep = variant
    if tiles[1] > 128 and scaling == "promote":
        pytest.skip("promote takes bn <= 128")
    fmt = Format.from_name(name)
    m, n, k = 70, 130, 160

    def run(a, b, sfa5, sfb5, alpha, out_dtype):
        return matmul_wgmma.block_scaled_matmul_wgmma(a, b, sfa5, sfb5, fmt, alpha=alpha,
                                                      out_dtype=out_dtype, tiles=tiles,
                                                      dequant=dequant, kstep=kstep,
                                                      scaling=scaling, pipeline="late",
                                                      device="interp")
    _check(m, n, k, 0.5, "float32", "interp", run, fmt=fmt,
           extra=_extra_roundings(fmt, scaling, k),
           identical=_identical_to(fmt, scaling, dequant))


@pytest.mark.interp
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[2] == "fold"],
                         ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("mnk", [(130, 300, 96), (70, 130, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_interp_128x256(mnk, variant):
    """tiles=(128, 256): 3 pieces per thread and step (k64), 1.5 (k32: the last round
    guarded); the bound, and bit-identity with the portable kernel for NVFP4."""
    name, dequant, scaling, kstep = variant
    fmt = Format.from_name(name)
    m, n, k = mnk
    _check(m, n, k, 0.5, "float32" if m % 2 else "bfloat16", "interp",
           _direct((128, 256), "interp", dequant, kstep, fmt, scaling), fmt=fmt,
           extra=_extra_roundings(fmt, scaling, k),
           identical=_identical_to(fmt, scaling, dequant))


@pytest.mark.interp
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[0] == "mxfp4"],
                         ids=lambda v: "-".join(map(str, v)))
def test_interp_every_e8m0_scale(variant):
    """Every E8M0 byte (0x00 = 2^-127 .. 0xFE = 2^127, 0xFF NaN) on A, B's scale 254 - A's
    (sA sB = 2^(r - c): normal f32), every E2M1 code pair: "fold" operands stay exact bf16
    (MX_FOLD_EXP; 2^-130 subnormals, no overflow), "promote" equals the portable kernel."""
    _, dequant, scaling, kstep = variant
    m = n = 32
    k = 256  # 8 blocks: scale byte 32 j + r covers 0..255 once
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (m, k // 2), dtype=np.uint8)
    b = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    sfa = (32 * np.arange(8)[None, :] + np.arange(m)[:, None]).astype(np.uint8)
    sfb = np.where(sfa == 255, 255, 254 - sfa.astype(np.int64)).astype(np.uint8)
    sfa, sfb = (x.view(ml_dtypes.float8_e8m0fnu) for x in (sfa, sfb))
    sfa5, sfb5 = layouts.interleave(sfa), layouts.interleave(sfb)
    got = _direct((64, 64), "interp", dequant, kstep, MXFP4, scaling)(a, b, sfa5, sfb5, 1.0,
                                                                      "float32")
    naive = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, MXFP4, alpha=1.0,
                                             out_dtype="float32", device="interp")
    nan = np.isnan(naive)
    assert nan[m - 1].all() and nan[:, n - 1].all() and nan.sum() == m + n - 1
    assert np.array_equal(np.isnan(got), nan)
    if scaling == "promote":
        assert np.array_equal(got.view(np.uint32), naive.view(np.uint32))
    fin = ~nan
    with np.errstate(invalid="ignore"):
        exact, abs_sum = exact_dense(a, b, sfa, sfb, MXFP4, k)
    bound = f32_error_bound(abs_sum, MXFP4, k, n_mul=1 + _extra_roundings(MXFP4, scaling, k))
    assert_f32_within_bound(got[fin], exact[fin], bound[fin])


@pytest.mark.interp
@pytest.mark.parametrize("dequant", matmul_wgmma.DEQUANT)
def test_interp_every_code_and_scale(dequant):
    """Every E2M1 code against every E4M3 scale byte (NaN codes 0x7F/0xFF included, D3: the
    scale's sign ignored): rows of A cycle through the 16 codes, scales through 0..255."""
    m, n, k = 64, 64, 256
    a = np.tile(np.arange(256, dtype=np.uint8), (m, k // 2 // 256 + 1))[:, :k // 2]
    a = (a + np.arange(m, dtype=np.uint8)[:, None]).astype(np.uint8)
    b = np.flip(a, axis=1).copy()[:n]
    sfa = ((np.arange(m)[:, None] * 16 + np.arange(k // 16)[None, :]) % 256).astype(np.uint8)
    sfb = np.flip(sfa, axis=0).copy()[:n]
    from blockscale import layouts
    from blockscale.formats import decode_e4m3

    sfa, sfb = (x.view(np.uint8) for x in (sfa, sfb))
    got = _direct((64, 64), "interp", dequant)(a, b, layouts.interleave(sfa.view(
        ml_dtypes.float8_e4m3fn)), layouts.interleave(sfb.view(ml_dtypes.float8_e4m3fn)),
        1.0, "float32")
    naive = matmul.naive_block_scaled_matmul(a, b, layouts.interleave(sfa.view(
        ml_dtypes.float8_e4m3fn)), layouts.interleave(sfb.view(ml_dtypes.float8_e4m3fn)),
        NVFP4, alpha=1.0, out_dtype="float32", device="interp")
    assert np.isnan(decode_e4m3(sfa & 0x7F)).any()
    assert np.array_equal(np.isnan(got), np.isnan(naive))
    assert np.array_equal(got.view(np.uint32), naive.view(np.uint32))


@pytest.mark.interp
def test_dispatch_default_and_opt_out(monkeypatch):
    monkeypatch.setenv(matmul_wgmma.ENV_SWITCH, "0")
    assert matmul_wgmma.fast_path("sm_90a", NVFP4, 64, 64, 128, "bfloat16", None) is None
    monkeypatch.delenv(matmul_wgmma.ENV_SWITCH, raising=False)
    assert matmul_wgmma.fast_path("sm_90a", NVFP4, 64, 64, 128, "bfloat16", None) is not None
    for args in (("sm_90a", NVFP4, 16, 64, 128), ("sm_90a", NVFP4, 64, 64, 112),
                 ("sm_90a", MXFP8, 64, 64, 48), ("sm_100a", NVFP4, 64, 64, 128)):
        assert matmul_wgmma.fast_path(*args, "bfloat16", None) is None
    paths = matmul.FAST_PATHS
    assert paths.index(matmul_wgmma.fast_path) < paths.index(matmul_sm90.fast_path)
    for fmt in (NVFP4, MXFP4, MXFP8):
        def run(a, b, sfa5, sfb5, alpha, out_dtype, fmt=fmt):
            return matmul.block_scaled_matmul(a, b, sfa5, sfb5, fmt, alpha=alpha,
                                              out_dtype=out_dtype, device="interp",
                                              target="sm_90a")
        dq, sc, _ = matmul_wgmma.DEFAULTS[fmt.name]
        _check(40, 72, 160, 0.5, "bfloat16", "interp", run, fmt=fmt,
               extra=_extra_roundings(fmt, sc, 160), identical=_identical_to(fmt, sc, dq))


def test_wide_tiles_dispatch_the_tma_loop():
    """M >= WIDE_TILE_MIN_M: the 128 x 256 TMA-fed kernel for FP4 (when the two-phase kernel
    does not take the shape first)."""
    for fmt in (NVFP4, MXFP4):
        spec = matmul_wgmma.spec_for(fmt, matmul_wgmma.WIDE_TILE_MIN_M, 5760)
        assert (spec.bm, spec.bn, spec.pipeline) == (128, 256, matmul_wgmma.WIDE_PIPELINE)
        assert spec in matmul_wgmma.bundle_specs()
    assert not matmul_wgmma.spec_for(NVFP4, 1024, 5760).ws
    assert not matmul_wgmma.spec_for(MXFP8, 8192, 5760).ws


def test_vector_aligned():
    """The dense dispatch's gate for the tiled kernels: numpy, or 16-byte aligned device
    memory (duck-typed __cuda_array_interface__ here)."""
    from blockscale.ops import _matmul_host as H

    class Mem:
        def __init__(self, ptr):
            self.ptr = ptr

        @property
        def __cuda_array_interface__(self):
            return {"data": (self.ptr, False), "shape": (16,), "typestr": "|u1",
                    "version": 3, "strides": None}
    host = np.zeros(16, np.uint8)
    assert H.vector_aligned(host, Mem(0x1000), Mem(0x2010), None)
    assert not H.vector_aligned(host, Mem(0x1008))
    assert not H.vector_aligned(object())


def test_spec_checks():
    for bad in ({"fmt": "nvfp4", "bm": 64, "bn": 128}, {"fmt": "mxfp8", "dequant": "lut"},
                {"fmt": "mxfp8", "kstep": 64}, {"fmt": "mxfp4", "scaling": "promote", "kstep": 64},
                {"fmt": "nvfp4", "scaling": "promote"}, {"fmt": "mxfp4", "dequant": "shift"}):
        with pytest.raises(ValueError):
            matmul_wgmma.WgmmaMatmulSpec(**bad)
    assert matmul_wgmma.WgmmaMatmulSpec("nvfp4").block == (256, 1, 1)
    for f, (dq, sc, ks) in matmul_wgmma.DEFAULTS.items():
        spec = matmul_wgmma.WgmmaMatmulSpec(f)
        assert (spec.dequant, spec.scaling, spec.kstep) == (dq, sc, ks)
    assert matmul_wgmma.bundle_specs("sm_100a") == []
    assert {(s.fmt, s.dequant, s.scaling, s.kstep) for s in matmul_wgmma.bundle_specs()} == \
        set(VARIANTS)
    from blockscale.ops import _wgmma_ws

    assert {s.pipeline for s in matmul_wgmma.bundle_specs()} == \
        set(matmul_wgmma.PIPELINES) | set(_wgmma_ws.PIPELINES)
    with pytest.raises(ValueError):
        matmul_wgmma.WgmmaMatmulSpec("nvfp4", pipeline="eager")
    assert {(s.bm, s.bn) for s in matmul_wgmma.bundle_specs()} == {(128, 128), (64, 64),
                                                                    (128, 256)}
    assert {(s.fmt, s.dequant, s.kstep) for s in matmul_wgmma.bundle_specs() if s.bn == 256} \
        == {(f, d, k) for f, d, sc, k in VARIANTS if sc == "fold"}
    with pytest.raises(ValueError):
        matmul_wgmma.WgmmaMatmulSpec("mxfp8", bm=128, bn=256)
    assert matmul_wgmma.WgmmaMatmulSpec("mxfp4", bm=128, bn=256).scaling == "fold"
    assert matmul_wgmma.WgmmaMatmulSpec("nvfp4", bm=128, bn=256).block == (256, 1, 1)
    big = matmul_wgmma.WgmmaMatmulSpec("nvfp4", kstep=64)
    assert big.dynamic_shared_bytes == 96 * 1024 + 512  # + the bf16 scale table
    assert matmul_wgmma.WgmmaMatmulSpec("nvfp4", bm=64, bn=64,
                                        kstep=32).dynamic_shared_bytes == 0
    assert matmul_wgmma.WgmmaMatmulSpec("mxfp8").dynamic_shared_bytes == 3 * 256 * (64 + 4)


#: registers ptxas may give a variant (measured: 117-144 for fold at bn <= 128; 185-199 for
#: 128 x 128 "promote", two 64-register fragments; 205-255 for 128 x 256, 128-register
#: fragments; one CTA of 256 threads per SM at <= 255)
MAX_REGISTERS = {("fold", 64): 168, ("fold", 128): 168, ("promote", 64): 232,
                 ("promote", 128): 232, ("fold", 256): 255}


def _sass_params():
    """Every bundled spec: f32-output and "late" twins of a checked bf16 spec are marked
    slow (the same mainloop; ~1.5 s of ptxas each)."""
    out = []
    for s in matmul_wgmma.bundle_specs("sm_90a"):
        if s.ws:  # the TMA-fed loops: test_matmul_wgmma_ws.py
            continue
        twin = s.pipeline != "early" or s.out_dtype != "bfloat16"
        out.append(pytest.param(s, id=s.kernel_name,
                                marks=[pytest.mark.slow] if twin else []))
    return out


@pytest.mark.lower
@pytest.mark.parametrize("spec", _sass_params())
def test_kernel_sass(spec):
    kernel = matmul_wgmma.kernel(spec)
    sass, meta = kernel.asm["sass"], kernel.meta
    if spec.dequant in matmul_wgmma.FP8_DEQUANT:  # one QGMMA per 32-block
        assert len(re.findall(rf"QGMMA\.64x{spec.bn}x32\.F32\.E4M3\.E4M3", sass)) == 1
        assert "HGMMA" not in sass
    else:
        suffix = r"\.BF16" if spec.fmt != "mxfp8" else r"(?!\.BF16)"  # f16: no suffix
        assert len(re.findall(rf"HGMMA\.64x{spec.bn}x16\.F32{suffix}", sass)) == \
            spec.kstep // 16
    assert "WARPGROUP.ARRIVE" in sass and "WARPGROUP.DEPBAR.LE" in sass
    assert "FENCE.VIEW.ASYNC.S" in sass
    assert "HMMA" not in sass
    if spec.dynamic_shared_bytes:
        assert meta["dynamic_shared_bytes"] == spec.dynamic_shared_bytes
        assert meta["static_shared_bytes"] <= 16  # the __dynamic_shmem__0 symbol (1 byte)
    else:
        assert re.search(r"\.shared \.align 1024 \.b8 __wg_", kernel.asm["ptx"])
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0
    assert meta["registers"] <= MAX_REGISTERS[spec.scaling, spec.bn]
    assert meta["static_shared_bytes"] <= 48 * 1024


GPU_DENSE = [(777, 2560, 8192, 0.225), (8192, 5760, 2944, 1.0), (1000, 1024, 1056, 1.0),
             (1, 5760, 2944, 1.0), (128, 5760, 2944, 0.5)]


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("shape", GPU_DENSE, ids=lambda s: "x".join(map(str, s[:3])))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gpu(shape, out_dtype, variant, pipeline="early"):
    """The stated fp32 bound elementwise (f32 out; MX "fold": J more roundings) and bf16
    consistency (bf16 out: equal to bf16(exact) wherever the bound does not straddle a
    rounding midpoint). Each format's default variant runs through the dispatch (M > 16).

    Finding of the first H200 run: HGMMA's fp32 accumulation does *not* round like the
    interpreter's model (exact block sum + one RNE per block), so NVFP4 f32 outputs are not
    bit-identical to the portable kernel for M >= 128; the bound held on every shape. So no
    equality is asserted where HGMMA adds into a running accumulator. MXFP4 "promote" is
    different: each block's HGMMAs start from zero and sum at most 32 multiples of 1/4 below
    2^11 (exact in any adder of >= 13 bits), and the block is added by an IEEE FFMA, so its
    f32 output must equal the portable kernel's bit for bit on hardware too."""
    name, dequant, scaling, kstep = variant
    fmt = Format.from_name(name)
    m, n, k, alpha = shape
    rng = np.random.default_rng(m + n)
    rows = np.unique(np.concatenate([np.arange(min(m, 64)), np.arange(max(0, m - 64), m),
                                     rng.integers(0, m, 64)]))
    default = (dequant, scaling, kstep) == matmul_wgmma.DEFAULTS[name] and pipeline == "early"

    def run(a, b, sfa5, sfb5, alpha, out_dtype):  # the default variant through the dispatch
        if m <= matmul_wgmma.MIN_M or not default:
            return matmul_wgmma.block_scaled_matmul_wgmma(a, b, sfa5, sfb5, fmt, alpha=alpha,
                                                          out_dtype=out_dtype, device="cuda",
                                                          dequant=dequant, kstep=kstep,
                                                          scaling=scaling, pipeline=pipeline)
        with pytest.MonkeyPatch.context() as mp:  # MXFP8: mma.sync (this test's bound),
            mp.setenv("BLOCKSCALE_SM90_TWOPHASE_MX8", "0")  # not the two-phase MXFP8 kernels
            return matmul.block_scaled_matmul(a, b, sfa5, sfb5, fmt, alpha=alpha,
                                              out_dtype=out_dtype, device="cuda",
                                              target="sm_90a")
    exact_bits = (name, scaling, out_dtype) == ("mxfp4", "promote", "float32")
    _check(m, n, k, alpha, out_dtype, "cuda", run, rows, bound_only=not exact_bits, fmt=fmt,
           extra=_extra_roundings(fmt, scaling, k))


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("shape", GPU_DENSE[:2], ids=lambda s: "x".join(map(str, s[:3])))
def test_gpu_late_loads(shape, variant):
    """pipeline="late": the same checks, f32 output."""
    test_gpu(shape, "float32", variant, pipeline="late")


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4], ids=lambda f: f.name)
def test_gpu_wide_dispatch_misaligned_inputs_fall_back(fmt):
    """The dispatch at M >= WIDE_TILE_MIN_M: 16-byte aligned torch tensors run a tiled kernel
    (within the bound); an operand at an 8-byte offset (no 16-byte loads, no tensor map) runs
    the portable kernel: bit-identical to naive_block_scaled_matmul, no misaligned access."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    m, n, k = matmul_wgmma.WIDE_TILE_MIN_M, 256, 128
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(np.random.default_rng(5), fmt, m, n, k)

    scale_dtype = getattr(torch, np.dtype(sfa5.dtype).name, None)
    if scale_dtype is None:
        pytest.skip(f"this torch has no {np.dtype(sfa5.dtype).name}")

    def dev(x, offset=0):
        raw = np.ascontiguousarray(x).view(np.uint8)
        flat = torch.zeros(raw.size + offset, dtype=torch.uint8, device="cuda")
        view = flat[offset:].view(raw.shape)
        view.copy_(torch.from_numpy(raw))
        return view if x.dtype == np.uint8 else view.view(scale_dtype)

    def run(a_dev):
        out = matmul.block_scaled_matmul(a_dev, dev(b), dev(sfa5), dev(sfb5), fmt,
                                         out_dtype="float32", device="cuda", target="sm_90a")
        return out.numpy()
    aligned, shifted = run(dev(a)), run(dev(a, 8))
    naive = matmul.naive_block_scaled_matmul(a, b, sfa5, sfb5, fmt, out_dtype="float32",
                                             device="cuda")
    np.testing.assert_array_equal(shifted.view(np.uint32), naive.view(np.uint32))
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k)
    extra = _extra_roundings(fmt, "fold", k)
    assert_f32_within_bound(aligned, exact, f32_error_bound(abs_sum, fmt, k, n_mul=1 + extra))
