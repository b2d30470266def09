"""AMD MFMA block-scaled matmul (ops/matmul_mfma.py): gfx950 scaled MFMA, gfx942 bf16 MFMA.

Compile only (no AMD GPU): the kernels lower to hsaco whose llvm-objdump disassembly holds the
intended MFMA; the interpreter's MFMA models (runtime/interpreter/ops_mfma.py) are checked
against operands packed here from the documented ISA lane layouts (independently of the
model's code), then the kernels run in the interpreter against the float64 reference within
the f32 bound of tests/test_matmul_common.py, on small and tail shapes for every format.
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

from blockscale import formats, ops
from blockscale import reference as ref
from blockscale.formats import MXFP4, MXFP8, NVFP4, Format
from blockscale.layouts import interleave
from blockscale.ops import matmul, matmul_mfma
from blockscale.ops import matmul_epilogue as ep

FORMATS = (NVFP4, MXFP4, MXFP8)
TARGETS = ("gfx950", "gfx942")


# ---- ISA packing, written from the layouts in compiler/arch/mfma.py -----------------------------

def _pack_lanes(mat_codes: np.ndarray, fp4: bool, rows: int) -> np.ndarray:
    """[rows, K] element codes -> [64, nregs] uint32 lane registers (one lane at a time)."""
    groups = 64 // rows
    regs = np.zeros((64, 8 if not fp4 else 4), np.uint32)
    for lane in range(64):
        g, r = divmod(lane, rows)
        raw = bytearray(32)
        for e in range(32):
            if fp4:
                k = 32 * g + e
                raw[e // 2] |= int(mat_codes[r, k]) << (4 * (e % 2))
            else:  # two 16-byte runs half a K-step apart
                k = 16 * groups * (e // 16) + 16 * g + e % 16
                raw[e] = int(mat_codes[r, k])
        regs[lane] = np.frombuffer(bytes(raw[:4 * regs.shape[1]]), np.uint32)
    return regs


def _scale_regs(bytes_rg: np.ndarray, opsel: int, rows: int, rng) -> np.ndarray:
    """[rows, groups] scale bytes -> [64] i32 registers holding them in byte ``opsel`` and
    NaN (0xFF) in the other bytes (a wrong byte selection shows as NaN)."""
    regs = np.zeros(64, np.uint32)
    for lane in range(64):
        g, r = divmod(lane, rows)
        word = [0xFF] * 4
        word[opsel] = int(bytes_rg[r, g])
        regs[lane] = np.frombuffer(bytes(word), np.uint32)[0]
    return regs.view(np.int32)


def _d_layout(d: np.ndarray, rows: int) -> np.ndarray:
    """[rows, rows] matrix -> [64, n_acc] lane registers (16x16 / 32x32 D layout)."""
    n_acc = rows * rows // 64
    out = np.zeros((64, n_acc), np.float32)
    for lane in range(64):
        g, col = divmod(lane, rows)
        for e in range(n_acc):
            row = 4 * g + e if rows == 16 else 8 * (e // 4) + 4 * g + e % 4
            out[lane, e] = d[row, col]
    return out


def _decode(codes: np.ndarray, fp4: bool) -> np.ndarray:
    if fp4:
        return formats.decode_e2m1(codes).astype(np.float64)
    return formats.decode_e4m3(codes.astype(np.uint8)).astype(np.float64)


def _random_codes(rng, fp4: bool, shape) -> np.ndarray:
    if fp4:
        return rng.integers(0, 16, size=shape)
    c = rng.integers(0, 256, size=shape)
    c[(c & 0x7F) == 0x7F] = 0x38
    return c


def _scaled_case(rng, fp4: bool, rows: int, k: int, nan_row: int | None = None):
    a, b = _random_codes(rng, fp4, (rows, k)), _random_codes(rng, fp4, (rows, k))
    sa = rng.integers(120, 135, size=(rows, k // 32))
    sb = rng.integers(120, 135, size=(rows, k // 32))
    if nan_row is not None:
        sa[nan_row, 1] = 0xFF
    c = rng.standard_normal((rows, rows)).astype(np.float32)
    dec_sa = np.repeat(formats.decode_e8m0(sa.astype(np.uint8)).astype(np.float64), 32, 1)
    dec_sb = np.repeat(formats.decode_e8m0(sb.astype(np.uint8)).astype(np.float64), 32, 1)
    with np.errstate(invalid="ignore"):
        want = ((_decode(a, fp4) * dec_sa) @ (_decode(b, fp4) * dec_sb).T
                + c.astype(np.float64)).astype(np.float32)
    return a, b, sa, sb, c, want


# ---- the interpreter's MFMA models -------------------------------------------------------------

def _probe_scaled(fp4: bool, opsel_a: int, opsel_b: int) -> str:
    """MLIR of a one-wavefront kernel: D = mfma_scale_16x16x128(a, b, c) for lane registers
    read from buffers (the scale registers' byte ``opsel``)."""
    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import mfma
    from blockscale.launch import KernelArg

    na = 4 if fp4 else 8
    fmt = "e2m1" if fp4 else "e4m3"
    args = (KernelArg("a", "buffer", "int32"), KernelArg("b", "buffer", "int32"),
            KernelArg("sa", "buffer", "int32"), KernelArg("sb", "buffer", "int32"),
            KernelArg("c", "buffer", "float32", "out"))
    with bir.kernel_module("probe", "gfx950", args, (64, 1, 1)) as kb:
        lane = bir.thread_idx("x")
        vi = bir.vec(na, bir.i32())
        a = bir.vector_load(vi, kb.arg("a"), bir.mul(lane, na))
        b = bir.vector_load(vi, kb.arg("b"), bir.mul(lane, na))
        c = bir.vector_load(bir.vec(4, bir.f32()), kb.arg("c"), bir.mul(lane, 4))
        d = mfma.mfma_scale("16x16x128", a, b, c, a_format=fmt, b_format=fmt,
                            scale_a=bir.load(kb.arg("sa"), lane),
                            scale_b=bir.load(kb.arg("sb"), lane), opsel_a=opsel_a,
                            opsel_b=opsel_b)
        bir.vector_store(d, kb.arg("c"), bir.mul(lane, 4))
    return str(kb.module)


@pytest.mark.interp
@pytest.mark.parametrize("fp4", [True, False], ids=["fp4", "fp8"])
@pytest.mark.parametrize("opsel", [(0, 3), (1, 2), (2, 1), (3, 0)])
def test_scaled_mfma_model_matches_isa_layout(fp4, opsel):
    """v_mfma_scale_f32_16x16x128_f8f6f4 in the interpreter equals (A sA)(B sB)^T + C with the
    operands packed from the ISA layout, every opsel byte (other bytes are NaN), bit for bit;
    an E8M0 0xFF scale makes its row NaN."""
    from blockscale.runtime.interpreter import run_kernel

    rng = np.random.default_rng(7 + opsel[0] + 4 * fp4)
    a, b, sa, sb, c, want = _scaled_case(rng, fp4, 16, 128, nan_row=5)
    buf_c = _d_layout(c, 16).reshape(-1).copy()
    run_kernel(_probe_scaled(fp4, *opsel), "probe", (1, 1, 1), (64, 1, 1),
               [_pack_lanes(a, fp4, 16).view(np.int32).reshape(-1).copy(),
                _pack_lanes(b, fp4, 16).view(np.int32).reshape(-1).copy(),
                _scale_regs(sa, opsel[0], 16, rng), _scale_regs(sb, opsel[1], 16, rng),
                buf_c], "gfx950")
    expect = _d_layout(want, 16)
    np.testing.assert_array_equal(buf_c.reshape(64, 4), expect)
    assert np.isnan(want[5]).all() and not np.isnan(np.delete(want, 5, 0)).any()


@pytest.mark.parametrize("fp4", [True, False], ids=["fp4", "fp8"])
def test_scaled_mfma_32x32x64_model(fp4):
    """The 32x32x64 model (numpy entry point) against the ISA packing."""
    from blockscale.runtime.interpreter.ops_mfma import mfma_scale

    rng = np.random.default_rng(3)
    a, b, sa, sb, c, want = _scaled_case(rng, fp4, 32, 64)
    regs = [_pack_lanes(x, fp4, 32)[None] for x in (a, b)]
    sc = [_scale_regs(s, 0, 32, rng)[None] for s in (sa, sb)]
    code = 4 if fp4 else 0
    d = mfma_scale(regs[0], regs[1], _d_layout(c, 32)[None], code, code, 0, sc[0], 0, sc[1])
    np.testing.assert_array_equal(d[0], _d_layout(want, 32))


@pytest.mark.interp
def test_bf16_mfma_model_matches_isa_layout():
    """v_mfma_f32_16x16x16_bf16: lane (g, r) element t is A[r, 4g + t] / B[4g + t, r]."""
    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import mfma
    from blockscale.launch import KernelArg
    from blockscale.runtime.interpreter import run_kernel

    rng = np.random.default_rng(5)
    am = rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16)
    bm = rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16)  # B^T: [n, k]
    c = rng.standard_normal((16, 16)).astype(np.float32)
    want = (am.astype(np.float64) @ bm.astype(np.float64).T + c).astype(np.float32)
    lanes = np.arange(64)
    g, r = lanes // 16, lanes % 16
    pack = lambda m: np.stack([m[r, 4 * g + t] for t in range(4)], 1)
    args = (KernelArg("a", "buffer", "bfloat16"), KernelArg("b", "buffer", "bfloat16"),
            KernelArg("c", "buffer", "float32", "out"))
    with bir.kernel_module("probe", "gfx942", args, (64, 1, 1)) as kb:
        lane = bir.thread_idx("x")
        vb = bir.vec(4, bir.bf16())
        ld = lambda n: bir.bitcast(bir.vector_load(vb, kb.arg(n), bir.mul(lane, 4)),
                                   bir.vec(4, bir.i16()))
        cc = bir.vector_load(bir.vec(4, bir.f32()), kb.arg("c"), bir.mul(lane, 4))
        bir.vector_store(mfma.mfma_bf16_16x16x16(ld("a"), ld("b"), cc), kb.arg("c"),
                         bir.mul(lane, 4))
    buf_c = _d_layout(c, 16).reshape(-1).copy()
    run_kernel(str(kb.module), "probe", (1, 1, 1), (64, 1, 1),
               [pack(am).reshape(-1).copy(), pack(bm).reshape(-1).copy(), buf_c], "gfx942")
    np.testing.assert_array_equal(buf_c.reshape(64, 4), _d_layout(want, 16))


