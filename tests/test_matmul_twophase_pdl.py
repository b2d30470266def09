"""Programmatic dependent launch (PDL) of the two-phase pair (issue #9): B's phase 1
executes ``griddepcontrol.launch_dependents`` at its start, phase 2 (``pdl=True``) is
launched with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` and every thread
executes ``griddepcontrol.wait`` after the mbarrier init, before the first workspace read.

* ir / lower: where the griddepcontrol ops sit, the PTX instructions, the kernel metadata
  the CUDA runtime launches by, and the ``cuLaunchKernelEx`` config (cuda-python, no GPU);
* interp: the same bytes as without PDL (the interpreter's launches are sequential, so its
  griddepcontrol model is a no-op);
* gpu: byte-equal to the pair without PDL on the H200; CUDA-graph capture through the
  dispatch: ``BLOCKSCALE_SM90_TWOPHASE_PDL=1 pytest -m gpu tests/test_cuda_graph_gpu.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from _twophase_helpers import dense_operands, dispatch_runs, gpu_pair_grid, knob_pair

from blockscale.ops import matmul_twophase as TP


def _pair(fmt, m, n, k, device="interp", **kw):
    """(the pair with ``pdl=True`` and ``kw``, the same without PDL)."""
    return knob_pair(fmt, m, n, k, "pdl", True, False, seed=m + n + k, device=device, **kw)


@pytest.mark.interp
@pytest.mark.parametrize("case", [
    ("nvfp4", (130, 264, 224), {"store": "staged"}),
    ("mxfp4", (70, 504, 96), {"store": "staged", "bn": 240, "out_dtype": "float32"}),
    ("nvfp4", (260, 300, 160), {"schedule": "persistent", "ctas": 2}),
], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{'-'.join(map(str, c[2].values()))}")
def test_interp_pdl_same_bytes(case):
    fmt, (m, n, k), kw = case
    got, want = _pair(fmt, m, n, k, **kw)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.ir
def test_pdl_ir_order():
    """Phase 2: one wait, after the mbarrier init (and its fence / CTA barrier), before the
    first bulk copy; phase 1: launch_dependents first. Without ``pdl``: neither."""
    p2 = str(TP.build(TP.TwophaseMatmulSpec("nvfp4", store="staged", bn=240, pdl=True)))
    assert p2.count("nvvm.griddepcontrol") == 1
    wait = p2.index("nvvm.griddepcontrol  wait")
    assert p2.rindex("mbarrier.init", 0, wait) < p2.rindex("gpu.barrier", 0, wait) < wait
    assert wait < p2.index("cp.async.bulk") and wait < p2.index("wgmma")
    p1 = str(TP.build(TP.DequantSpec("nvfp4", tile=240, pdl=True)))
    assert p1.count("nvvm.griddepcontrol") == 1
    assert p1.index("launch_dependents") < p1.index("vector.load")
    for spec in (TP.TwophaseMatmulSpec("nvfp4", store="staged"), TP.DequantSpec("nvfp4")):
        assert "griddepcontrol" not in str(TP.build(spec))
    persistent = TP.TwophaseMatmulSpec("nvfp4", schedule="persistent", pdl=True)
    assert str(TP.build(persistent)).count("nvvm.griddepcontrol  wait") == 1


@pytest.mark.ir
def test_pdl_spec_and_dispatch(monkeypatch):
    s = TP.TwophaseMatmulSpec("nvfp4", store="staged", bn=240, pdl=True)
    assert s.kernel_name == "bs_twophase_nvfp4_128x240_k64_s4_bf16_st_pdl"
    assert s.launch_meta == {"programmatic_launch": True}
    assert TP.TwophaseMatmulSpec("nvfp4").launch_meta == {}
    assert TP.DequantSpec("nvfp4", tile=256, pdl=True).kernel_name == (
        "bs_twophase_dequant_nvfp4_t256_pdl")
    with pytest.raises(TypeError, match="pdl must be a bool"):
        TP.TwophaseMatmulSpec("nvfp4", pdl=1)
    with pytest.raises(TypeError, match="pdl must be a bool"):
        TP.DequantSpec("nvfp4", pdl="yes")
    monkeypatch.delenv(TP.ENV_PDL, raising=False)
    assert TP.DISPATCH_PDL is False and TP.dispatch_pdl() is False
    monkeypatch.setenv(TP.ENV_PDL, "1")
    assert TP.dispatch_pdl() is True
    monkeypatch.setenv(TP.ENV_PDL, "on")
    with pytest.raises(ValueError, match="BLOCKSCALE_SM90_TWOPHASE_PDL"):
        TP.dispatch_pdl()
    names = [x.kernel_name for x in TP.bundle_specs("sm_90a")]
    for f in TP.FORMATS:
        for bn in (256, 240):
            assert f"bs_twophase_dequant_{f}_t{bn}_pdl" in names
            for o in ("bf16", "f32"):
                assert f"bs_twophase_{f}_128x{bn}_k64_s4_{o}_st_pdl" in names


@pytest.mark.interp
def test_dispatch_with_pdl(monkeypatch):
    """BLOCKSCALE_SM90_TWOPHASE_PDL=1: the dispatch runs the pdl pair, same bytes."""
    ops = dense_operands("nvfp4", 130, 264, 96, 8)
    want = TP.block_scaled_matmul_twophase(*ops, device="interp")
    got, launched = dispatch_runs(monkeypatch, TP.ENV_PDL, "1", ops)
    assert [s.pdl for s in launched] == [True]
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.lower
@pytest.mark.parametrize("spec", [TP.TwophaseMatmulSpec("nvfp4", store="staged", bn=240,
                                                        pdl=True),
                                  TP.DequantSpec("nvfp4", tile=240, pdl=True)],
                         ids=lambda s: s.kernel_name)
def test_pdl_ptx_and_meta(spec):
    """The PTX instruction and its SASS (ACQBULK / PREEXIT); the kernel's meta
    carries ``programmatic_launch`` into the bundle (phase 2 only); no spills."""
    kernel = TP.kernel(spec)
    ptx, sass, meta = kernel.asm["ptx"], kernel.asm["sass"], kernel.binary.meta
    phase2 = isinstance(spec, TP.TwophaseMatmulSpec)
    want = "griddepcontrol.wait" if phase2 else "griddepcontrol.launch_dependents"
    assert len(re.findall(re.escape(want), ptx)) == 1
    assert "griddepcontrol" not in str(TP.kernel(
        TP.TwophaseMatmulSpec("nvfp4", store="staged", bn=240)).asm["ptx"])
    assert meta.get("programmatic_launch", False) is phase2
    assert meta["spill_stores"] == 0
    # ptxas 13: griddepcontrol.wait -> ACQBULK, launch_dependents -> PREEXIT
    assert len(re.findall(r"\bACQBULK\b" if phase2 else r"\bPREEXIT\b", sass)) == 1


def test_launch_config():
    """cuLaunchKernelEx's config: grid, block, shared bytes, stream and (programmatic) the
    PROGRAMMATIC_STREAM_SERIALIZATION attribute set to 1."""
    pytest.importorskip("cuda.bindings.driver")
    from cuda.bindings import driver as drv

    from blockscale.runtime import cuda as C

    c = C.launch_config((1536, 1, 1), (256, 1, 1), 188480, 0, programmatic=True)
    assert (c.gridDimX, c.gridDimY, c.gridDimZ) == (1536, 1, 1)
    assert (c.blockDimX, c.blockDimY, c.blockDimZ) == (256, 1, 1)
    assert c.sharedMemBytes == 188480 and c.numAttrs == 1
    attr = c.attrs[0]
    assert attr.id == drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1
    plain = C.launch_config((2, 3, 4), (128, 1, 1), 0, 0)
    assert plain.numAttrs == 0 and (plain.gridDimY, plain.gridDimZ) == (3, 4)
    assert C.PROGRAMMATIC_LAUNCH in TP.TwophaseMatmulSpec("nvfp4", pdl=True).launch_meta


@gpu_pair_grid
def test_gpu_pdl(shape, fmt, bn, out_dtype):
    """On the H200: phase 2 launched with programmatic stream serialization after B's
    triggering phase 1 writes the bytes of the pair without PDL (a missing or misplaced
    wait would read workspaces phase 1 is still writing)."""
    m, n, k = shape
    got, want = _pair(fmt, m, n, k, device="cuda", store="staged", bn=bn,
                      out_dtype=out_dtype)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
