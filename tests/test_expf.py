"""blockscale's float32 exp (activations.exp_f32, D10 sigmoid): accuracy against a float64 exp,
and the kernel IR (ops/_expf_ir.py) run in the interpreter against the numpy definition, bit for
bit. The GPU lowering is checked to keep the mul / add sequence (no fma contraction, no
libdevice / ocml exp), which is what makes every target compute the same bits."""

from __future__ import annotations

import re

import numpy as np
import pytest

from blockscale.activations import GatedActivation, exp_f32

F32_MAX = float(np.finfo(np.float32).max)
EDGES = np.array([0.0, -0.0, 1.0, -1.0, 88.7, -88.7, 88.72283, 88.72284, 89.0, 89.5, -87.33655,
                  -87.33654, -103.97, -103.98, 104.0, -104.0, 1e30, -1e30, np.inf, -np.inf,
                  np.nan, 2.0 ** -30, -(2.0 ** -30), 1e-45, -1e-45, 0.34657359, -0.34657359,
                  0.3465736, -0.3465736], np.float32)


def _sweep(stride: int = 4099) -> np.ndarray:
    """Every stride-th float32 with |x| <= 105 (both signs), the edges and their neighbours."""
    top = int(np.float32(105.0).view(np.uint32))
    bits = np.arange(0, top, stride, dtype=np.uint32)
    pos = bits.view(np.float32)
    ed = np.concatenate([EDGES, np.nextafter(EDGES, np.float32(np.inf)),
                         np.nextafter(EDGES, np.float32(-np.inf))])
    return np.concatenate([pos, -pos, ed, np.linspace(-20, 20, 40001, dtype=np.float32)])


def test_exp_f32_accuracy():
    """< 1 ulp (faithful) for normal results; within 1 subnormal ulp (2^-149) plus 2^-24
    relative below 2^-126; exact specials."""
    x = _sweep(997)
    y = exp_f32(x).astype(np.float64)
    with np.errstate(over="ignore"):
        t = np.exp(x.astype(np.float64))
    fin = np.isfinite(x)
    normal = fin & (t >= 2.0 ** -126) & (t <= F32_MAX)
    ulp = 2.0 ** (np.floor(np.log2(t[normal])) - 23)
    err = np.abs(y[normal] - t[normal]) / ulp
    assert err.max() < 0.96, (err.max(), x[normal][np.argmax(err)])
    sub = fin & (t < 2.0 ** -126)
    assert sub.sum() > 1000
    assert np.all(np.abs(y[sub] - t[sub]) <= 2.0 ** -149 + t[sub] * 2.0 ** -24)
    big = fin & (t > F32_MAX * (1 + 2.0 ** -25))
    assert np.all(np.isposinf(y[big]))
    # specials and edges
    spec = exp_f32(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 104.0, -104.0, -1e30, 1e30],
                            np.float32))
    assert np.isposinf(spec[0]) and spec[1] == 0 and np.isnan(spec[2])
    assert spec[3] == 1 and spec[4] == 1 and np.isposinf(spec[5]) and spec[6] == 0
    assert spec[7] == 0 and np.isposinf(spec[8])
    assert np.isfinite(exp_f32(np.float32(88.72283))) and np.isposinf(exp_f32(np.float32(88.72284)))
    assert np.all(exp_f32(x[fin]) >= 0)
    assert exp_f32(np.float32(1.0)).dtype == np.float32


def test_exp_f32_monotone_on_a_dense_grid():
    x = np.sort(_sweep(4099)[np.isfinite(_sweep(4099))])
    y = exp_f32(x)
    assert np.all(y[1:] >= y[:-1])


def test_gated_activation_uses_exp_f32():
    rng = np.random.default_rng(3)
    g = rng.normal(0, 8, 4096).astype(np.float32)
    u = rng.normal(0, 4, 4096).astype(np.float32)
    one = np.float32(1)
    z = GatedActivation.SILU(g, u)
    assert np.array_equal(z.view(np.int32), ((g * (one / (one + exp_f32(-g)))) * u).view(np.int32))
    a = GatedActivation.SWIGLU_OAI
    g2 = np.minimum(g, np.float32(7))
    u2 = np.clip(u, np.float32(-7), np.float32(7))
    want = ((u2 + one) * g2) * (one / (one + exp_f32(-(np.float32(a.alpha) * g2))))
    assert np.array_equal(a(g, u).view(np.int32), want.view(np.int32))


