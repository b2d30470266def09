"""The sm_100a tcgen05 block-scaled matmul (compile only: no Blackwell GPU here).

* lower: the sm_100a PTX has ``tcgen05.mma.cta_group::1.kind::<kind>.block_scale`` for NVFP4
  (mxf4nvf4, block16), MXFP4 (mxf4, block32) and MXFP8 (mxf8f6f4, block32), ptxas makes a
  cubin, and its SASS has the UTC*MMA (UTCOMMA.4X / UTCOMMA / UTCQMMA), the UTCCP scale
  copies, UTCBAR and LDTM; no spills.
* interp: the kernel IR in the numpy interpreter (tcgen05 modeled from the PTX ISA in
  runtime/interpreter/ops_tcgen05.py) against the float64 value on exactly dequantized
  operands, within the fp32 bound of test_matmul_common.py, M/N/K tails (every output
  written); the model's descriptor and TMEM scale layout pieces; its ordering checks fire on
  broken kernels; sm_100a dispatch.
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

from blockscale import layouts
from blockscale.formats import Format
from blockscale.ops import matmul, matmul_tcgen05

#: format -> (PTX kind + scale vector qualifier, SASS MMA, MMAs per K-step)
EXPECT = {"nvfp4": ("kind::mxf4nvf4.block_scale.block16", r"UTCOMMA\.4X", 1),
          "mxfp4": ("kind::mxf4.block_scale.block32", r"UTCOMMA(?!\.4X)", 2),
          "mxfp8": ("kind::mxf8f6f4.block_scale.block32", r"UTCQMMA", 4)}


# ---- lower: PTX, cubin, SASS ----------------------------------------------------------------

@pytest.mark.lower
@pytest.mark.parametrize("spec", matmul_tcgen05.bundle_specs("sm_100a"),
                         ids=lambda s: s.kernel_name)
def test_kernel_ptx_and_sass(spec):
    kernel = matmul_tcgen05.kernel(spec)
    ptx, sass, meta = kernel.asm["ptx"], kernel.asm["sass"], kernel.meta
    kind, sass_mma, per_step = EXPECT[spec.fmt]
    assert ".target sm_100a" in ptx
    assert len(re.findall(rf"tcgen05\.mma\.cta_group::1\.{re.escape(kind)}\b", ptx)) == per_step
    assert len(re.findall(r"tcgen05\.cp\.cta_group::1\.32x128b\.warpx4", ptx)) == 2
    for insn in ("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
                 "tcgen05.dealloc.cta_group::1", "tcgen05.relinquish_alloc_permit",
                 "tcgen05.commit.cta_group::1.mbarrier::arrive::one",
                 "tcgen05.ld.sync.aligned.32x32b.x32.b32", "tcgen05.wait::ld",
                 "mbarrier.try_wait.parity", "fence.proxy.async.shared::cta"):
        assert insn in ptx, insn
    assert kernel.asm["cubin"][:4] == b"\x7fELF"
    assert len(re.findall(sass_mma, sass)) == per_step
    assert len(re.findall(r"UTCCP\.T\.S\.4x32dp128bit", sass)) == 2
    assert "UTCBAR" in sass and len(re.findall(r"LDTM\.x32", sass)) == 4
    assert "HMMA" not in sass and "HGMMA" not in sass
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0
    assert meta["registers"] <= 96
    assert meta["dynamic_shared_bytes"] == spec.dynamic_shared_bytes
    assert meta["static_shared_bytes"] <= 48 * 1024


# ---- interp: against the float64 reference -----------------------------------------------------

def _check(fmt_name, m, n, k, alpha, out_dtype, run):
    fmt = Format.from_name(fmt_name)
    rng = np.random.default_rng(m * 131 + n * 7 + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, alpha)
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
    got = run(a, b, sfa5, sfb5, fmt, k, alpha, out_dtype)
    assert got.shape == (m, n)
    if out_dtype == "float32":
        assert_f32_within_bound(got, exact, bound)
    else:
        assert_bf16_consistent(got, exact, bound)


def _direct(a, b, sfa5, sfb5, fmt, k, alpha, out_dtype):
    return matmul_tcgen05.block_scaled_matmul_tcgen05(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha,
                                                      out_dtype=out_dtype, device="interp")


#: (M, N, K): one full tile and one K-step; tails in M, N and K with several K-steps (the
#: second stage, mbarrier phase flips and stage reuse); K not a multiple of 32 (byte loads,
#: a partial last K-block)
SHAPES = {"nvfp4": [(128, 128, 64), (130, 72, 288), (20, 17, 40)],
          "mxfp4": [(128, 128, 128), (100, 200, 416), (9, 140, 70)],
          "mxfp8": [(128, 128, 128), (129, 33, 352), (31, 5, 45)]}


@pytest.mark.interp
@pytest.mark.parametrize("fmt_name,mnk", [(f, s) for f, ss in SHAPES.items() for s in ss],
                         ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x)))
def test_interp_within_f32_bound(fmt_name, mnk):
    m, n, k = mnk
    out_dtype = "float32" if (m + n) % 2 == 0 else "bfloat16"
    _check(fmt_name, m, n, k, 0.375, out_dtype, _direct)


@pytest.mark.interp
def test_interp_nan_scale_stays_in_its_row_and_padding_kblocks_are_masked():
    """An E8M0 NaN scale (0xFF) poisons exactly its row; 0xFF bytes in the 5-D padding
    K-blocks (past ceil(K/32)) are masked by the kernel and change nothing."""
    fmt = Format.from_name("mxfp4")
    m, n, k = 40, 24, 96  # 3 K-blocks: the atom's 4th K-block is padding
    rng = np.random.default_rng(7)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    sfa5 = sfa5.copy()
    raw = sfa5.view(np.uint8).reshape(-1)
    def offset(r, j):  # SEMANTICS §1.3, one 128-row x 4-K-block atom
        return r % 32 * 16 + r // 32 * 4 + j

    assert sfa5.shape == (1, 1, 32, 4, 4)
    assert layouts.deinterleave(sfa5, m, 3).view(np.uint8)[9, 2] == raw[offset(9, 2)]
    raw[[offset(r, 3) for r in range(m)]] = 0xFF
    row = 5
    raw[offset(row, 1)] = 0xFF
    got = _direct(a, b, sfa5, sfb5, fmt, k, 1.0, "float32")
    assert np.isnan(got[row]).all()
    keep = np.arange(m) != row
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 1.0)
    assert_f32_within_bound(got[keep], exact[keep],
                            f32_error_bound(abs_sum, fmt, k, n_mul=1)[keep])


@pytest.mark.interp
def test_dispatch_sm100a_uses_tcgen05(monkeypatch):
    """block_scaled_matmul(target="sm_100a") runs the tcgen05 kernel (16-byte loads for
    K % 32 == 0, byte loads otherwise)."""
    launched = []
    real = matmul.H.launch

    def spy(spec, *args, **kwargs):
        launched.append(type(spec).__name__)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(matmul.H, "launch", spy)

    def via_dispatch(a, b, sfa5, sfb5, fmt, k, alpha, out_dtype):
        return matmul.block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha,
                                          out_dtype=out_dtype, device="interp",
                                          target="sm_100a")

    _check("nvfp4", 33, 40, 64, 1.5, "float32", via_dispatch)
    _check("nvfp4", 33, 40, 48, 1.5, "float32", via_dispatch)
    assert launched == ["Tcgen05MatmulSpec", "Tcgen05MatmulSpec"]


@pytest.mark.interp
def test_interp_fused_epilogue():
    """A fused epilogue (bias, relu) sees the kernel's own f32 value: bit-exact against the
    same ops applied to the unfused tcgen05 result."""
    from blockscale.ops import matmul_epilogue as ep

    fmt = Format.from_name("mxfp4")
    rng = np.random.default_rng(5)
    m, n, k = 70, 20, 128
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    bias = (rng.standard_normal(n) * 50).astype(np.float32)
    got = matmul.block_scaled_matmul_with_epilogue(
        a, b, sfa5, sfb5, fmt, alpha=0.5, out_dtype="float32",
        epilogue=ep.chain(ep.bias(), ep.relu()), epilogue_inputs={"bias": bias},
        device="interp", target="sm_100a")
    base = _direct(a, b, sfa5, sfb5, fmt, k, 0.5, "float32")
    want = np.maximum(base + bias[None, :], np.float32(0))
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_spec_and_argument_checks():
    assert [s.kernel_name for s in matmul_tcgen05.bundle_specs("sm_100a")] == [
        f"bs_matmul_tcgen05_{f}_128x128{ua}_{o}" for f in ("nvfp4", "mxfp4", "mxfp8")
        for ua in ("", "_ua") for o in ("bf16", "f32")]
    assert matmul_tcgen05.bundle_specs("sm_90a") == []
    with pytest.raises(ValueError, match="target"):
        matmul_tcgen05.Tcgen05MatmulSpec("nvfp4", target="sm_90a")
    fmt = Format.from_name("nvfp4")
    z = np.zeros((8, 0), np.uint8)
    zs = np.zeros(layouts.scale_shape("tcgen5d", 8, 0), fmt.scale_dtype)
    with pytest.raises(ValueError, match="k must be positive"):
        matmul_tcgen05.block_scaled_matmul_tcgen05(z, z, zs, zs, fmt, device="interp")
    assert matmul_tcgen05.fast_path("sm_90a", fmt, 8, 8, 64, "float32", None) is None
    assert matmul_tcgen05.fast_path("sm_100a", fmt, 0, 8, 64, "float32", None) is None
    assert matmul_tcgen05.spec_for(fmt, 48).aligned is False
    assert matmul_tcgen05.spec_for(fmt, 64).aligned is True
    assert matmul_tcgen05.Tcgen05MatmulSpec("mxfp8").dynamic_shared_bytes == 67584
    assert matmul_tcgen05.Tcgen05MatmulSpec("mxfp4").dynamic_shared_bytes == 0


# ---- the interpreter's tcgen05 model ------------------------------------------------------------

def test_descriptor_bits_round_trip():
    """The builder's descriptor bits decode to the fields the model reads (ISA tables)."""
    from blockscale.compiler.arch import tcgen05 as T
    from blockscale.runtime.interpreter import ops_tcgen05 as O

    # literal values from the ISA tables (independent of the decoder)
    assert T.smem_descriptor_bits(0x1230, 128, 1024) == 0x0000404000080123
    assert T.instr_descriptor_bits("mxf4nvf4", 128, 128) == 0x08200480  # E2M1, UE4M3
    assert T.instr_descriptor_bits("mxf8f6f4", 128, 128, 1, 3) == 0x28a00030  # E4M3, UE8M0
    d = O.decode_smem_descriptor(T.smem_descriptor_bits(0x1230, 128, 1024))
    assert d == {"start": 0x1230, "lbo": 128, "sbo": 1024, "fixed": 1, "base_offset": 0,
                 "lbo_mode": 0, "swizzle": 0}
    for kind, code, st in (("mxf4nvf4", 1, 0), ("mxf4", 1, 1), ("mxf8f6f4", 0, 1)):
        ids = (0, 2) if kind == "mxf4" else (3, 1) if kind == "mxf8f6f4" else (0, 0)
        i = O.decode_instr_descriptor(T.instr_descriptor_bits(kind, 128, 128, *ids))
        assert (i["atype"], i["btype"], i["scale_type"], i["m"], i["n"]) == (code, code, st,
                                                                             128, 128)
        assert (i["sfa_id"], i["sfb_id"]) == ids
        assert not (i["sparse"] or i["negate"] or i["transpose"] or i["k96"] or i["reserved"])
    with pytest.raises(ValueError, match="sfa_id"):
        T.instr_descriptor_bits("mxf4", 128, 128, 1, 0)
    with pytest.raises(ValueError, match="lbo"):
        T.smem_descriptor_bits(0, 8, 128)
    # a no-swizzle K-major operand: chunk c of row r at (r // 8) SBO + c LBO + 16 (r % 8)
    addr = O.operand_addresses(T.smem_descriptor_bits(1024, 128, 512), 16, 32)
    assert addr[9, 17] == 1024 + 512 + 128 + 16 + 1