def test_mfma_helpers_reject_bad_operands():
    from mlir import ir

    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import mfma
    from blockscale.launch import KernelArg

    with bir.kernel_module("bad", "gfx950", (KernelArg("c", "buffer", "float32", "out"),),
                           (64, 1, 1)):
        v8 = bir.const(0, bir.vec(8, bir.i32()))
        acc = bir.const(0.0, bir.vec(4, bir.f32()))
        s = bir.const(127, bir.i32())
        with pytest.raises(TypeError, match="a must be vector<4xi32>"):
            mfma.mfma_scale("16x16x128", v8, v8, acc, a_format="e2m1", b_format="e4m3",
                            scale_a=s, scale_b=s)
        with pytest.raises(ValueError, match="opsel_b must be an int in 0..3"):
            mfma.mfma_scale("16x16x128", v8, v8, acc, a_format="e4m3", b_format="e4m3",
                            scale_a=s, scale_b=s, opsel_b=4)
        with pytest.raises(ValueError, match="a_format must be one of"):
            mfma.mfma_scale("16x16x128", v8, v8, acc, a_format="fp8", b_format="e4m3",
                            scale_a=s, scale_b=s)
        with pytest.raises(ValueError, match="shape must be"):
            mfma.mfma_scale("16x16x64", v8, v8, acc, a_format="e4m3", b_format="e4m3",
                            scale_a=s, scale_b=s)
        assert isinstance(v8, ir.Value)


