"""Conversion IR builders (compiler/arch/convert.py) against the formats codecs, bit for bit.

Each helper is applied by a tiny kernel (one element per thread) run in the numpy interpreter;
inputs are exhaustive where small (all 256 E4M3 / E8M0 bytes), the E2M1/E4M3/E8M0 tie points
and a dense f32 sweep. The native instructions are checked in the PTX / AMDGCN.
"""

from __future__ import annotations

import numpy as np
import pytest
from _quantize_helpers import e2m1_grid_codes_numpy

from blockscale import formats as F

pytest.importorskip("mlir")

from mlir.dialects import arith

from blockscale.compiler import ir as B
from blockscale.compiler.arch import convert as C
from blockscale.launch import KernelArg
from blockscale.runtime.interpreter.kernel import run_kernel

TARGETS = ("sm_90a", "sm_100a", "gfx942", "gfx950")


def _apply(fn, inputs: np.ndarray, target: str, in_dtype: str = "float32") -> np.ndarray:
    """Run ``out[i] = fn(in[i])`` (fn: ir.Value -> i32 or f32 Value) in the interpreter."""
    n = inputs.size
    args = [KernelArg("src", "buffer", in_dtype), KernelArg("dst", "buffer", "int32", "out")]
    with B.kernel_module("conv", target, args, 64) as kb:
        i = B.global_thread_idx()
        with B.when(B.ult(i, n)):
            v = fn(B.load(kb.arg("src"), i))
            if not isinstance(v.type, type(B.i32())):
                v = arith.bitcast(B.i32(), v)
            B.store(v, kb.arg("dst"), i)
    text = B.module_text(kb.module) if hasattr(B, "module_text") else str(kb.module)
    out = np.zeros(n, np.int32)
    run_kernel(text, "conv", (-(-n // 64), 1, 1), (64, 1, 1), [inputs.copy(), out], target)
    return out


def _sweep() -> np.ndarray:
    """Dense f32 sweep: ties of every format, their neighbours, specials and random bits."""
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 448.0, 464.0, 480.0,
                     2.0 ** -6, 2.0 ** -7, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -127,
                     2.0 ** -126, 2.0 ** 127, 1.5 * 2.0 ** 127, 0.0, 1.0, 1e-38, 1e-45],
                    np.float32)
    near = np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)),
                           np.nextafter(ties, np.float32(0))])
    rng = np.random.default_rng(7)
    rand = rng.integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    grid = np.linspace(0, 8, 1025, dtype=np.float32)
    special = np.array([np.inf, np.nan], np.float32)
    pos = np.concatenate([near, grid, special, np.abs(rand)])
    return np.concatenate([pos, -pos]).astype(np.float32)


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
def test_e2m1_encode(target):
    x = _sweep()
    out = _apply(lambda v: C.convert(v, "f32", "e2m1", rounding="rn", target=target), x, target)
    assert np.array_equal(out.astype(np.uint8), F.encode_e2m1(x))


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
def test_e4m3_encode(target):
    x = _sweep()
    out = _apply(lambda v: C.convert(v, "f32", "e4m3", rounding="rn", target=target), x, target)
    assert np.array_equal(out.astype(np.uint8), F.encode_e4m3(x))


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
def test_e8m0_encode_up(target):
    x = np.abs(_sweep())
    out = _apply(lambda v: C.convert(v, "f32", "e8m0", rounding="rp", target=target), x, target)
    want = F.encode_e8m0_up(x)
    assert np.array_equal(out.astype(np.uint8), want)


@pytest.mark.interp
@pytest.mark.parametrize("rounding", ["up", "even", "floor"])
@pytest.mark.parametrize("fmt", [F.MXFP4, F.MXFP8])
def test_e8m0_block_scale(rounding, fmt):
    amax = np.abs(_sweep())
    for target in ("sm_90a", "sm_100a"):
        out = _apply(lambda v, target=target: C.e8m0_block_scale(
            v, rounding=rounding, elem_recip=float(fmt.scale_recip), elem_emax=fmt.elem_emax,
            target=target), amax, target)
        assert np.array_equal(out.astype(np.uint8), F.e8m0_scale_from_amax(amax, fmt, rounding))


@pytest.mark.interp
def test_decodes_all_bytes():
    b = np.arange(256, dtype=np.int32)
    e4 = _apply(C.e4m3_to_f32, b, "sm_90a", "int32").view(np.float32)
    assert np.array_equal(e4.view(np.uint32), F.decode_e4m3(b.astype(np.uint8)).view(np.uint32)
                          ) or np.array_equal(e4, F.decode_e4m3(b.astype(np.uint8)),
                                              equal_nan=True)
    e8 = _apply(C.e8m0_to_f32, b, "sm_90a", "int32").view(np.float32)
    assert np.array_equal(e8, F.decode_e8m0(b.astype(np.uint8)), equal_nan=True)