def test_scale_atom_in_tmem_is_the_5d_layout():
    """A 5-D SF atom copied by the 32x128b.warpx4 model and read back by the MMA model's
    per-row (lane r, column r // 32) rule gives S[r, j] for every row and K-block, for each
    scale vector size and ID."""
    from blockscale.runtime.interpreter import ops_tcgen05 as O

    s2 = np.random.default_rng(3).integers(0, 256, (128, 4), dtype=np.uint8)
    atom = layouts.interleave(s2).reshape(32, 16)  # row i2: 16 bytes
    cells = np.zeros((128, 4), np.uint32)
    for p in range(4):  # what the cp model writes
        cells[32 * p:32 * p + 32] = atom.copy().view(np.uint32)
    rows = np.arange(128)
    per_row = cells[rows, rows // 32]
    for vec, ids in ((4, (0,)), (2, (0, 2)), (1, (0, 1, 2, 3))):
        for sf_id in ids:
            got = O.scale_values(per_row, sf_id, vec, ue8m0=True)
            want = np.ldexp(1.0, s2[:, sf_id:sf_id + vec].astype(np.int64) - 127)
            want[s2[:, sf_id:sf_id + vec] == 0xFF] = np.nan
            np.testing.assert_array_equal(got, want)


def _run_broken(monkeypatch, fmt_name, m, n, k, **patches):
    """Build the kernel with tcgen05 helpers replaced by ``patches`` and run its IR."""
    from blockscale.compiler.arch import tcgen05 as T
    from blockscale.runtime.interpreter import run_kernel

    for name, fn in patches.items():
        monkeypatch.setattr(T, name, fn)
    spec = matmul_tcgen05.Tcgen05MatmulSpec(fmt_name, "float32")
    text = str(matmul_tcgen05.build(spec))
    fmt = Format.from_name(fmt_name)
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(1), fmt, m, n, k)
    c = np.zeros((m, n), np.float32)
    args = [x.view(np.uint8).reshape(-1) for x in (a, b, sfa5, sfb5)]
    run_kernel(text, spec.kernel_name, matmul_tcgen05.grid(m, n), spec.block,
               [*args, c.reshape(-1), m, n, k, 1.0], "sm_100a",
               dynamic_shared_bytes=spec.dynamic_shared_bytes)
    return c