# ---- lowering ------------------------------------------------------------------------------------

LOWER_SPECS = [
    ("gfx950", "mxfp4", "tcgen5d", True), ("gfx950", "mxfp8", "tcgen5d", False),
    ("gfx950", "nvfp4", "tcgen5d", True), ("gfx950", "mxfp4", "row_major", False),
    ("gfx942", "mxfp4", "tcgen5d", True), ("gfx942", "mxfp8", "tcgen5d", True),
    ("gfx942", "nvfp4", "tcgen5d", False), ("gfx942", "mxfp4", "row_major", True),
]


@pytest.mark.lower
@pytest.mark.parametrize("target,fmt,layout,aligned", LOWER_SPECS)
def test_kernel_lowers_to_the_intended_mfma(target, fmt, layout, aligned):
    spec = matmul_mfma.MfmaMatmulSpec(fmt, "bfloat16", layout, None, aligned, target)
    k = matmul_mfma.kernel(spec)
    dis = k.asm["disasm"]  # llvm-objdump -d of the hsaco
    if spec.path == "scaled":
        assert target == "gfx950" and fmt != "nvfp4"
        assert dis.count("v_mfma_scale_f32_16x16x128_f8f6f4") == 4  # 2 x 2 subtiles / step
        assert ("cbsz:4 blgp:4" in dis) == (fmt == "mxfp4")
    else:
        assert dis.count("v_mfma_f32_16x16x16_bf16") == (4 if fmt == "nvfp4" else 8)
        assert "v_mfma_scale" not in dis
        # FP4 decoded by the CDNA4 conversion instruction on gfx950 (integer ops on gfx942)
        assert ("v_cvt_scalef32_pk_bf16_fp4" in dis) == (target == "gfx950" and fmt != "mxfp8")
    assert "known_block_size = array<i32: 256, 1, 1>" in k.asm["mlir"]
    assert "__ockl" not in k.asm["llvm"]
    assert k.meta["scratch_bytes"] == 0, k.meta  # no spills
    if aligned:  # data: one wide load per lane chunk; byte loads only for the scales
        scale_loads = 4 if spec.path == "scaled" else 10  # per K-step / block and lane
        assert len(re.findall(r"(?:global|flat)_load_ubyte", dis)) == scale_loads
        assert re.search(r"(?:global|flat)_load_(?:ushort|dword)", dis)