@pytest.mark.interp
def test_bf16_widening():
    import ml_dtypes

    bits = np.arange(0, 65536, 7, dtype=np.uint32).astype(np.uint16)
    x = bits.view(ml_dtypes.bfloat16)
    out = _apply(C.bf16_to_f32, x, "sm_90a", "bfloat16").view(np.float32)
    assert np.array_equal(out.view(np.uint32), (bits.astype(np.uint32) << 16))


def test_unsupported_pair_raises():
    with pytest.raises(NotImplementedError, match="go via f32"):
        from mlir import ir

        with ir.Context(), ir.Location.unknown():
            m = ir.Module.create()
            with ir.InsertionPoint(m.body):
                v = B.const(1.0, B.f32())
                C.convert(v, "bf16", "e2m1", rounding="rn", target="sm_90a")


@pytest.mark.lower
def test_native_instructions_in_asm():
    """sm_100a: cvt.rn.satfinite.e2m1x2.f32 / cvt.rp.satfinite.ue8m0x2.f32; sm_90a:
    cvt.rn.satfinite.e4m3x2.f32; gfx950: v_cvt_scalef32_pk_fp4_f32."""
    from blockscale.ops import quantize as Q

    ptx100 = Q.kernel("nvfp4", "sm_100a").asm["ptx"]
    assert "cvt.rn.satfinite.e2m1x2.f32" in ptx100
    assert "cvt.rp.satfinite.ue8m0x2.f32" in Q.kernel("mxfp4", "sm_100a").asm["ptx"]
    assert "cvt.rn.satfinite.e4m3x2.f32" in Q.kernel("mxfp8", "sm_90a").asm["ptx"]
    amd = Q.kernel(Q.QuantizeSpec("mxfp4", "gfx950", "even", "row_major",
                                  name="quantize_mxfp4_amd")).asm["amdgcn"]
    assert "v_cvt_scalef32_pk_fp4_f32" in amd


def _e2m1_fast_numpy(y: np.ndarray) -> np.ndarray:
    """numpy model of :func:`C.e2m1x8_pack_fast` on ``y = x * recip``: ``u = sat(fl(|y|) /
    8)`` (the product ``|x| * (recip / 8)`` is ``fl(|y|) / 8`` exactly in the normal range),
    the grid codes, the nibble-8 saturation and the sign."""
    y = np.asarray(y, np.float32)
    u = np.minimum(np.abs(y) / np.float32(8), np.float32(1))
    code = e2m1_grid_codes_numpy(u, "u")
    assert code.max(initial=0) <= 8
    code -= code >> 3  # 8 (|y| in [7, 8]) -> 7
    return (code | ((y.view(np.uint32) >> 31) << 3)).astype(np.uint8)


def test_e2m1_fast_model_exhaustive():
    """The fast E2M1 algorithm over every f32 whose exponent is in [-6, 5] (all ties, every
    step boundary, the nibble-8 range [7, 8], saturation up to 64), both signs, against the
    codec."""
    for e in range(127 - 6, 127 + 6):
        bits = (np.uint32(e) << np.uint32(23)) | np.arange(1 << 23, dtype=np.uint32)
        y = bits.view(np.float32)
        for v in (y, -y):
            assert np.array_equal(_e2m1_fast_numpy(v), F.encode_e2m1(v)), e - 127


@pytest.mark.interp
def test_e2m1x8_pack_fast():
    """The IR of C.e2m1x8_pack_fast (sm_90a) on the tie sweep as ``x`` with ``recip = 1``
    (``recip8 = 1/8``; NaN excluded: ``sat`` makes it 0, the callers route a NaN ``y`` to
    the reference's 0x7 with their rare-reciprocal branches), eight values per word, signs
    from bf16-pair words."""
    x = _sweep()
    x = x[~np.isnan(x)]
    x = np.concatenate([x, np.zeros((-x.size) % 8, np.float32)])
    n = x.size // 8
    args = [KernelArg("src", "buffer", "float32"), KernelArg("dst", "buffer", "int32", "out")]
    with B.kernel_module("conv8", "sm_90a", args, 64) as kb:
        i = B.global_thread_idx()
        with B.when(B.ult(i, n)):
            base = arith.muli(i, B.const(8, i.type))
            ys = [B.load(kb.arg("src"), arith.addi(base, B.const(e, i.type))) for e in range(8)]
            xb = [arith.bitcast(B.i32(), v) for v in ys]
            from blockscale.compiler.arch import nvvm as NV

            pairs = [NV.byte_perm(xb[2 * j], xb[2 * j + 1], 0x7632) for j in range(4)]
            B.store(C.e2m1x8_pack_fast(ys, B.const(0.125, B.f32()), pairs), kb.arg("dst"), i)
    out = np.zeros(n, np.int32)
    run_kernel(str(kb.module), "conv8", (-(-n // 64), 1, 1), (64, 1, 1), [x.copy(), out],
               "sm_90a")
    want = F.pack_fp4(F.encode_e2m1(x).reshape(n, 8)).view(np.uint32).reshape(n)
    assert np.array_equal(out.view(np.uint32), want)