@pytest.mark.interp
def test_model_runs_unpatched(monkeypatch):
    c = _run_broken(monkeypatch, "nvfp4", 16, 16, 128)
    assert np.isfinite(c).all() and np.abs(c).max() > 0


@pytest.mark.interp
def test_model_rejects_missing_proxy_fence(monkeypatch):
    from blockscale.runtime.interpreter.ops_tcgen05 import Tcgen05OrderError

    with pytest.raises(Tcgen05OrderError, match="fence.proxy.async"):
        _run_broken(monkeypatch, "nvfp4", 16, 16, 64, fence_proxy_async_shared=lambda: None)


@pytest.mark.interp
def test_model_rejects_stage_overwrite_before_wait(monkeypatch):
    """Without the per-stage mbarrier wait, step s + 2 rewrites operands the MMAs of step s
    may still read (3 steps: the third refills stage 0)."""
    from blockscale.runtime.interpreter.ops_tcgen05 import Tcgen05OrderError

    calls = []
    from blockscale.compiler.arch import tcgen05 as T
    real = T.mbarrier_wait

    def first_wait_dropped(bar, parity, **kw):  # the in-loop wait is built first
        calls.append(1)
        if len(calls) > 1:
            real(bar, parity, **kw)

    with pytest.raises(Tcgen05OrderError, match="overwritten before a wait"):
        _run_broken(monkeypatch, "nvfp4", 16, 16, 192, mbarrier_wait=first_wait_dropped)


@pytest.mark.interp
def test_model_rejects_accumulator_load_without_wait(monkeypatch):
    from blockscale.compiler.arch import tcgen05 as T
    from blockscale.runtime.interpreter.ops_tcgen05 import Tcgen05OrderError

    calls = []
    real = T.mbarrier_wait

    def final_wait_dropped(bar, parity, **kw):  # the wait before the epilogue is the second
        calls.append(1)
        if len(calls) != 2:
            real(bar, parity, **kw)

    with pytest.raises(Tcgen05OrderError, match="no wait has observed"):
        _run_broken(monkeypatch, "mxfp8", 16, 16, 128, mbarrier_wait=final_wait_dropped)