# ---- the kernels in the interpreter --------------------------------------------------------------

def _shapes(fmt: Format) -> list[tuple[int, int, int]]:
    """Small aligned, multi-step with M/N tails, and K tails (partial blocks)."""
    tail_k = {"nvfp4": 40, "mxfp4": 50, "mxfp8": 37}[fmt.name]
    return [(16, 16, 128), (33, 70, 288), (5, 3, tail_k), (65, 17, 2 * tail_k + 160)]


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_kernel_f32_within_bound(target, fmt):
    """f32 output within the f32 error bound of the float64 reference; FP4 on the bf16 path
    equals the portable kernel bit for bit (same exact block terms, same order)."""
    rng = np.random.default_rng(TARGETS.index(target) * 10 + FORMATS.index(fmt))
    for m, n, k in _shapes(fmt):
        a, b, sa, sb, sa5, sb5 = random_dense_case(rng, fmt, m, n, k)
        out = ops.block_scaled_matmul(a, b, sa5, sb5, fmt, k=k, alpha=0.75,
                                      out_dtype="float32", device="interp", target=target)
        exact, abs_sum = exact_dense(a, b, sa, sb, fmt, k, alpha=0.75)
        assert_f32_within_bound(out, exact, f32_error_bound(abs_sum, fmt, k, 1))
        if matmul_mfma.path_for(target, fmt) == "bf16" and fmt.is_fp4:
            port = matmul.naive_block_scaled_matmul(a, b, sa5, sb5, fmt, k=k, alpha=0.75,
                                                    out_dtype="float32", device="interp",
                                                    target=target)
            np.testing.assert_array_equal(out, port)


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_kernel_bf16_output(target, fmt):
    rng = np.random.default_rng(21)
    m, n, k = 40, 24, 160 if fmt.is_mx else 96
    a, b, sa, sb, sa5, sb5 = random_dense_case(rng, fmt, m, n, k)
    out = ops.block_scaled_matmul(a, b, sa5, sb5, fmt, k=k, device="interp", target=target)
    exact, abs_sum = exact_dense(a, b, sa, sb, fmt, k)
    assert_bf16_consistent(out, exact, f32_error_bound(abs_sum, fmt, k, 1))