# ---- the kernel IR ---------------------------------------------------------------------------


def _module(n: int, target: str, vector: bool = False):
    """``dst[i] = bits(exp_f32(src[i]))`` as a kernel module (block 256); returns (module, args)."""
    pytest.importorskip("mlir")
    from mlir import ir
    from mlir.dialects import arith
    from mlir.dialects import vector as V

    from blockscale.compiler import ir as B
    from blockscale.launch import KernelArg
    from blockscale.ops._expf_ir import exp_f32 as exp_ir

    args = [KernelArg("src", "buffer", "float32"), KernelArg("dst", "buffer", "int32", "out")]
    with B.kernel_module("expf", target, args, 256) as kb:
        i = B.global_thread_idx()
        with B.when(B.ult(i, n)):
            v = B.load(kb.arg("src"), i)
            if vector:  # a 2-lane vector of (x, x): the helper accepts vectors too
                vt = ir.VectorType.get([2], B.f32())
                y = B.extract(exp_ir(V.broadcast(vt, v)), 1)
            else:
                y = exp_ir(v)
            B.store(arith.bitcast(B.i32(), y), kb.arg("dst"), i)
    return kb.module, args


def _run_ir(x: np.ndarray, target: str, vector: bool = False) -> np.ndarray:
    from blockscale.runtime.interpreter.kernel import run_kernel

    n = x.size
    module, _ = _module(n, target, vector)
    out = np.zeros(n, np.int32)
    run_kernel(str(module), "expf", (-(-n // 256), 1, 1), (256, 1, 1), [x.copy(), out], target)
    return out


def _same_bits(got: np.ndarray, x: np.ndarray) -> None:
    want = exp_f32(x)
    gotf = got.view(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(gotf), nan)
    bad = np.flatnonzero(got[~nan] != want.view(np.int32)[~nan])
    assert bad.size == 0, (x[~nan][bad[:5]], gotf[~nan][bad[:5]], want[~nan][bad[:5]])


@pytest.mark.interp
@pytest.mark.parametrize("target", ("sm_90a", "gfx942"))
def test_exp_ir_matches_reference_bit_for_bit(target):
    x = _sweep(4099)
    _same_bits(_run_ir(x, target), x)


@pytest.mark.interp
def test_exp_ir_vector_form():
    x = _sweep(65537)
    _same_bits(_run_ir(x, "sm_100a", vector=True), x)


@pytest.mark.lower
@pytest.mark.parametrize("target", ("sm_90a", "sm_100a", "gfx942", "gfx950"))
def test_exp_lowering_keeps_the_sequence(target):
    """exp_f32 alone: the PTX has .rn f32 mul / add / sub (ptxas may not fuse those), no fma,
    no ex2 / lg2, no flush-to-zero; the AMDGCN no fma / mad and no v_exp_f32. And the fused
    kernels call no device exp (no ex2 / v_exp_f32)."""
    from _compiler_helpers import skip_unless_toolchain

    skip_unless_toolchain(target)
    from blockscale.compiler.pipeline import compile_module
    from blockscale.ops import quantize_silu as S

    module, args = _module(1024, target)
    kern = compile_module(module, target, kernel_name="expf", args=args, block=(256, 1, 1))
    if target.startswith("sm_"):
        ptx = kern.asm["ptx"]
        ops = set(re.findall(r"\b((?:fma|mad|mul|add|sub|ex2|lg2)\.[a-z0-9.]*f32)\b", ptx))
        # (LLVM may write x - c * y as x + (-c) * y: the same IEEE result)
        assert {"mul.rn.f32", "add.rn.f32"} <= ops <= {"mul.rn.f32", "add.rn.f32", "sub.rn.f32"}, \
            sorted(ops)
        assert ".ftz" not in ptx
        fused = S.fused_silu_quantize_kernel("mxfp8", target, activation="swiglu_oai")
        assert "ex2" not in fused.asm["ptx"]
    else:
        asm = kern.asm["amdgcn"]
        assert re.search(r"\bv_mul_f32", asm) and re.search(r"\bv_(add|sub)\w*_f32", asm)
        assert not re.search(r"\bv_(?:fma|fmac|mad|mac|exp)\w*_f32", asm), \
            sorted(set(re.findall(r"\bv_(?:fma|fmac|mad|mac|exp)\w*_f32", asm)))
        fused = S.fused_silu_quantize_kernel("nvfp4", target, activation="silu")
        assert "v_exp_f32" not in fused.asm["amdgcn"]
