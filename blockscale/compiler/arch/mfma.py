"""AMD CDNA matrix-core (MFMA) helpers. Each docstring names the AMDGCN instruction emitted.

Every MFMA is a wavefront-wide instruction: all 64 lanes must execute it (no divergence).
Lane ``l`` of the wavefront is written ``l = 16 g + r`` (16x16 shapes) or ``l = 32 g + r``
(32x32 shapes). Operand layouts (A is M x K, B is K x N; B's "row" below is its column n,
so a K-major ``[N, K]`` B is loaded exactly like A):

``v_mfma_f32_16x16x16_bf16`` (CDNA3 and CDNA4; ``rocdl.mfma.f32.16x16x16bf16.1k``)
    A: lane (g, r) holds row r, k = 4 g + t in element t (t = 0..3) of a ``vector<4xi16>``
    of bf16 bits; B alike with column r. C/D ``vector<4xf32>``: element e is row 4 g + e,
    column r.

``v_mfma_scale_f32_16x16x128_f8f6f4`` (CDNA4 only; ``rocdl.mfma.scale.f32.16x16x128.f8f6f4``)
    D = (A * sA) (B * sB) + C with one E8M0 scale per 32 consecutive K of each row.
    Element formats per operand (``cbsz`` for A, ``blgp`` for B): 0 E4M3, 1 E5M2, 2 E2M3,
    3 E3M2, 4 E2M1. Register operands: ``vector<8xi32>`` (8-bit), ``<6xi32>`` (6-bit),
    ``<4xi32>`` (FP4).

    * FP4: lane (g, r) holds row r, k = 32 g + i in nibble i (nibble 2j = low nibble of
      byte j: the 16 contiguous bytes of the row's K-block g).
    * FP8: lane (g, r) holds row r, k = 64 (b // 16) + 16 g + b % 16 in byte b (b = 0..31):
      two 16-byte runs, K 16 g .. 16 g + 15 and 64 + 16 g .. 64 + 16 g + 15.
    * Scales: lane (g, r) supplies the scale of row r, K-block g (k in [32 g, 32 g + 32)) as
      byte ``opsel`` (0..3, an immediate: ``op_sel``/``op_sel_hi`` bits) of its 32-bit scale
      register; byte 0xFF is NaN.
    * C/D: as the bf16 16x16 MFMA.

``v_mfma_scale_f32_32x32x64_f8f6f4`` (CDNA4 only; ``rocdl.mfma.scale.f32.32x32x64.f8f6f4``)
    As above with lane (g, r) = (l // 32, l % 32): FP4 k = 32 g + i; FP8 k = 32 (b // 16) +
    16 g + b % 16; scale row r, K-block g; C/D ``vector<16xf32>``: element e is row
    8 (e // 4) + 4 g + e % 4, column r.

Sources (layouts restated, no code taken): LLVM's AMDGPU intrinsic definitions and
``llvm.amdgcn.mfma.scale.*`` codegen tests (operand order, immediates, op_sel encoding);
the register maps of composable_kernel's MX-MFMA op test (``load_mx_A_row_major``: FP8 /
FP4 K per lane and register, scale of row l % M, K-block l / M from lane l, tested there
with per-block scales); Modular's ``mxfp4_matmul_amd`` documentation (FP4 lanes, scale
slot (lane % 16, lane / 16)). AMD's aiter ``opus`` MXFP test packs FP8 16x16x128 in
8-byte stripes instead, but with one uniform scale, which does not tell the two apart (the
same K permutation of A and B leaves an unscaled dot product unchanged); the per-block
scaled CK test does. The numpy model of these instructions is
``blockscale/runtime/interpreter/ops_mfma.py``.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, rocdl

from blockscale.compiler.ir_types import _loc, f32, i32, vec

#: the ``cbsz`` / ``blgp`` element-format codes of the f8f6f4 MFMAs
FORMAT_CODES = {"e4m3": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}
#: 32-bit registers of an A/B operand per format code
OPERAND_REGS = {0: 8, 1: 8, 2: 6, 3: 6, 4: 4}


def _imm(v: int) -> ir.Value:
    return arith.constant(i32(), ir.IntegerAttr.get(i32(), v))


def _result(x: object) -> ir.Value:
    """The result Value of a generated op builder (some return the op, some the value)."""
    return x if isinstance(x, ir.Value) else x.result  # type: ignore[attr-defined]


def _check_format(name: str, fmt: str) -> int:
    if fmt not in FORMAT_CODES:
        raise ValueError(f"{name} must be one of {sorted(FORMAT_CODES)}, got {fmt!r}")
    return FORMAT_CODES[fmt]


def _check_opsel(name: str, v: int) -> int:
    if not isinstance(v, int) or not 0 <= v <= 3:
        raise ValueError(f"{name} must be an int in 0..3 (scale byte), got {v!r}")
    return v


def mfma_scale(shape: str, a: ir.Value, b: ir.Value, c: ir.Value, *, a_format: str,
               b_format: str, scale_a: ir.Value, scale_b: ir.Value, opsel_a: int = 0,
               opsel_b: int = 0, loc: ir.Location | None = None) -> ir.Value:
    """Block-scaled MFMA: ``v_mfma_scale_f32_16x16x128_f8f6f4`` (``shape`` "16x16x128",
    ``c`` ``vector<4xf32>``) or ``v_mfma_scale_f32_32x32x64_f8f6f4`` ("32x32x64",
    ``vector<16xf32>``). Lane layouts in the module docstring; wavefront-wide.

    ``a`` / ``b``: the operand registers (``vector<Nxi32>``, N from :data:`OPERAND_REGS`);
    ``scale_a`` / ``scale_b``: i32 registers whose byte ``opsel_a`` / ``opsel_b`` is the lane's
    E8M0 scale. Returns D (same type as ``c``).
    """
    ca, cb = _check_format("a_format", a_format), _check_format("b_format", b_format)
    sa, sb = _check_opsel("opsel_a", opsel_a), _check_opsel("opsel_b", opsel_b)
    if shape == "16x16x128":
        op, n = rocdl.mfma_scale_f32_16x16x128_f8f6f4, 4
    elif shape == "32x32x64":
        op, n = rocdl.mfma_scale_f32_32x32x64_f8f6f4, 16
    else:
        raise ValueError(f"shape must be '16x16x128' or '32x32x64', got {shape!r}")
    for name, v, code in (("a", a, ca), ("b", b, cb)):
        want = vec(OPERAND_REGS[code], i32())
        if v.type != want:
            raise TypeError(f"{name} must be {want} for format code {code}, got {v.type}")
    if c.type != vec(n, f32()):
        raise TypeError(f"c must be {vec(n, f32())}, got {c.type}")
    with _loc(loc):
        return _result(op(vec(n, f32()), [a, b, c, _imm(ca), _imm(cb), _imm(sa), scale_a,
                                          _imm(sb), scale_b]))


def mfma_bf16_16x16x16(a: ir.Value, b: ir.Value, c: ir.Value, *,
                       loc: ir.Location | None = None) -> ir.Value:
    """``v_mfma_f32_16x16x16_bf16`` (CDNA3/CDNA4, ``rocdl.mfma.f32.16x16x16bf16.1k``): D = A B
    + C with ``a``/``b`` ``vector<4xi16>`` of bf16 bits and ``c`` ``vector<4xf32>`` (layout in
    the module docstring; no broadcast: cbsz = abid = blgp = 0). Wavefront-wide."""
    from blockscale.compiler.ir_types import i16

    for name, v in (("a", a), ("b", b)):
        if v.type != vec(4, i16()):
            raise TypeError(f"{name} must be vector<4xi16> (bf16 bits), got {v.type}")
    if c.type != vec(4, f32()):
        raise TypeError(f"c must be vector<4xf32>, got {c.type}")
    with _loc(loc):
        return _result(rocdl.mfma_f32_16x16x16bf16_1k(vec(4, f32()), [a, b, c, _imm(0),
                                                                      _imm(0), _imm(0)]))


def fp4_pair_to_bf16_gfx950(word: ir.Value, byte_sel: int, *,
                            loc: ir.Location | None = None) -> ir.Value:
    """The two E2M1 codes of byte ``byte_sel`` (0..3) of i32 ``word`` (low nibble first) as
    ``vector<2xbf16>``, exact: ``v_cvt_scalef32_pk_bf16_fp4`` with scale 1.0 (CDNA4 only;
    MFMA operand preparation)."""
    from blockscale.compiler.ir_types import bf16

    _check_opsel("byte_sel", byte_sel)
    with _loc(loc):
        one = arith.constant(f32(), ir.FloatAttr.get(f32(), 1.0))
        return _result(rocdl.cvt_scalef32_pk_bf16_fp4(vec(2, bf16()), word, one, byte_sel))
