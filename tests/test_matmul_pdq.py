"""The warp-specialized producer-dequant sm_90a matmul (matmul_pdq: the two-phase kernel's
consumers, a producer warpgroup dequantizing packed B into the shared ring).

* interp: bit for bit against the two-phase pair (same stage bytes, same k16 wgmma order;
  kstep 64, bm 128) and within the fp32 bound of test_matmul_common.py; NVFP4 / MXFP4, M / N
  / K tails, 2..4 stages, with and without the producer's prefetch. The "lockstep" loop runs
  any K in the interpreter; the "split" loop (the GPU kernel) while the steps fit in the ring
  (ceil(K / 64) < stages), past that the lock-step order deadlocks, which is checked too.
* lower: sm_90a SASS of the bundled (split) kernels: 4 HGMMA.64x256x16, the producer's
  eight STS.128 per row pair, FENCE.VIEW.ASYNC.S, one UBLKCP, no spills, and no wgmma
  serialization (ptxas C7518 / C7517).
* gpu: on an H100 / H200 (``make gpu-bundle`` collects ``matmul_pdq.bundle_specs``)::

      BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu tests/test_matmul_pdq.py

  the bound on sampled rows, and bit-identity with the two-phase pair (the same bf16
  operands and HGMMA order run on the same hardware).
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
from blockscale.ops import matmul_pdq as P
from blockscale.ops import matmul_twophase as TP


def _check(m, n, k, fmt, out_dtype, stages=None, prefetch=True, loop="lockstep",
           device="interp", rows=None, a_source="workspace", store="direct", producers=1,
           bn=256, depth=1, bound=True):
    """The bound (unless not ``bound``) and bit-identity with the two-phase pair."""
    fmt = Format.from_name(fmt)
    rng = np.random.default_rng(m * 131 + n * 7 + k)
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    got = P.block_scaled_matmul_pdq(a, b, sfa5, sfb5, fmt, alpha=0.375, out_dtype=out_dtype,
                                    stages=stages, prefetch=prefetch, loop=loop,
                                    a_source=a_source, store=store, producers=producers,
                                    bn=bn, depth=depth, device=device)
    assert got.shape == (m, n)
    ref = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, fmt, alpha=0.375,
                                          out_dtype=out_dtype, kstep=64, device=device)
    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))
    if not bound:
        return
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, 0.375, rows)
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1 + (fmt.kblocks(k) if fmt.is_mx else 0))
    sel = got if rows is None else got[rows]
    if out_dtype == "float32":
        assert_f32_within_bound(sel, exact, bound)
    else:
        assert_bf16_consistent(sel, exact, bound)


def _case_id(c):
    return f"{c[0]}-{'x'.join(map(str, c[1]))}-s{c[2]}-pf{int(c[3])}-{c[4]}"


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (129, 256, 512), None, True, "float32"),  # M tail, 8 steps over 4 stages
    ("mxfp4", (129, 256, 512), None, True, "bfloat16"),
    ("nvfp4", (130, 300, 224), 2, True, "bfloat16"),  # N tail, K tail (half step), 2 stages
    ("mxfp4", (70, 260, 352), 3, False, "float32"),  # no prefetch
    ("nvfp4", (1, 5, 32), None, True, "float32"),  # one step, mostly padding
    pytest.param(("nvfp4", (1, 576, 7168), None, True, "float32"), marks=pytest.mark.slow),
    pytest.param(("nvfp4", (255, 300, 2944), None, True, "bfloat16"), marks=pytest.mark.slow),
    pytest.param(("mxfp4", (255, 300, 2944), 3, False, "float32"), marks=pytest.mark.slow),
], ids=_case_id)
def test_interp_lockstep(case):
    fmt, (m, n, k), stages, prefetch, out_dtype = case
    _check(m, n, k, fmt, out_dtype, stages, prefetch, "lockstep")


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 300, 192), None, True, "float32"),  # 3 steps in 4 stages; M, N tails
    ("mxfp4", (200, 260, 160), None, False, "bfloat16"),  # K tail (half step), no prefetch
    ("nvfp4", (64, 256, 64), 2, True, "bfloat16"),  # 1 step, 2 stages
    ("nvfp4", (1, 5, 32), None, True, "float32"),
], ids=_case_id)
def test_interp_split(case):
    """The GPU kernel ("split": a K loop per role) while its steps fit in the ring."""
    fmt, (m, n, k), stages, prefetch, out_dtype = case
    _check(m, n, k, fmt, out_dtype, stages, prefetch, "split")


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (129, 300, 352), "lockstep", None, True, "float32"),  # M, N, K tails, wraps
    ("mxfp4", (70, 256, 224), "lockstep", 2, False, "bfloat16"),
    ("nvfp4", (200, 260, 160), "split", None, True, "bfloat16"),
    ("mxfp4", (1, 5, 32), "split", None, False, "float32"),
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}-s{c[3]}-pf{int(c[4])}-{c[5]}")
def test_interp_packed_a(case):
    """a_source "packed": the producer dequantizes A's packed rows too (no phase 1); the
    same stage bytes as the workspace, so the two-phase pair's output."""
    fmt, (m, n, k), loop, stages, prefetch, out_dtype = case
    _check(m, n, k, fmt, out_dtype, stages, prefetch, loop, a_source="packed")


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 264, 192), "split", "workspace", "bfloat16"),  # M, N tails (N % 8 == 0)
    ("mxfp4", (129, 300, 352), "lockstep", "packed", "float32"),  # K tail, wraps the ring
    ("nvfp4", (200, 260, 160), "split", "packed", "float32"),
    ("mxfp4", (1, 8, 32), "split", "workspace", "bfloat16"),
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}-{c[3]}-{c[4]}")
def test_interp_staged(case):
    """store "staged" (every thread after the role branches, the consumers write the
    stage, bulk copies per row): the direct store's bytes (= the two-phase pair's)."""
    fmt, (m, n, k), loop, a_source, out_dtype = case
    stages = 3 if loop == "lockstep" else None  # split: the steps fit in the ring
    _check(m, n, k, fmt, out_dtype, stages, True, loop, a_source=a_source, store="staged")


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 264, 192), "split", "workspace", "bfloat16", "direct", 2),
    ("mxfp4", (129, 400, 352), "lockstep", "packed", "float32", "direct", 2),  # 3 tiles of N
    ("nvfp4", (200, 392, 160), "split", "packed", "bfloat16", "staged", 2),
    ("mxfp4", (70, 200, 224), "lockstep", "workspace", "float32", "staged", 2),
    ("nvfp4", (65, 200, 96), "split", "packed", "bfloat16", "direct", 1),  # one producer
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}-{c[3]}-{c[4]}-{c[5]}-p{c[6]}")
def test_interp_bn192(case):
    """128 x 192 tiles, two producer warpgroups (512 threads; the row halves of a step dealt
    over 256 threads, B's 384 as 2 / 1 a thread) or one: the two-phase pair's bytes (the
    same k16 sums at any tile width)."""
    fmt, (m, n, k), loop, a_source, out_dtype, store, producers = case
    _check(m, n, k, fmt, out_dtype, None, True, loop, a_source=a_source, store=store,
           producers=producers, bn=192)


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 264, 192), "split", "workspace", "bfloat16", "staged", 2, 192),
    ("mxfp4", (129, 400, 416), "lockstep", "packed", "float32", "direct", 2, 192),
    ("nvfp4", (70, 296, 352), "lockstep", "workspace", "bfloat16", "staged", 1, 256),
    ("mxfp4", (64, 256, 32), "split", "packed", "bfloat16", "direct", 1, 256),  # one step
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}-{c[3]}-{c[5]}-p{c[6]}-{c[7]}")
def test_interp_depth2(case):
    """Prefetch distance 2 (step t + 2's loads after step t's fence; zeros past the steps):
    the two-phase pair's bytes."""
    fmt, (m, n, k), loop, a_source, out_dtype, store, producers, bn = case
    _check(m, n, k, fmt, out_dtype, None, True, loop, a_source=a_source, store=store,
           producers=producers, bn=bn, depth=2)