def _run_sentinel(spec, a, b, sfa, sfb, m, n, k, alpha=1.0):
    """Run ``spec``'s kernel in the interpreter on an output pre-filled with NaN."""
    from blockscale.ops import _core
    from blockscale.runtime.interpreter import run_kernel

    kern = _core.compile_kernel(spec)
    dt = np.float32 if spec.out_dtype == "float32" else ml_dtypes.bfloat16
    c = np.full((m, n), np.nan, dt)
    vals = {"a": a, "b": b, "sfa": sfa, "sfb": sfb, "c": c, "m": m, "n": n, "k": k,
            "alpha": alpha}
    args = []
    for x in spec.args():
        v = vals[x.name]
        if x.kind == "buffer":
            v = v.reshape(-1) if x.name == "c" else np.ascontiguousarray(v).reshape(-1)
            v = v.view(np.uint8) if v.dtype.itemsize == 1 else v
        args.append(v)
    run_kernel(kern.asm["mlir"], spec.kernel_name, matmul_mfma.grid(m, n), spec.block, args,
               spec.target)
    return c


@pytest.mark.interp
@pytest.mark.parametrize("target,fmt", [("gfx950", MXFP8), ("gfx950", MXFP4),
                                        ("gfx942", NVFP4), ("gfx942", MXFP8)],
                         ids=lambda x: getattr(x, "name", x))
def test_every_output_written_on_tail_shapes(target, fmt):
    """Outputs start as NaN: every one of a 67 x 130 (tails in M, N and K) result is written
    and correct."""
    rng = np.random.default_rng(4)
    m, n, k = 67, 130, (98 if fmt.is_fp4 else 67)
    a, b, sa, sb, sa5, sb5 = random_dense_case(rng, fmt, m, n, k)
    spec = matmul_mfma.spec_for(target, fmt, k, "float32")
    assert not spec.aligned
    out = _run_sentinel(spec, a, b, sa5, sb5, m, n, k)
    exact, abs_sum = exact_dense(a, b, sa, sb, fmt, k)
    assert not np.isnan(out).any()
    assert_f32_within_bound(out, exact, f32_error_bound(abs_sum, fmt, k, 1))


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
def test_row_major_mxfp4_entry_point(target):
    """matmul_dynamic_block_scaled_mxfp4 (row-major E8M0 scales, SEMANTICS §4.5) dispatches to
    the MFMA kernel: identical to the 5-D scale kernel and within the bound."""
    rng = np.random.default_rng(8)
    m, n, k = 37, 45, 320
    a, b, sa, sb, sa5, sb5 = random_dense_case(rng, MXFP4, m, n, k)
    rm = ops.matmul_dynamic_block_scaled_mxfp4(a, b, sa, sb, out_dtype="float32",
                                               device="interp", target=target)
    t5 = ops.block_scaled_matmul(a, b, sa5, sb5, MXFP4, out_dtype="float32", device="interp",
                                 target=target)
    np.testing.assert_array_equal(rm, t5)
    exact, abs_sum = exact_dense(a, b, sa, sb, MXFP4, k)
    assert_f32_within_bound(rm, exact, f32_error_bound(abs_sum, MXFP4, k, 1))


@pytest.mark.interp
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", [MXFP4, MXFP8], ids=lambda f: f.name)
def test_e8m0_nan_scale_gives_nan_row(target, fmt):
    """E8M0 0xFF (NaN) in A's scales makes that output row NaN (reference: NaN dequantized
    block); every other output stays finite."""
    rng = np.random.default_rng(9)
    m, n, k = 20, 18, 128
    a, b, sa, _, _, sb5 = random_dense_case(rng, fmt, m, n, k)
    sa = sa.copy()
    sa.view(np.uint8)[7, 2] = 0xFF
    out = ops.block_scaled_matmul(a, b, interleave(sa), sb5, fmt, out_dtype="float32",
                                  device="interp", target=target)
    want = ref.naive_block_scaled_matmul(a, b, interleave(sa), sb5, fmt, k=k,
                                         out_dtype="float32")
    assert np.isnan(out[7]).all() and np.isnan(want[7]).all()
    assert not np.isnan(np.delete(out, 7, 0)).any()


