"""The sm_90a tensor-core matmul kernels lower to SASS with the intended instructions.

HMMA.16816.F32.BF16 (FP4, bf16 operands) or HMMA.16816.F32 (MXFP8, f16 operands), PRMT
table-lookup dequantization, F2FP.F16.E4M3 conversions, 16-byte global loads, FFMA scale
folds, and no register spills (registers reported from ptxas via Kernel.meta).
"""

from __future__ import annotations

import re

import pytest

from blockscale.ops import matmul_epilogue as ep
from blockscale.ops import matmul_grouped_sm90, matmul_sm90

pytestmark = pytest.mark.lower


def _counts(sass: str) -> dict[str, int]:
    ops: dict[str, int] = {}
    for op in re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)",
                         sass, re.MULTILINE):
        ops[op] = ops.get(op, 0) + 1
    return ops


def _hmma(ops: dict[str, int], kind: str) -> int:
    return sum(v for k, v in ops.items() if k == kind)


@pytest.mark.parametrize("spec", matmul_sm90.bundle_specs("sm_90a")
                         + matmul_grouped_sm90.bundle_specs("sm_90a")
                         + [matmul_sm90.Sm90MatmulSpec("nvfp4", "float32",
                                                       ep.chain(ep.bias(), ep.relu()))],
                         ids=lambda s: s.kernel_name)
def test_kernel_sass(spec):
    kernel = (matmul_sm90.kernel if isinstance(spec, matmul_sm90.Sm90MatmulSpec)
              else matmul_grouped_sm90.kernel)(spec)
    meta, sass, ptx = kernel.meta, kernel.asm["sass"], kernel.asm["ptx"]
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    assert 0 < meta["registers"] <= 255
    ops = _counts(sass)
    n_mma = (spec.bm // 32) * (spec.bn // 16) * 4 * (spec.format.block_size // 16)
    if spec.format.is_fp4:
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
        assert _hmma(ops, "HMMA.16816.F32.BF16") == n_mma, ops
        assert ops.get("PRMT", 0) > 0
    else:
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
        assert "cvt.rn.f16x2.e4m3x2" in ptx
        assert _hmma(ops, "HMMA.16816.F32") == n_mma, ops
        assert ops.get("F2FP.F16.E4M3.UNPACK_B", 0) > 0, ops
    assert ops.get("LDG.E.128", 0) > 0 and ops.get("STS.128", 0) > 0  # 16-byte staging
    assert ops.get("FFMA", 0) >= n_mma // (spec.format.block_size // 16) * 4 // 2
    assert ops.get("BAR.SYNC.DEFER_BLOCKING", 0) >= 2


def test_report_registers(capsys):
    """Registers / spills / shared memory of the default specs (printed for the report)."""
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        for bm, bn in matmul_sm90.tiles_for(matmul_sm90.Format.from_name(fmt)):
            k = matmul_sm90.kernel(matmul_sm90.Sm90MatmulSpec(fmt, "bfloat16", None, bm, bn))
            with capsys.disabled():
                print(f"{k.name}: {k.meta['registers']} regs, spills "
                      f"{k.meta['spill_stores']}/{k.meta['spill_loads']}, "
                      f"{k.meta['static_shared_bytes']} B smem")
            assert k.meta["spill_stores"] == 0