@pytest.mark.interp
def test_interp_split_deadlocks_past_the_ring():
    """In lock-step order the split producer runs first and waits for a release the
    consumers make later: at ceil(K / 64) >= stages the interpreter reports the deadlock
    (the reason the lockstep loop exists) instead of a wrong result."""
    from blockscale.runtime.interpreter.ops_tma import MBarrierDeadlockError

    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(3), NVFP4, 64, 256, 256)
    with pytest.raises(MBarrierDeadlockError):
        P.block_scaled_matmul_pdq(a, b, sfa5, sfb5, NVFP4, stages=4, loop="split",
                                  device="interp")


@pytest.mark.interp
@pytest.mark.parametrize("store,n,seed", [("direct", 300, 6), ("staged", 264, 8)])
def test_interp_fused_epilogue(store, n, seed):
    """bias + relu fused (into the staged store too: the epilogue's loads only inside C):
    the two-phase pair's bytes."""
    from blockscale.ops import matmul_epilogue as ep

    m, k = 130, 96
    rng = np.random.default_rng(seed)
    a, b, _, _, sfa5, sfb5 = random_dense_case(rng, NVFP4, m, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    kw = {"alpha": 0.5, "epilogue": ep.chain(ep.bias(), ep.relu()),
          "epilogue_inputs": {"bias": bias}, "device": "interp"}
    got = P.block_scaled_matmul_pdq(a, b, sfa5, sfb5, NVFP4, loop="split", store=store, **kw)
    want = TP.block_scaled_matmul_twophase(a, b, sfa5, sfb5, NVFP4, kstep=64, **kw)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert (got.astype(np.float32) >= 0).all() and got.astype(np.float32).max() > 0


@pytest.mark.ir
def test_spec_validation_and_bundle():
    assert P.PdqMatmulSpec("nvfp4").stages == P.MAX_STAGES
    with pytest.raises(ValueError, match="stages"):
        P.PdqMatmulSpec("nvfp4", stages=5)
    with pytest.raises(ValueError, match="stages"):
        P.PdqMatmulSpec("nvfp4", stages=1)
    with pytest.raises(TypeError, match="prefetch"):
        P.PdqMatmulSpec("nvfp4", prefetch=1)
    with pytest.raises(ValueError, match="loop"):
        P.PdqMatmulSpec("nvfp4", loop="fused")
    with pytest.raises(ValueError, match="a_source"):
        P.PdqMatmulSpec("nvfp4", a_source="tma")
    with pytest.raises(ValueError, match="store"):
        P.PdqMatmulSpec("nvfp4", store="tma")
    # the f32 staged tile (133,120 bytes) needs 3 of the 48 KiB stages
    with pytest.raises(ValueError, match="stages=2"):
        P.PdqMatmulSpec("nvfp4", "float32", stages=2, store="staged")
    assert P.PdqMatmulSpec("nvfp4", "float32", stages=3, store="staged").kernel_name.endswith(
        "_f32_st")
    with pytest.raises(ValueError, match="bn=192"):  # 512 threads: 128 registers a thread
        P.PdqMatmulSpec("nvfp4", producers=2)
    with pytest.raises(ValueError, match="producers"):
        P.PdqMatmulSpec("nvfp4", producers=3, bn=192)
    with pytest.raises(ValueError, match="bn"):
        P.PdqMatmulSpec("nvfp4", bn=128)
    p2 = P.PdqMatmulSpec("nvfp4", producers=2, bn=192)
    assert p2.block == (512, 1, 1) and p2.stages == 5 and p2.kernel_name.endswith("_p2")
    assert p2.dynamic_shared_bytes == TP.TwophaseMatmulSpec(
        "nvfp4", kstep=64, stages=5, bn=192).dynamic_shared_bytes
    assert P.grid(8192, 5760, 192) == (64 * 30, 1, 1)
    with pytest.raises(ValueError, match="depth"):
        P.PdqMatmulSpec("nvfp4", prefetch=False, depth=2)
    with pytest.raises(ValueError, match="depth"):
        P.PdqMatmulSpec("nvfp4", depth=3)
    assert P.PdqMatmulSpec("nvfp4", depth=2).kernel_name.endswith("_bf16_d2")
    assert [a.name for a in P.PdqMatmulSpec("nvfp4", a_source="packed").args()][:4] == [
        "a", "b", "sfa", "sfb"]
    with pytest.raises(ValueError, match="fmt"):
        P.PdqMatmulSpec("mxfp8")
    with pytest.raises(ValueError, match="target"):
        P.PdqMatmulSpec("nvfp4", target="sm_100a")
    specs = P.bundle_specs("sm_90a")
    assert len(specs) == len({s.kernel_name for s in specs}) == 52
    assert sum(s.store == "staged" for s in specs) == 8 + 8 + 4 + 8
    assert sum(s.depth == 2 for s in specs) == 8
    assert sum(s.producers == 2 for s in specs) == 16 + 4
    assert all(s.loop == "split" for s in specs)
    assert P.bundle_specs("sm_100a") == []
    assert P.PdqMatmulSpec("nvfp4").dynamic_shared_bytes == TP.TwophaseMatmulSpec(
        "nvfp4", kstep=64, stages=4).dynamic_shared_bytes


@pytest.mark.interp
def test_host_validation():
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(0), NVFP4, 4, 4, 48)
    with pytest.raises(ValueError, match="k % 32"):
        P.block_scaled_matmul_pdq(a, b, sfa5, sfb5, NVFP4, device="interp")
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(0), NVFP4, 4, 4, 64)
    with pytest.raises(ValueError, match="fmt"):
        P.block_scaled_matmul_pdq(a, b, sfa5, sfb5, MXFP8, device="interp")
    with pytest.raises(ValueError, match="n=4"):  # 8-byte bf16 rows: no bulk copies
        P.block_scaled_matmul_pdq(a, b, sfa5, sfb5, NVFP4, store="staged", device="interp")
    empty = P.block_scaled_matmul_pdq(a[:0], b, sfa5[:0], sfb5, NVFP4, device="interp")
    assert empty.shape == (0, 4)


