"""The register-A grouped (MoE prefill) NVFP4 matmul (ops/matmul_grouped_rs.py).

* interp: MAX's grouped cases at small N / K (unused groups, groups over several token tiles,
  empty groups, N and K tails), with and without ``a_row_scales``: within the stated fp32
  bound of the exact grouped value and of the f16 producer-dequant kernel's output (the same
  exact products, another fp32 order); expert id -1 rows are zeros. The phase 1's ``kperm``
  workspace is the plain f16 workspace with each step's elements in ``kperm_source`` order,
  byte for byte.
* lower: SASS: HGMMA with a register A operand, no spills.
* gpu (``make gpu-bundle``): gpt-oss-120b gate_up at T = 1024 / 4096 and DeepSeek-V3's shape
  within the bound of the exact value, and the f16 pdq kernel's output.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_matmul_common import assert_bf16_consistent, f32_error_bound
from test_matmul_grouped import exact_grouped, make_grouped_case
from test_matmul_grouped_wgmma import CASES

from blockscale.formats import NVFP4
from blockscale.ops import matmul_grouped_p1 as G1
from blockscale.ops import matmul_grouped_pdq as GP
from blockscale.ops import matmul_grouped_rs as GR
from blockscale.ops.matmul_grouped_p1 import kperm_source


def _run(counts, ids, e_count, n, k, rows=False, seed=0, device="interp", **kw):
    rng = np.random.default_rng(700 + seed)
    case, row_scales, w_scales = make_grouped_case(rng, NVFP4, counts, ids, e_count, n, k)
    esc = (1 + (np.arange(e_count) + 1) / e_count).astype(np.float32)
    rs = rng.uniform(0.5, 2, sum(counts)).astype(ml_dtypes.bfloat16) if rows else None
    out = GR.grouped_matmul_block_scaled_rs(**case, expert_scales=esc, fmt="nvfp4", k=k,
                                            a_row_scales=rs, device=device, **kw)
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (sum(counts), n)
    es = case["expert_start"].astype(np.int64)
    for g, e in enumerate(ids):  # rows of unused groups: zeros (D8)
        if e < 0:
            assert not np.any(out[es[g]:es[g + 1]].view(np.uint16))
    exact, abs_sum = exact_grouped(case, row_scales, w_scales, NVFP4, k, esc, rs)
    bound = f32_error_bound(abs_sum, NVFP4, k, n_mul=2 if rows else 1)
    assert_bf16_consistent(out, exact, bound)
    return case, esc, rs, out, exact, bound


@pytest.mark.interp
@pytest.mark.parametrize("wgs", [2, 3])
@pytest.mark.parametrize("case_id", range(len(CASES)))
def test_interp(case_id, wgs):
    """Both shapes: 2 warpgroups x 2 slabs (256 weight rows), 3 x 1 (192)."""
    _run(*CASES[case_id], seed=case_id, wgs=wgs)


@pytest.mark.interp
@pytest.mark.parametrize("kw", [{"depth": 1}, {"depth": 3, "stages": 2},
                                {"wgs": 3, "stages": 3}], ids=["d1", "d3-s2", "w3-s3"])
def test_interp_row_scales_depth_stages(kw):
    """Row scales (D10), prefetch depths, a 2-stage ring refilled every step (K = 320: five
    steps through two stages)."""
    _run([3, 140, 0, 33], [2, 0, -1, 1], 3, 264, 320, rows=True, **kw)


@pytest.mark.interp
def test_kperm_workspace():
    """The kperm phase 1 writes the plain f16 workspace's bytes, each 64-element step's f16
    pairs moved to their kperm_source positions."""
    rng = np.random.default_rng(3)
    counts, ids = [5, 130, 0, 9], [1, 0, -1, 2]
    case, _, _ = make_grouped_case(rng, NVFP4, counts, ids, 3, 16, 160)
    args = {x: np.asarray(case[x], np.int32)
            for x in ("expert_start", "a_scale_offsets", "expert_ids")}
    bufs = {"a": case["hidden"], "sfa": case["a_scales"], **args}
    dev = __import__("blockscale.runtime", fromlist=["get_device"]).get_device("interp")
    t = sum(counts)
    plain = G1.launch(G1.GroupedP1Spec("nvfp4", dtype="f16"), bufs, t, 160, 4, dev)
    perm = G1.launch(G1.GroupedP1Spec("nvfp4", dtype="f16", kperm=True), bufs, t, 160, 4, dev)
    # tile: [k steps][8 chunks][128 rows][8 f16]; position p of a step = chunk p // 8, p % 8
    tiles = plain.size // G1.tile_bytes(160)
    p16 = plain.view(np.uint16).reshape(tiles, -1, 8, 128, 8).transpose(0, 1, 3, 2, 4)
    p16 = p16.reshape(tiles, -1, 128, 64)
    src = np.array([kperm_source(p) for p in range(64)])
    want = p16[:, :, :, src].reshape(tiles, -1, 128, 8, 8).transpose(0, 1, 3, 2, 4)
    written = np.zeros(tiles, bool)
    es = case["expert_start"]
    for g, e in enumerate(ids):  # the used groups' tiles (others are not written)
        if e >= 0 and counts[g]:
            w0 = es[g] // 128 + case["a_scale_offsets"][g]
            written[w0:w0 + -(-counts[g] // 128)] = True
    got = perm.view(np.uint16).reshape(tiles, -1)
    assert np.array_equal(got[written], want.reshape(tiles, -1)[written])
    assert sorted(src) == list(range(64))


def test_spec_checks():
    with pytest.raises(ValueError, match="fmt"):
        GR.GroupedRsSpec("mxfp4")
    with pytest.raises(ValueError, match="stages"):
        GR.GroupedRsSpec("nvfp4", stages=1)
    with pytest.raises(ValueError, match="depth"):
        GR.GroupedRsSpec("nvfp4", depth=4)
    with pytest.raises(ValueError, match="wgs"):
        GR.GroupedRsSpec("nvfp4", wgs=4)
    assert GR.GroupedRsSpec("nvfp4", wgs=3).block == (384, 1, 1)
    assert GR.grid(4096, 5760, 128, GR.GroupedRsSpec("nvfp4", wgs=3).weight_rows)[0] == 30
    with pytest.raises(ValueError, match="kperm"):
        G1.GroupedP1Spec("nvfp4", kperm=True)


def test_host_checks():
    rng = np.random.default_rng(1)
    case, _, _ = make_grouped_case(rng, NVFP4, [3, 2], [0, 1], 2, 12, 64)
    with pytest.raises(ValueError, match="n % 8"):
        GR.grouped_matmul_block_scaled_rs(**case, expert_scales=np.ones(2, np.float32),
                                          device="interp")


@pytest.mark.lower
@pytest.mark.parametrize("wgs", [2, 3])
def test_kernel_sass(wgs):
    """HGMMA with a register A operand (``R..`` second operand), not serialized (no
    WARPGROUP.DEPBAR between the HGMMAs of a step: one per step), no spills."""
    from blockscale.compiler.toolchain import disassemble

    k = GR.kernel(GR.GroupedRsSpec("nvfp4", wgs=wgs))
    sass = disassemble(k.asm["cubin"], "cubin")
    hg = [ln for ln in sass.splitlines() if "HGMMA.64x" in ln]
    assert hg and all(", R" in ln.split("HGMMA", 1)[1].split("gdesc")[0] for ln in hg)
    depbar = [ln for ln in sass.splitlines() if "WARPGROUP.DEPBAR" in ln]
    assert len(depbar) == len(GR.WIDTHS) and len(hg) == len(GR.WIDTHS) * 4 * GR.SLABS[wgs]
    assert "STL" not in sass and "LDL" not in sass


def _gpu(counts, ids, e_count, n, k, **kw):
    """Within the bound of the exact value (both shapes) and of the f16 pdq kernel's output."""
    case, esc, rs, out, _exact, bound = _run(counts, ids, e_count, n, k, device="cuda",
                                             rows=True, **kw)
    _run(counts, ids, e_count, n, k, device="cuda", rows=True, wgs=3, **kw)
    ref = GP.grouped_matmul_block_scaled_pdq(
        **case, expert_scales=esc, fmt="nvfp4", k=k, a_row_scales=rs, prefetch=True,
        store="staged", a_source="workspace", skip=True, dtype="f16", pair=True,
        device="cuda")
    assert_bf16_consistent(out, ref.astype(np.float32), 2 * bound)


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("t", [1024, 4096])
def test_gpu_gpt_oss(t):
    """gpt-oss-120b gate_up: top-4 of 128 experts at T tokens, N=5760, K=2880."""
    counts = list(np.random.default_rng(t).multinomial(4 * t, np.full(128, 1 / 128)))
    _gpu(counts, [e if c else -1 for e, c in enumerate(counts)], 128, 5760, 2880)


@pytest.mark.gpu
@pytest.mark.cuda
def test_gpu_deepseek():
    """DeepSeek-V3's N=4096, K=7168 on 8 experts: an unused one, a 1-row group, groups over
    several token tiles."""
    _gpu([700, 0, 1, 129, 256, 40, 300, 622], [0, -1, 2, 3, 4, 5, 6, 7], 8, 4096, 7168)