@pytest.mark.interp
def test_fused_epilogue_on_the_mfma_kernel():
    """bias + relu fused into the gfx950 scaled kernel == relu(kernel without epilogue + bias)
    in float32."""
    rng = np.random.default_rng(12)
    m, n, k = 19, 40, 256
    a, b, _, _, sa5, sb5 = random_dense_case(rng, MXFP4, m, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    plain = ops.block_scaled_matmul(a, b, sa5, sb5, MXFP4, out_dtype="float32",
                                    device="interp", target="gfx950")
    fused = ops.block_scaled_matmul_with_epilogue(
        a, b, sa5, sb5, MXFP4, out_dtype="float32", epilogue=ep.chain(ep.bias(), ep.relu()),
        epilogue_inputs={"bias": bias}, device="interp", target="gfx950")
    np.testing.assert_array_equal(fused, np.maximum(plain + bias, np.float32(0)))


def test_spec_and_dispatch_choices(monkeypatch):
    from blockscale.ops import _mfma_ir

    assert matmul_mfma.TILE == (_mfma_ir.BM, _mfma_ir.BN)  # host grid == kernel tile
    assert matmul_mfma.THREADS == _mfma_ir.THREADS
    assert matmul_mfma.path_for("gfx950", MXFP4) == "scaled"
    assert matmul_mfma.path_for("gfx950", NVFP4) == "bf16"
    assert matmul_mfma.path_for("gfx942", MXFP8) == "bf16"
    assert matmul_mfma.fast_path("sm_90a", MXFP4, 8, 8, 64, "bfloat16", None) is None
    assert matmul_mfma.fast_path("gfx942", MXFP4, 8, 8, 64, "bfloat16", None) is not None
    monkeypatch.setenv(matmul_mfma.ENV_SWITCH, "0")
    assert matmul_mfma.fast_path("gfx942", MXFP4, 8, 8, 64, "bfloat16", None) is None
    with pytest.raises(ValueError, match="target must be one of"):
        matmul_mfma.MfmaMatmulSpec("mxfp4", target="sm_90a")
    with pytest.raises(TypeError, match="aligned must be a bool"):
        matmul_mfma.MfmaMatmulSpec("mxfp4", aligned=1)
    for t in TARGETS:
        specs = matmul_mfma.bundle_specs(t)
        assert len({s.kernel_name for s in specs}) == len(specs) == 14
    assert matmul_mfma.bundle_specs("sm_90a") == []


@pytest.mark.interp
def test_mfma_under_divergence_raises():
    """An MFMA reached by part of a wavefront raises (the ISA needs all 64 lanes)."""
    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import mfma
    from blockscale.launch import KernelArg
    from blockscale.runtime.interpreter import run_kernel

    args = (KernelArg("c", "buffer", "float32", "out"),)
    with bir.kernel_module("probe", "gfx942", args, (64, 1, 1)) as kb:
        lane = bir.thread_idx("x")
        with bir.when(bir.ult(lane, 32)):
            z = bir.const(0, bir.vec(4, bir.i16()))
            d = mfma.mfma_bf16_16x16x16(z, z, bir.const(0.0, bir.vec(4, bir.f32())))
            bir.vector_store(d, kb.arg("c"), bir.mul(lane, 4))
    with pytest.raises(RuntimeError, match="executed by 32 of 64 lanes"):
        run_kernel(str(kb.module), "probe", (1, 1, 1), (64, 1, 1),
                   [np.zeros(256, np.float32)], "gfx942")


@pytest.mark.interp
@pytest.mark.slow
def test_random_shapes_within_bound():
    """48 random (M, N, K) in [1, 140) x [1, 140) x [1, 400] over targets, formats and both
    scale layouts (the direct entry point takes row-major scales for any format and K)."""
    rng = np.random.default_rng(123)
    for it in range(48):
        fmt, target = FORMATS[it % 3], TARGETS[(it // 3) % 2]
        m, n, k = (int(x) for x in rng.integers(1, (140, 140, 400)))
        k += k % 2 if fmt.is_fp4 else 0
        a, b, sa, sb, sa5, sb5 = random_dense_case(rng, fmt, m, n, k)
        rm = it % 4 == 0
        out = matmul_mfma.block_scaled_matmul_mfma(
            a, b, sa if rm else sa5, sb if rm else sb5, fmt, k=k, out_dtype="float32",
            scale_layout="row_major" if rm else "tcgen5d", target=target, device="interp")
        exact, abs_sum = exact_dense(a, b, sa, sb, fmt, k)
        assert_f32_within_bound(out, exact, f32_error_bound(abs_sum, fmt, k, 1))
