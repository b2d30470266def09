"""Phase 2 in 2-CTA clusters along M sharing B (``cluster=2``, issue #9): each CTA copies
half of every B stage to both CTAs' rings (``cp.async.bulk ... .multicast::cluster``, ctaMask
0b11), each full barrier expects the whole stage, each empty barrier counts the warpgroups of
both CTAs (the peer's arrival through ``mapa`` + ``mbarrier.arrive.shared::cluster``), a
cluster barrier after the mbarrier init and before exit.

* interp: the same bytes as ``cluster=1`` (the interpreter runs a cluster's CTAs in lock-step
  and models multicast copies, remote arrivals and the cluster barrier), including an odd
  number of M-tiles (the last cluster's second CTA loads A's last tile-row, stores nothing);
  a kernel missing the remote arrival or the multicast deadlocks in the model;
* ir / lower: op order, the PTX instructions, SASS (UBLKCP.S.G.MULTICAST, UCGABAR_*,
  SYNCS.ARRIVE.TRANS64.RED with no MEMBAR before it), registers, launch metadata and config;
* gpu: byte-equal to the ``cluster=1`` pair on the H200.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from _twophase_helpers import dense_operands, dispatch_runs, gpu_pair_grid, knob_pair

from blockscale.ops import matmul_twophase as TP


def _operands(fmt, m, n, k):
    return dense_operands(fmt, m, n, k, m + 3 * n + k)


def _pair(fmt, m, n, k, device="interp", **kw):
    """(the pair with ``cluster=2`` and ``kw``, the same with ``cluster=1``)."""
    return knob_pair(fmt, m, n, k, "cluster", 2, 1, seed=m + 3 * n + k, device=device, **kw)


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (300, 264, 160), {"store": "staged"}),  # 3 M-tiles: an odd one out
    ("mxfp4", (70, 504, 96), {"store": "staged", "bn": 240, "out_dtype": "float32"}),
    ("nvfp4", (260, 200, 128), {}),  # direct store, 3 M-tiles
    ("mxfp4", (256, 264, 64), {"store": "staged", "pdl": True}),
    ("nvfp4", (200, 264, 128), {"swizzle": "128b", "bm": 192}),
    ("nvfp4", (130, 520, 96), {"kstep": 32, "stages": 5, "bn": 224}),
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{'-'.join(map(str, c[2].values()))}")
def test_interp_cluster_same_bytes(case):
    fmt, (m, n, k), kw = case
    got, want = _pair(fmt, m, n, k, **kw)
    assert got.shape == (m, n)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.interp
def test_interp_workspaces_path():
    """matmul_workspaces with cluster=2 (phase 2 alone) == cluster=1."""
    m, n, k = 300, 264, 96
    a, b, sfa, sfb, fmt = _operands("nvfp4", m, n, k)
    wa, wb = TP.dequantize_operands(a, b, sfa, sfb, fmt, device="interp")
    run = lambda c: TP.matmul_workspaces(wa, wb, fmt, m, n, k, store="staged", cluster=c,
                                         device="interp")
    assert np.array_equal(run(2).view(np.uint8), run(1).view(np.uint8))


@pytest.mark.interp
@pytest.mark.parametrize("broken", [None, "small_batches", "remote_arrive", "multicast_mask",
                                    "no_cluster_launch"])
def test_interp_cluster_protocol_checked(monkeypatch, broken):
    """The model is not vacuous: without the peer's arrival on the empty barrier the
    producer's wait never completes; a B half copied to this CTA only leaves the peer's full
    barrier short; a cluster kernel launched without a cluster dimension has no peer. Batches
    of one CTA's threads still hold whole clusters. (The kernel is built here and run by
    run_kernel: no kernel cache.)"""
    from blockscale.compiler.arch import cpasync
    from blockscale.runtime.interpreter import run_kernel
    from blockscale.runtime.interpreter.ops_tma import MBarrierDeadlockError

    err, cluster, batch = None, (2, 1, 1), 1 << 17
    if broken == "small_batches":  # one CTA's threads a batch: rounded up to whole clusters
        batch = 256
    if broken == "remote_arrive":
        monkeypatch.setattr(cpasync, "mbarrier_arrive_cluster", lambda mbar: None)
        err = MBarrierDeadlockError
    elif broken == "multicast_mask":
        real = cpasync.bulk_copy_multicast
        monkeypatch.setattr(cpasync, "bulk_copy_multicast",
                            lambda d, s, n, b, mask: real(d, s, n, b, 1))
        err = MBarrierDeadlockError
    elif broken == "no_cluster_launch":
        err, cluster = ValueError, None
    m, n, k = 256, 264, 384  # 6 k-steps: the producer waits on empty barriers
    a, b, sfa, sfb, fmt = _operands("nvfp4", m, n, k)
    wa, wb = TP.dequantize_operands(a, b, sfa, sfb, fmt, device="interp")
    spec = TP.TwophaseMatmulSpec("nvfp4", store="staged", cluster=2)
    c = np.zeros((m, n), np.uint16)
    vals = {"wa": wa, "wb": wb, "c": c, "m": m, "n": n, "k": k, "alpha": 1.0}
    args = [vals[x.name] for x in spec.args()]
    run = lambda: run_kernel(str(TP.build(spec)), spec.kernel_name, TP.grid(m, n, cluster=2),
                             spec.block, args, "sm_90a",
                             dynamic_shared_bytes=spec.dynamic_shared_bytes, cluster=cluster,
                             batch_threads=batch)
    if err is None:
        run()
        want = TP.matmul_workspaces(wa, wb, fmt, m, n, k, store="staged", device="interp")
        assert np.array_equal(c, want.view(np.uint16))
        return
    with pytest.raises(err):
        run()


@pytest.mark.ir
def test_cluster_spec_grid_meta():
    s = TP.TwophaseMatmulSpec("nvfp4", store="staged", bn=240, cluster=2)
    assert s.kernel_name == "bs_twophase_nvfp4_128x240_k64_s4_bf16_st_c2"
    assert s.launch_meta == {"cluster_dim": (2, 1, 1)}
    p = TP.TwophaseMatmulSpec("nvfp4", store="staged", pdl=True, cluster=2)
    assert p.kernel_name.endswith("_st_pdl_c2")
    assert p.launch_meta == {"programmatic_launch": True, "cluster_dim": (2, 1, 1)}
    assert TP.TwophaseMatmulSpec("nvfp4").launch_meta == {}
    assert TP.TwophaseMatmulSpec("nvfp4").kernel_name == "bs_twophase_nvfp4_128x256_k64_s4_bf16"
    with pytest.raises(ValueError, match="cluster"):
        TP.TwophaseMatmulSpec("nvfp4", cluster=4)
    with pytest.raises(TypeError, match="cluster must be an int"):
        TP.TwophaseMatmulSpec("nvfp4", cluster="2")
    with pytest.raises(ValueError, match="schedule 'tiles'"):
        TP.TwophaseMatmulSpec("nvfp4", schedule="persistent", cluster=2)
    # M-tiles rounded up to whole clusters: 8192 x 5760 at 128 x 240 -> 64 x 24 tiles
    assert TP.grid(8192, 5760, bn=240, cluster=2) == (1536, 1, 1)
    assert TP.grid(300, 264, cluster=2) == (8, 1, 1)  # 3 -> 4 M-tiles x 2 N-tiles
    assert TP.grid(300, 264) == (6, 1, 1)
    with pytest.raises(ValueError, match="schedule 'tiles'"):
        TP.grid(300, 264, schedule="persistent", cluster=2)
    names = [x.kernel_name for x in TP.bundle_specs("sm_90a")]
    for f in TP.FORMATS:
        for bn in (256, 240):
            for o in ("bf16", "f32"):
                assert f"bs_twophase_{f}_128x{bn}_k64_s4_{o}_st_c2" in names
            assert f"bs_twophase_{f}_128x{bn}_k64_s4_bf16_st_pdl_c2" in names


@pytest.mark.ir
def test_cluster_ir_order():
    """Cluster barrier (arrive + wait) after the mbarrier init and before the first copy;
    B by multicast (ctaMask 3), A not; one mapa'd remote arrival in the K loop; a second
    arrive after the loop, its wait last."""
    ir = str(TP.build(TP.TwophaseMatmulSpec("nvfp4", store="staged", cluster=2)))
    arrive, wait = "nvvm.cluster.arrive", "nvvm.cluster.wait"
    assert ir.count(arrive) == 2 and ir.count(wait) == 2 and "gpu.barrier" not in ir[
        :ir.index(wait)]
    first = ir.index(arrive)
    # the first relaxed (the init fence releases), the last a release (the remote arrivals)
    assert ir.index("nvvm.cluster.arrive.relaxed") == first and ir.count("relaxed") == 1
    assert ir.rindex("nvvm.mbarrier.init ", 0, first) < ir.rindex("nvvm.fence.mbarrier", 0,
                                                                 first) < first
    assert first < ir.index(wait) < ir.index("cp.async.bulk.shared.cluster.global")
    copies = re.findall(r"nvvm\.cp\.async\.bulk\.shared\.cluster\.global [^\n]*", ir)
    multi = [c for c in copies if "multicast_mask" in c]
    assert len(copies) == 8 and len(multi) == 4  # 3 prologue + 1 refill, A and B each
    assert ir.count("nvvm.mapa") == 1 and ir.count("nvvm.mbarrier.arrive %") >= 1
    assert re.search(r"nvvm\.mbarrier\.arrive %\w+ : !llvm\.ptr<7>", ir)
    assert ir.rindex(arrive) > ir.rindex("wgmma.wait.group") and ir.rindex(wait) > ir.rindex(
        "cp.async.bulk.global.shared.cta")
    plain = str(TP.build(TP.TwophaseMatmulSpec("nvfp4", store="staged")))
    assert "cluster" not in plain.replace("shared.cluster.global", "") and "mapa" not in plain


@pytest.mark.lower
@pytest.mark.parametrize("bn", [256, 240])
def test_cluster_ptx_sass(bn):
    kernel = TP.kernel(TP.TwophaseMatmulSpec("nvfp4", store="staged", bn=bn, cluster=2))
    ptx, sass, meta = kernel.asm["ptx"], kernel.asm["sass"], kernel.binary.meta
    assert len(re.findall(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::"
                          r"bytes\.multicast::cluster", ptx)) == 4
    assert len(re.findall(r"mapa\.shared::cluster", ptx)) == 1
    assert len(re.findall(r"mbarrier\.arrive\.shared::cluster\.b64", ptx)) == 1
    assert len(re.findall(r"barrier\.cluster\.arrive", ptx)) == 2
    assert len(re.findall(r"barrier\.cluster\.wait", ptx)) == 2
    assert len(re.findall(r"UBLKCP\.S\.G\.MULTICAST", sass)) == 4
    assert len(re.findall(r"\bUCGABAR_ARV\b", sass)) == 2
    assert len(re.findall(r"\bUCGABAR_WAIT\b", sass)) == 2
    lines = [x for x in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", x)]
    red = [i for i, x in enumerate(lines) if "SYNCS.ARRIVE.TRANS64.RED" in x]
    assert len(red) == 1 and "MEMBAR" not in lines[red[0] - 1]  # .release.cta: no membar
    assert meta["cluster_dim"] == (2, 1, 1) or list(meta["cluster_dim"]) == [2, 1, 1]
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0
    assert meta["registers"] <= 168


def test_launch_config_cluster():
    pytest.importorskip("cuda.bindings.driver")
    from cuda.bindings import driver as drv

    from blockscale.runtime import cuda as C

    c = C.launch_config((1536, 1, 1), (256, 1, 1), 196672, 0, programmatic=True,
                        cluster=(2, 1, 1))
    assert c.numAttrs == 2
    ids = [a.id for a in c.attrs]
    assert drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION in ids
    attr = c.attrs[ids.index(drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)]
    assert (attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z) == (
        2, 1, 1)
    assert C.launch_config((4, 1, 1), (128, 1, 1), 0, 0, cluster=(2, 1, 1)).numAttrs == 1
    with pytest.raises(ValueError, match="cluster"):
        C.launch_config((3, 1, 1), (128, 1, 1), 0, 0, cluster=(2, 1, 1))
    assert C.CLUSTER_DIM in TP.TwophaseMatmulSpec("nvfp4", cluster=2).launch_meta


@pytest.mark.interp
def test_dispatch_with_cluster(monkeypatch):
    """BLOCKSCALE_SM90_TWOPHASE_CLUSTER=2: the dispatch runs phase 2 in clusters, same
    bytes; default 1; other values raise."""
    monkeypatch.delenv(TP.ENV_CLUSTER, raising=False)
    assert TP.DISPATCH_CLUSTER == 1 and TP.dispatch_cluster() == 1
    monkeypatch.setenv(TP.ENV_CLUSTER, "3")
    with pytest.raises(ValueError, match="BLOCKSCALE_SM90_TWOPHASE_CLUSTER"):
        TP.dispatch_cluster()
    m, n, k = 300, 264, 96
    ops = _operands("nvfp4", m, n, k)
    want = TP.block_scaled_matmul_twophase(*ops, store="staged", device="interp")
    got, launched = dispatch_runs(monkeypatch, TP.ENV_CLUSTER, "2", ops)
    assert [s.cluster for s in launched] == [2]
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.lower
def test_cluster_meta_survives_bundle(tmp_path):
    """The bundle entry (JSON) keeps ``cluster_dim``; the CUDA launch config takes it."""
    from blockscale.launch import load_kernel, save_kernel

    spec = TP.TwophaseMatmulSpec("nvfp4", store="staged", bn=240, cluster=2)
    save_kernel(str(tmp_path), "k", TP.kernel(spec).binary)
    meta = load_kernel(str(tmp_path), "k").meta
    assert list(meta["cluster_dim"]) == [2, 1, 1]
    pytest.importorskip("cuda.bindings.driver")
    from blockscale.runtime import cuda as C

    c = C.launch_config(TP.grid(8192, 5760, bn=240, cluster=2), spec.block,
                        spec.dynamic_shared_bytes, 0, cluster=meta["cluster_dim"])
    assert c.numAttrs == 1 and c.attrs[0].value.clusterDim.x == 2


@gpu_pair_grid
def test_gpu_cluster(shape, fmt, bn, out_dtype):
    """On the H200: 2-CTA clusters sharing B write the bytes of the cluster=1 pair (same
    operands, same k16 order; a stage refilled before both CTAs released it, a missing
    multicast half or a CTA exiting under its peer's writes would not)."""
    m, n, k = shape
    got, want = _pair(fmt, m, n, k, device="cuda", store="staged", bn=bn,
                      out_dtype=out_dtype)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", TP.FORMATS)
@pytest.mark.parametrize("bn", [256, 240], ids=lambda b: f"bn{b}")
def test_gpu_cluster_pdl(fmt, bn):
    """cluster=2 with programmatic dependent launch (both launch attributes)."""
    got, want = _pair(fmt, 8192, 5760, 2944, device="cuda", store="staged", bn=bn, pdl=True)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