def loop_local(sass: str) -> int:
    """Local-memory instructions (LDL / STL) inside the kernel's innermost loops (the K
    loops; not the ranges of the mbarrier try-wait retry branches around them)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import sass_loop_counts as L

    ins = L.parse(sass)
    lps = [(lo, hi) for lo, hi, _ in L.loops(ins)]
    inner = [(lo, hi) for lo, hi in lps
             if not any(lo < a and b <= hi or lo <= a and b < hi for a, b in lps)]
    return sum(1 for lo, hi in inner for a, t in ins
               if lo <= a <= hi and re.match(r"(@!?P\w+\s+)?(LDL|STL)", t))


LOWER_SPECS = [pytest.param(s, id=s.kernel_name,
                            marks=[pytest.mark.slow] if "f32" in s.kernel_name else [])
               for s in P.bundle_specs("sm_90a")]


@pytest.mark.lower
@pytest.mark.parametrize("spec", LOWER_SPECS)
def test_kernel_sass(spec):
    """4 HGMMA per consumer step; the producer: sixteen STS.128 per step (2 rows x 8 chunks;
    24 with packed A), its proxy fence (FENCE.VIEW.ASYNC.S) and mbarrier arrival; one bulk
    copy (A) per step (none with packed A); no spills (but 16 bytes for packed A with the
    prefetch) and no wgmma serialization (the role branch is warp-uniform). The staged
    store: 64 STS per consumer thread (bf16 pairs; STS.64 for f32), no STG, its proxy
    fence, the two CTA barriers and one more bulk copy (the output rows)."""
    kernel = P.kernel(spec)
    sass, meta = kernel.asm["sass"], kernel.meta
    # a few spills at most (values kept across the producer's loop), none in a K loop but
    # with packed A (30 prefetched registers at 168: up to 9 LDL / STL in the producer's
    # loop since round 2's decode, against ~140 fewer instructions a step; not dispatched)
    packed_a = spec.a_source == "packed"
    assert meta["spill_stores"] <= (64 if packed_a else 48)
    assert meta["spill_loads"] <= (64 if packed_a else 48)
    assert loop_local(sass) <= (10 if packed_a else 0)
    assert meta["registers"] <= 65536 // spec.block[0]  # 168 at 384 threads, 128 at 512
    assert len(re.findall(rf"HGMMA\.64x{spec.bn}x16\.F32\.BF16", sass)) == 4
    packed, staged = spec.a_source == "packed", spec.store == "staged"
    assert len(re.findall(r"\bUBLKCP\b", sass)) == (0 if packed else 1) + staged
    # 8 chunks a row a thread (4 a row half); 128 x 192 over 256 threads: at most 2 B
    # halves (+ 1 of A), over 128 threads: 3 B halves (+ 2 of A)
    units = {(256, 1): 4, (192, 2): 2, (192, 1): 3}[spec.bn, spec.producers]
    units += {(256, 1): 2, (192, 2): 1, (192, 1): 2}[spec.bn, spec.producers] * packed
    assert len(re.findall(r"STS\.128", sass)) == 4 * units
    assert len(re.findall(r"FENCE\.VIEW\.ASYNC\.S", sass)) == 2 + staged  # + the init's
    assert len(re.findall(r"BAR\.SYNC", sass)) == 1 + 2 * staged
    if staged:
        assert not re.search(r"\bSTG", sass)
        wide = "STS.64" if spec.out_dtype == "float32" else "STS "
        # (+ the producers' table words, one STS.64 at the start)
        assert len(re.findall(rf"{re.escape(wide)}", sass)) == spec.bn // 4 + (wide != "STS ")
    assert re.search(r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT", sass)
    assert len(re.findall(r"WARPGROUP\.DEPBAR", sass)) == 2
    log = meta.get("ptxas_log", "")
    assert "C7518" not in log and "C7517" not in log and "C7515" not in log
    assert meta["dynamic_shared_bytes"] == spec.dynamic_shared_bytes


GPU_SHAPES = [(8192, 5760, 2944), (777, 2560, 8192), (1000, 1024, 1056)]


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", P.FORMATS)
@pytest.mark.parametrize("prefetch", [True, False], ids=["pf", "nopf"])
@pytest.mark.parametrize("a_source", P.A_SOURCES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gpu(shape, out_dtype, a_source, prefetch, fmt):
    """The stated bound on sampled rows and the two-phase pair's bytes (same operands, same
    HGMMA order on the same hardware)."""
    m, n, k = shape
    rng = np.random.default_rng(m + n)
    rows = np.unique(np.concatenate([np.arange(min(m, 64)), np.arange(max(0, m - 64), m),
                                     rng.integers(0, m, 64)]))
    _check(m, n, k, fmt, out_dtype, prefetch=prefetch, loop="split", device="cuda", rows=rows,
           a_source=a_source)


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", P.FORMATS)
@pytest.mark.parametrize("a_source", P.A_SOURCES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gpu_staged(shape, out_dtype, a_source, fmt):
    """store "staged" (prefetch on): the two-phase pair's bytes, so the direct store's
    (bound: test_gpu)."""
    m, n, k = shape
    _check(m, n, k, fmt, out_dtype, prefetch=True, loop="split", device="cuda",
           a_source=a_source, store="staged", bound=False)


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", P.FORMATS)
@pytest.mark.parametrize("store", P.STORES)
@pytest.mark.parametrize("a_source", P.A_SOURCES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gpu_p2(shape, out_dtype, a_source, store, fmt):
    """Two producer warpgroups at 128 x 192 (prefetch on): the two-phase pair's bytes (whose
    bound test_gpu checks: no float64 reference here, to keep the GPU run short)."""
    m, n, k = shape
    _check(m, n, k, fmt, out_dtype, prefetch=True, loop="split", device="cuda",
           a_source=a_source, store=store, producers=2, bn=192, bound=False)


@pytest.mark.interp
def test_interp_proxy_fence_needed(monkeypatch):
    """Without the producer's ``fence.proxy.async.shared::cta`` its generic-proxy stores are
    not visible to the wgmmas: the interpreter's wgmma model refuses the kernel (built here:
    the kernel cache is bypassed)."""
    from blockscale.compiler.arch import wgmma as W
    from blockscale.runtime.interpreter import run_kernel
    from blockscale.runtime.interpreter.ops_wgmma import WgmmaOrderError

    m, n, k = 64, 256, 128
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(4), NVFP4, m, n, k)
    spec = P.PdqMatmulSpec("nvfp4", "float32", loop="lockstep", a_source="packed")
    want = P.block_scaled_matmul_pdq(a, b, sfa5, sfb5, NVFP4, out_dtype="float32",
                                     loop="lockstep", a_source="packed", device="interp")
    for fenced in (True, False):
        if not fenced:
            monkeypatch.setattr(W, "fence_proxy_async_shared", lambda **kw: None)
        c = np.zeros(m * n, np.float32)
        run = lambda c=c: run_kernel(str(P.build(spec)), spec.kernel_name, (1, 1, 1),
                                     spec.block, [a, b, sfa5, sfb5, c, m, n, k, 1.0], "sm_90a",
                                     dynamic_shared_bytes=spec.dynamic_shared_bytes)
        if fenced:
            run()
            np.testing.assert_array_equal(c.reshape(m, n).view(np.uint32),
                                          want.view(np.uint32))
            continue
        with pytest.raises(WgmmaOrderError, match="fence.proxy.async"):
            run()


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", P.FORMATS)
@pytest.mark.parametrize("cta", [(1, 256), (2, 192)], ids=["p1-256", "p2-192"])
@pytest.mark.parametrize("a_source", P.A_SOURCES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_depth2(shape, a_source, cta, fmt):
    """Prefetch distance 2, staged, bf16: the two-phase pair's bytes (bound: test_gpu)."""
    m, n, k = shape
    _check(m, n, k, fmt, "bfloat16", prefetch=True, loop="split", device="cuda",
           a_source=a_source, store="staged", producers=cta[0], bn=cta[1], depth=2,
           bound=False)
