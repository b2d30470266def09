"""The TMA-fed, warp-specialized K loop of the sm_90a wgmma matmul (``pipeline="ws"``).

* interp: the kernel IR (TMA boxes with zero fill, 32-byte swizzle, the mbarrier ring and the
  wgmmas modeled by runtime/interpreter/ops_tma.py and ops_wgmma.py) against the float64
  value with the fp32 bound of test_matmul_common.py, and bit for bit against the
  register-fed kernel of the same variant (same operands, same wgmma order); M/N/K tails
  and more K-steps than ring stages (the ring wraps, the parities flip).
* ir: the spec validation, and the MLIR of every other bundled wgmma kernel does not
  depend on the new pipeline.
* lower: HGMMA + UTMALDG + SYNCS (mbarrier) in the sm_90a SASS, no spills.
* gpu: the bound on an H100/H200 (``make gpu-bundle`` collects the ws specs)::

      BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_wgmma_ws.py
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

from blockscale.formats import MXFP4, NVFP4, Format
from blockscale.ops import _wgmma_ws, matmul_wgmma


def _run(a, b, sfa5, sfb5, alpha, out_dtype, tiles, dequant, pipeline, device, fmt=NVFP4):
    return matmul_wgmma.block_scaled_matmul_wgmma(
        a, b, sfa5, sfb5, fmt, alpha=alpha, out_dtype=out_dtype, tiles=tiles,
        dequant=dequant, kstep=64, scaling="fold", pipeline=pipeline, device=device)


def _check(m, n, k, tiles, dequant, out_dtype, device="interp", identical=True, rows=None,
           fmt=NVFP4, pipeline="ws"):
    """The bound (MX "fold": two k16 roundings per 32-block, J more) and, in the
    interpreter, bit-identity with the register-fed kernel of the same variant."""
    rng = np.random.default_rng(m * 131 + n * 7 + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 0.375, rows)
    extra = fmt.kblocks(k) if fmt.is_mx else 0
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1 + extra)
    got = _run(a, b, sfa5, sfb5, 0.375, out_dtype, tiles, dequant, pipeline, device, fmt)
    assert got.shape == (m, n)
    if rows is not None:
        got = got[rows]
    if out_dtype == "float32":
        assert_f32_within_bound(got, exact, bound)
    else:
        assert_bf16_consistent(got, exact, bound)
    if identical:
        ref = _run(a, b, sfa5, sfb5, 0.375, out_dtype, tiles, dequant, "early", device, fmt)
        ref = ref if rows is None else ref[rows]
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


@pytest.mark.interp
@pytest.mark.parametrize("dequant", matmul_wgmma.DEQUANT)
@pytest.mark.parametrize("mnk", [(128, 128, 64), (70, 130, 96), (130, 72, 320), (1, 5, 32)],
                         ids=lambda s: "x".join(map(str, s)))
def test_interp_ws_128x128(mnk, dequant):
    """Small and tail shapes; K = 320: five steps through a four-stage ring."""
    m, n, k = mnk
    _check(m, n, k, (128, 128), dequant, "float32" if (m + n) % 2 else "bfloat16")


@pytest.mark.interp
@pytest.mark.parametrize("mnk", [(70, 130, 96), (130, 72, 544), (1, 5, 32)],
                         ids=lambda s: "x".join(map(str, s)))
def test_interp_ws_mxfp4(mnk):
    """MXFP4 (E8M0 scales, a step is half an atom column; K = 544: 9 steps, 5 columns)."""
    m, n, k = mnk
    _check(m, n, k, (128, 128), "lut", "float32" if (m + n) % 2 else "bfloat16", fmt=MXFP4)


@pytest.mark.interp
@pytest.mark.slow
def test_interp_ws_128x256_tails():
    """128 x 256 tiles (two B scale atoms per stage; the second past N is zero filled)."""
    _check(130, 200, 352, (128, 256), "shift", "float32")


@pytest.mark.interp
@pytest.mark.parametrize("case", [((128, 128), "nvfp4", "shift", (70, 130, 320)),
                                  ((128, 256), "nvfp4", "shift", (130, 200, 352)),
                                  ((128, 128), "mxfp4", "lut", (130, 72, 544))],
                         ids=lambda c: f"{c[0][0]}x{c[0][1]}-{c[1]}")
def test_interp_tma_thread0(case):
    """pipeline="tma": thread 0 of the consumers issues the copies (no producer warpgroup)."""
    tiles, name, dequant, (m, n, k) = case
    _check(m, n, k, tiles, dequant, "float32", fmt=Format.from_name(name), pipeline="tma")


@pytest.mark.ir
def test_spec_validation_and_bundle():
    """pipeline="ws" takes NVFP4 fold k64 with bm = 128 only; the bundle holds its 128 x 128
    kernels (a producer warpgroup: 384 threads, TMA maps after the portable arguments)."""
    s = matmul_wgmma.WgmmaMatmulSpec("nvfp4", "float32", None, 128, 128, "sm_90a", "shift",
                                     64, "fold", "ws")
    assert s.block == (384, 1, 1) and s.kernel_name.endswith("_k64_ws_f32")
    assert [a.name for a in s.args()][-4:] == ["a_map", "b_map", "sfa_map", "sfb_map"]
    assert s.dynamic_shared_bytes == s.shared_bytes
    for bad in [{"kstep": 32}, {"bm": 64, "bn": 64},
                {"fmt": "mxfp8", "dequant": "cvt", "scaling": "promote", "kstep": 32}]:
        kw = {"fmt": "nvfp4", "bm": 128, "bn": 128, "dequant": "shift", "kstep": 64,
              "scaling": "fold", "pipeline": "ws"} | bad
        with pytest.raises(ValueError, match="pipeline='ws'"):
            matmul_wgmma.WgmmaMatmulSpec(**kw)
    with pytest.raises(ValueError, match="pipeline"):
        matmul_wgmma.WgmmaMatmulSpec("nvfp4", pipeline="wsx")
    ws = [b for b in matmul_wgmma.bundle_specs("sm_90a") if b.pipeline == "ws"]
    assert len(ws) == 6 and {(b.bm, b.bn) for b in ws} == {(128, 128)}
    assert {(b.fmt, b.dequant) for b in ws} == {("nvfp4", "lut"), ("nvfp4", "shift"),
                                                ("mxfp4", "lut")}
    tma = [b for b in matmul_wgmma.bundle_specs("sm_90a") if b.pipeline == "tma"]
    assert len(tma) == 12 and all(b.block == (256, 1, 1) for b in tma)
    assert _wgmma_ws.tensormap_values(130, 72, 352) == {
        "a_map": (176, 130), "b_map": (176, 72), "sfa_map": (256, 2 * 2 * 6),
        "sfb_map": (256, 2 * 1 * 6)}


#: every bundled TMA-fed spec; the f32 twins (the same K loop) are slow
WS_SPECS = [pytest.param(s, id=s.kernel_name,
                         marks=[pytest.mark.slow] if s.out_dtype == "float32" else [])
            for s in matmul_wgmma.bundle_specs("sm_90a") if s.ws]


@pytest.mark.lower
@pytest.mark.parametrize("spec", WS_SPECS)
def test_kernel_sass(spec):
    """Four HGMMA.64xNx16 per step, the bulk tensor copies (UTMALDG: A, B and the scale
    atoms, issued for the RING - 1 prologue steps and once in the loop), mbarrier SYNCS, no
    global loads, no spills (register cap: 384 threads "ws", 256 "tma")."""
    kernel = matmul_wgmma.kernel(spec)
    sass, meta = kernel.asm["sass"], kernel.meta
    assert len(re.findall(rf"HGMMA\.64x{spec.bn}x16\.F32\.BF16", sass)) == 4
    copies = 2 + spec.bm // 128 + spec.bn // 128
    assert len(re.findall(r"UTMALDG\.2D", sass)) == copies * _wgmma_ws.RING
    assert "SYNCS" in sass and "WARPGROUP.DEPBAR.LE" in sass
    assert not re.search(r"\bLDG\.", sass)  # every operand byte comes through TMA
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0
    assert meta["registers"] <= (168 if spec.pipeline == "ws" else 255)
    assert meta["dynamic_shared_bytes"] == spec.dynamic_shared_bytes
    assert meta["static_shared_bytes"] <= _wgmma_ws.ring_bytes(spec.bm, spec.bn) + 1024 + 64
    # the bf16 stages follow the static ring (issue #9: a demoted 0-byte static variable as
    # the dynamic base overlapped the mbarriers and the ring on the H200)
    ptx = kernel.asm["ptx"]
    assert ".extern .shared .align 16 .b8 __extern_shared[];" in ptx
    assert not re.search(r"\.shared \.align \d+ \.b8 \w+;", ptx)


GPU_SHAPES = [(8192, 5760, 2944), (777, 2560, 8192), (1000, 1024, 1056), (1, 5760, 2944)]


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("variant", [(f, dq, p, t) for f in _wgmma_ws.FORMATS
                                     for dq, _ in matmul_wgmma.ws_variants(f)
                                     for p, ts in matmul_wgmma.WS_BUNDLE_TILES.items()
                                     for t in ts],
                         ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}-{v[3][0]}x{v[3][1]}")
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gpu(shape, out_dtype, variant):
    """The stated fp32 bound (f32) / bf16 consistency on sampled rows (HGMMA rounds
    differently from the interpreter's model, so no bit-identity on hardware)."""
    m, n, k = shape
    rng = np.random.default_rng(m + n)
    rows = np.unique(np.concatenate([np.arange(min(m, 64)), np.arange(max(0, m - 64), m),
                                     rng.integers(0, m, 64)]))
    name, dequant, pipeline, tiles = variant
    _check(m, n, k, tiles, dequant, out_dtype, "cuda", identical=False, rows=rows,
           fmt=Format.from_name(name), pipeline=pipeline)
