"""Two-phase sm_90a MXFP8 matmul: exact per-row folds to bf16, the bf16 wgmma GEMM of
:mod:`blockscale.ops.matmul_twophase`, the folds undone in the epilogue (issue #9).

Same contract as :func:`blockscale.ops.matmul.block_scaled_matmul` (SEMANTICS §4.1) for
MXFP8: ``a [M, K]``, ``b [N, K]`` float8_e4m3fn, 5-D E8M0 scales, fp32 accumulation, ``alpha``
once on the fp32 value, an optional fused :class:`~blockscale.ops.matmul_epilogue.Epilogue`
(it sees ``RN(alpha * acc)`` as in every kernel), bf16 (RNE) or f32 output; K % 32 == 0 and
K <= :data:`MAX_K`.

Why: E4M3 x 2^(e - 127) spans 2^-136 .. 1.75 x 2^135, beyond bf16 (2^-133 .. 2^128), and
Hopper's FP8 tensor-core accumulation is inexact. An E4M3 value has 4 significant bits, so
``e4m3 * 2^s`` is exact in bf16 wherever it lands in range; the kernels choose ``s`` per row.

Kernels (:mod:`blockscale.ops._twophase_mx8_ir`), five launches, no host synchronization:

1. fold (8 lanes per row of A and of B): ``F[r] = bmax - 127 - HEADROOM`` from the row's
   largest finite scale byte ``bmax``; flag[r] = 1 when a K-block holding a nonzero element
   (NaN codes count) has a scale more than :data:`WINDOW` binades below ``bmax``.
2. phase 1 for A, then B: ``w = bf16(e4m3 * 2^(b - 127 - F[r]))`` into the FP4 two-phase
   workspace layout (its thread mapping; zeros past the operand and K); scale 0xFF -> NaN.
3. phase 2: :class:`~blockscale.ops.matmul_twophase.TwophaseMatmulSpec` with fmt "nvfp4"
   (no scale fix), ``alpha`` = ``m_alpha`` where ``alpha = m_alpha 2^e_alpha``, ``|m_alpha|``
   in [1, 2), and the epilogue ``fold_undo`` then the user epilogue: ``fold_undo``
   multiplies by ``2^(Fa[m] + Fb[n] + e_alpha)`` (exact power-of-two steps, below), its
   fold exponents loaded once per row / column of a thread (:class:`_FoldHoist`; a
   warp-uniform fast loop of one add and one multiply per element where every G is near).
4. fixup: the outputs of flagged rows (rows of C for A, columns for B) recomputed by the
   portable kernel's K loop, alpha, epilogue and cast (grid.y of 8 CTAs share a flagged
   row's outputs); a CTA with no flagged row exits after one load, a warp OR and a barrier.

Exactness (unflagged rows; HEADROOM = 42, WINDOW = 80, K <= 2^24): every nonzero ``|w|`` is a
multiple of 2^(-9 + 42 - 80) = 2^-47 in [2^-47, 448 * 2^42 < 2^51] (4 significant bits: exact
bf16), so every nonzero product ``wa wb`` is an exact fp32 normal, a multiple of 2^-94, and
``sum |wa wb| <= K 448^2 2^84 < 2^126``: no overflow, and a nonzero accumulator (any fp32
rounding of sums of multiples of 2^-94 stays one) is >= 2^-94, so ``y = RN(acc * m_alpha)``
is a normal f32 below 2^127. ``fold_undo`` multiplies ``y`` by ``2^G``, ``G = Fa + Fb +
e_alpha``: once where G is in [-126, 127] (one IEEE multiply: correctly rounded), else in
three steps of one sign (the partial products lie between ``y`` and the result: exact while
the result is normal). So ``out = RN(acc * m_alpha * 2^G)``, the single rounding of alpha:
the value every other kernel's ``RN(acc * alpha)`` gives for the same fp32 accumulator (the
accumulation order is the bf16 wgmma's: the two-phase FP4 kernels' error bound). Only
results below the normal range on the three-step path may round twice (subnormal outputs
are outside the bound of tests/test_matmul_common.py for every kernel). Rows whose scales
span more than the window (only with nonzero data there; all-zero blocks, e.g. a
quantizer's 0x00 blocks, do not count) are never answered by the bf16 GEMM: the fixup
overwrites their outputs with the portable kernel's bytes. A NaN scale byte (0xFF) or a NaN
element makes the dot product NaN (both paths); where the exact value overflows f32 the
result is +-inf (the portable kernel's block sum may meet +inf and -inf there: NaN).

Dispatch (:func:`fast_path`, in ``matmul.FAST_PATHS`` before the wgmma / mma.sync kernels):
sm_90a, MXFP8, K % 32 == 0, K <= :data:`DISPATCH_MAX_K` (accuracy), M >= :data:`MIN_M`,
workspaces within :data:`MAX_WORKSPACE_BYTES`, unless ``BLOCKSCALE_SM90_TWOPHASE_MX8=0``
(default on: run U on the H200, 8192x5760x2944 0.552 ms vs mma.sync 1.623, M=1024 0.124 vs
0.224; at M=256 it was slower, 0.076 vs 0.073, hence :data:`MIN_M` = 512). Importing this
module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import MXFP8, Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import _staged_store_ir as S
from blockscale.ops import matmul as _matmul
from blockscale.ops import matmul_twophase as TP
from blockscale.ops.matmul_epilogue import Epilogue, EpilogueInput

#: modules whose source shapes the kernels (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._twophase_mx8_ir", "blockscale.ops._twophase_ir",
                  "blockscale.ops._mx8_window_ir",
                  "blockscale.ops._matmul_ir", "blockscale.ops.matmul_epilogue")
TARGETS = ("sm_90a",)
#: = _twophase_mx8_ir.HEADROOM, WINDOW, THREADS, FOLD_LANES, FIXUP_SPLIT, FOLD_A, FOLD_B
HEADROOM, WINDOW, THREADS, FOLD_LANES, FIXUP_SPLIT = 42, 80, 256, 8, 8
FOLD_A, FOLD_B = "mx8_fold_a", "mx8_fold_b"
#: the largest K (the overflow bound of the module docstring)
MAX_K = 1 << 24
#: the largest K the DISPATCH runs this pair for: the bf16 wgmma's fp32 accumulation error
#: grows with K, and with E4M3's 4 significant bits (FP4: 2) the products fill more of the
#: accumulator: run AC (H200) measured a float32 output's normwise relative error of 1.26e-5
#: at 777x2560x8192 (the elementwise fp32 bound held), above issue #9's 1e-5; K <= 2944 passes
#: every GPU test. 4096 is that measurement scaled linearly in K (~6e-6); run AD (H200) passed
#: the GPU tests at 777x2560x4096. Above it the mma.sync kernel runs (direct calls: any K)
DISPATCH_MAX_K = 4096
#: the dispatch runs the kernels from this M on, while their workspaces take at most
#: MAX_WORKSPACE_BYTES (= the FP4 pair's; literals here: matmul_twophase may be mid-import).
#: Run U (H200, N=5760, K=2944): M=256 0.076 ms vs mma.sync 0.073 (slower), M=1024 0.124 vs
#: 0.224, M=8192 0.552 vs 1.623
MIN_M = 512
MAX_WORKSPACE_BYTES = 1 << 30
#: BLOCKSCALE_SM90_TWOPHASE_MX8=0 turns the dispatch to these kernels off (default on)
ENV_SWITCH = "BLOCKSCALE_SM90_TWOPHASE_MX8"

#: their digest is in the fold epilogue's key, so any edit of them renames the phase-2 kernels
#: (``_ep<key>``) even where the IR is unchanged: pin _IR_DIGEST to compare IR across edits
_SOURCES = ("_twophase_mx8_ir.py", "_staged_store_ir.py", "matmul_sm90.py")
_IR_DIGEST = hashlib.sha256(b"".join(
    p.read_bytes() if p.exists() else b"missing"
    for p in (Path(__file__).with_name(f) for f in _SOURCES))).hexdigest()[:16]


class _FoldHoist:
    """The fold epilogue's per-thread form (``_staged_store_ir.hoisted``): the fold exponents
    loaded once per row / column of a thread's fragment, then ``then`` (the user epilogue).
    ``_IR``: the :mod:`blockscale.ops._twophase_mx8_ir` functions of its row state, column
    state and element step."""

    _IR = ("fold_row", "fold_col", "fold_undo_hoisted")

    def __init__(self, then: Epilogue | None) -> None:
        self.then = then
        self.loads_in_apply = bool(then is not None and then.inputs)

    @classmethod
    def _ir(cls, i: int) -> Any:
        from blockscale.ops import _twophase_mx8_ir as MX
        return getattr(MX, cls._IR[i])

    def row(self, buffers: dict, m: Any, m_count: Any) -> Any:
        return self._ir(0)(buffers, m, m_count)

    def col(self, buffers: dict, n: Any, n_count: Any) -> Any:
        return self._ir(1)(buffers, n, n_count)

    def apply(self, value: Any, row: Any, col: Any, ctx: Any) -> Any:
        value = self._ir(2)(value, row, col)
        return value if self.then is None else self.then.fn(value, ctx)

    def fast(self, buffers: dict, rows: list, m_count: Any, n0: Any, n_count: Any,
             bn: int) -> tuple[Any, Any]:
        """Where every ``G`` of the warp's rows and the tile's columns is in [-126, 127]:
        :class:`_FoldHoistFast` (one add and one multiply per element, no branch)."""
        from blockscale.ops import _twophase_mx8_ir as MX
        return (MX.fold_fast_cond(buffers, rows, m_count, n0, n_count, bn),
                _FoldHoistFast(self.then))


class _FoldHoistFast(_FoldHoist):
    """:class:`_FoldHoist` under its ``fast`` condition: the states are the exponent fields
    (``(fa + 127) << 23``, ``fb << 23``), their sum is ``2^G``'s bits."""

    _IR = ("fold_row_fast", "fold_col_fast", "fold_undo_fast")
    fast = None  # type: ignore[assignment]


def _fold_epilogue(then: Epilogue | None = None, hoist: bool = True) -> Epilogue:
    """The epilogue undoing the folds (:func:`blockscale.ops._twophase_mx8_ir.fold_undo`),
    then ``then``; with ``hoist`` the store loops use its hoisted form (:class:`_FoldHoist`;
    without: two loads per element, round 1's epilogue, kept for the tests). Its key carries
    the digest of the IR files, so phase 2's kernel key follows them."""
    digest = _IR_DIGEST if hoist else _IR_DIGEST + "-per-element"

    def fold_undo(value: Any, ctx: Any) -> Any:
        from blockscale.ops import _twophase_mx8_ir as MX

        assert digest  # in the closure: part of the epilogue key
        value = MX.fold_undo(value, ctx)
        return value if then is None else then.fn(value, ctx)

    if hoist:
        fold_undo.hoist = _FoldHoist(then)  # type: ignore[attr-defined]
    inputs = (EpilogueInput(FOLD_A, "float32", "row"), EpilogueInput(FOLD_B, "float32", "col"))
    if then is None:
        return Epilogue(fold_undo, inputs, name="mx8_fold")
    return Epilogue(fold_undo, inputs + tuple(then.inputs), name=f"mx8_fold+{then.key}")


FOLD_EPILOGUE = _fold_epilogue()


def _target(target: str) -> str:
    t = H.target_name(target)
    H.check_choice(t, TARGETS, "target")
    return t


@dataclasses.dataclass(frozen=True)
class FoldSpec(FormatSpec):
    """The fold exponents and flags of every row of A and B (:data:`FOLD_LANES` threads a
    row)."""

    fmt: str = "mxfp8"
    target: str = "sm_90a"

    op: ClassVar[str] = "block_scaled_matmul_twophase_mx8_fold"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        H.check_choice(self.fmt, ("mxfp8",), "fmt")
        object.__setattr__(self, "target", _target(self.target))

    @property
    def kernel_name(self) -> str:
        return "bs_twophase_mx8_fold"

    def args(self) -> tuple[KernelArg, ...]:
        """a, b, sfa, sfb, fold_a / fold_b (f32 out), flags (i32 out: A rows, B rows), m, n,
        k, shift (B's folds carry alpha's exponent)."""
        return (KernelArg("a", "buffer", "float8_e4m3fn"),
                KernelArg("b", "buffer", "float8_e4m3fn"),
                KernelArg("sfa", "buffer", "float8_e8m0fnu"),
                KernelArg("sfb", "buffer", "float8_e8m0fnu"),
                KernelArg("fold_a", "buffer", "float32", "out"),
                KernelArg("fold_b", "buffer", "float32", "out"),
                KernelArg("flags", "buffer", "int32", "out"),
                *(KernelArg(s, "scalar", "i32") for s in ("m", "n", "k", "shift")))


@dataclasses.dataclass(frozen=True)
class DequantSpec(FormatSpec):
    """Phase 1 for one operand: E4M3 rows + 5-D scales + fold exponents -> the bf16
    workspace for phase-2 tiles of ``tile`` rows (``matmul_twophase.TILES``)."""

    fmt: str = "mxfp8"
    target: str = "sm_90a"
    tile: int = 128

    op: ClassVar[str] = "block_scaled_matmul_twophase_mx8_dequant"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        H.check_choice(self.fmt, ("mxfp8",), "fmt")
        object.__setattr__(self, "target", _target(self.target))
        H.check_choice(self.tile, TP.TILES, "tile")

    @property
    def kernel_name(self) -> str:
        return f"bs_twophase_mx8_dequant_t{self.tile}"

    def args(self) -> tuple[KernelArg, ...]:
        """x, sfx, fold (f32), ws (bytes out), rows, rows_pad, k, shift."""
        return (KernelArg("x", "buffer", "float8_e4m3fn"),
                KernelArg("sfx", "buffer", "float8_e8m0fnu"),
                KernelArg("fold", "buffer", "float32"),
                KernelArg("ws", "buffer", "uint8", "out"),
                *(KernelArg(s, "scalar", "i32") for s in ("rows", "rows_pad", "k", "shift")))


@dataclasses.dataclass(frozen=True)
class FixupSpec(FormatSpec):
    """The exact recomputation of flagged rows' outputs (portable K loop, alpha, epilogue,
    cast), in place in ``c``."""

    fmt: str = "mxfp8"
    out_dtype: str = "bfloat16"
    epilogue: Epilogue | None = None
    target: str = "sm_90a"

    op: ClassVar[str] = "block_scaled_matmul_twophase_mx8_fixup"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        H.check_choice(self.fmt, ("mxfp8",), "fmt")
        _matmul.check_spec_fields(self)
        object.__setattr__(self, "target", _target(self.target))

    @property
    def kernel_name(self) -> str:
        ep = f"_ep{self.epilogue.key[:10]}" if self.epilogue else ""
        return f"bs_twophase_mx8_fixup_{H.out_tag(self.out_dtype)}{ep}"

    def args(self) -> tuple[KernelArg, ...]:
        """a, b, sfa, sfb, flags, c (in/out), epilogue inputs, m, n, k, alpha."""
        base = _matmul.MatmulSpec("mxfp8", self.out_dtype, "tcgen5d", self.epilogue,
                                  self.target).args()
        out = []
        for a in base:
            if a.name == "c":
                out += [KernelArg("flags", "buffer", "int32"),
                        KernelArg("c", "buffer", self.out_dtype, "inout")]
            else:
                out.append(a)
        return tuple(out)


def rows_grid(m: int, n: int, lanes: int = 1, split: int = 1) -> tuple[int, int, int]:
    """The fold (``lanes`` = :data:`FOLD_LANES`) and fixup (grid.y: ``split`` =
    :data:`FIXUP_SPLIT`) kernels: ``lanes`` threads per row of A and of B."""
    return (max(1, -(-(m + n) * lanes // THREADS)), split, 1)


def phase2_spec(out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                target: str = "sm_90a", hoist: bool = True, **fields: Any) -> Any:
    """Phase 2: the FP4 pair's bf16 GEMM spec with fmt "nvfp4" (no scale fix) and the fold
    epilogue before ``epilogue`` (``hoist``: its per-thread form, see :func:`_fold_epilogue`);
    ``fields``: more TwophaseMatmulSpec fields (kstep, stages, bm, store, bn, ...)."""
    if epilogue is None:
        ep = FOLD_EPILOGUE if hoist else _fold_epilogue(None, hoist=False)
    else:
        ep = _fold_epilogue(epilogue, hoist)
    return TP.TwophaseMatmulSpec("nvfp4", out_dtype, ep, target, **fields)


def build(spec: FoldSpec | DequantSpec | FixupSpec) -> Any:
    """The ``mlir.ir.Module`` of a fold, phase-1 or fixup kernel (IR only; phase 2 is built
    by :func:`blockscale.ops.matmul_twophase.build`)."""
    from mlir.dialects import arith

    import blockscale.ops._matmul_ir as mir
    import blockscale.ops._twophase_mx8_ir as MX
    from blockscale.compiler import ir as bir
    from blockscale.ops.matmul_epilogue import EpilogueContext

    if (MX.HEADROOM, MX.WINDOW, MX.THREADS, MX.FOLD_LANES, MX.FIXUP_SPLIT, MX.FOLD_A,
            MX.FOLD_B) != (HEADROOM, WINDOW, THREADS, FOLD_LANES, FIXUP_SPLIT, FOLD_A, FOLD_B):
        raise AssertionError("matmul_twophase_mx8's constants disagree with its IR module's")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        if isinstance(spec, FoldSpec):
            m, n, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
            MX.emit_fold(kb, m, n, k, kb.arg("shift"))
        elif isinstance(spec, DequantSpec):
            rows, rows_pad, k = (bir.as_index(kb.arg(x)) for x in ("rows", "rows_pad", "k"))
            MX.emit_dequant(kb.arg("x"), kb.arg("sfx"), kb.arg("fold"), kb.arg("ws"), rows,
                            rows_pad, k, kb.arg("shift"), spec.tile)
        else:
            m, n, k = (bir.as_index(kb.arg(x)) for x in ("m", "n", "k"))
            out_type = bir.bf16() if spec.out_dtype == "bfloat16" else bir.f32()
            ep = spec.epilogue
            buffers = {i.name: (i, kb.arg(i.name)) for i in ep.inputs} if ep else {}

            def finish(acc: Any, row: Any, col: Any) -> None:  # the portable kernel's tail
                value = arith.mulf(acc, kb.arg("alpha"))
                if ep is not None:
                    value = ep.fn(value, EpilogueContext(row, col, n, out_type, buffers))
                mir.store_output(value, kb.arg("c"), bir.add(bir.mul(row, n), col),
                                 spec.out_dtype)

            MX.emit_fixup(kb, kb.arg("flags"), m, n, k, finish)
    return kb.module


# ---- host side -------------------------------------------------------------------------------


def split_alpha(alpha: float) -> tuple[float, int]:
    """``(m, e)`` with ``alpha = m * 2^e`` exactly, ``|m|`` in [1, 2) (0 -> (alpha, 0))."""
    if alpha == 0.0:
        return alpha, 0
    frac, exp = math.frexp(alpha)
    return 2.0 * frac, exp - 1


def _check_k(k: int) -> None:
    if k % 32 or not 0 < k <= MAX_K:
        raise ValueError(f"the two-phase MXFP8 kernels take k % 32 == 0 and 0 < k <= {MAX_K}, "
                         f"got k={k}")


def _check_epilogue(epilogue: Epilogue | None) -> None:
    names = {i.name for i in epilogue.inputs} if epilogue else set()
    if names & {FOLD_A, FOLD_B}:
        raise ValueError(f"epilogue input names {sorted(names & {FOLD_A, FOLD_B})} are "
                         f"reserved by the two-phase MXFP8 kernels")


def _run(d: Any, a: Any, b: Any, sfa: Any, sfb: Any, alpha: float, out_dtype: str,
         epilogue: Epilogue | None, extra: dict[str, Any], dev: Any, tgt: str,
         fields: dict[str, Any]) -> Any:
    """The five launches on validated operands ``d``; ``fields``: phase-2 spec fields."""
    alpha = H.finite_f32(alpha, "alpha")
    H.check_epilogue_inputs(epilogue.inputs if epilogue else (), extra, d.m, d.n)
    spec = phase2_spec(out_dtype, epilogue, tgt, **fields)
    S.check_store(spec.store, spec.out_dtype, d.n)
    ops = {"a": a, "b": b, "sfa": sfa, "sfb": sfb}
    if d.m == 0 or d.n == 0:
        return H.launch(spec, (1, 1, 1), (d.m, d.n), out_dtype, {**ops, **extra}, {}, dev,
                        empty=True)
    host = all(isinstance(v, np.ndarray) for v in (*ops.values(), *extra.values()))
    if host:  # keep every intermediate on the device
        ops = {n: dev.to_device(np.ascontiguousarray(v)) for n, v in ops.items()}
        extra = {n: dev.to_device(np.ascontiguousarray(v)) for n, v in extra.items()}
    m_alpha, e_alpha = split_alpha(alpha)
    m, n, k = d.m, d.n, d.k
    _, f = _core.launch_op(FoldSpec("mxfp8", tgt), rows_grid(m, n, FOLD_LANES),
                           (("fold_a", (m,), np.dtype(np.float32)),
                            ("fold_b", (n,), np.dtype(np.float32)),
                            ("flags", (m + n,), np.dtype(np.int32))),
                           ops, {"m": m, "n": n, "k": k, "shift": e_alpha}, dev)
    ws = {}
    for name, x, sfx, fold, rows, tile, shift in (
            ("wa", ops["a"], ops["sfa"], f["fold_a"], m, spec.bm, 0),
            ("wb", ops["b"], ops["sfb"], f["fold_b"], n, spec.bn, e_alpha)):
        rows_pad = TP.padded(rows, tile)
        _, out = _core.launch_op(
            DequantSpec("mxfp8", tgt, tile), TP.dequant_grid(rows_pad, k),
            (("ws", (2 * rows_pad * TP.k_padded(k),), np.dtype(np.uint8)),),
            {"x": x, "sfx": sfx, "fold": fold},
            {"rows": rows, "rows_pad": rows_pad, "k": k, "shift": shift}, dev)
        ws[name] = out["ws"]
    c = H.launch(spec, TP.grid(m, n, spec.bm, bn=spec.bn), (m, n), out_dtype,
                 {**ws, FOLD_A: f["fold_a"], FOLD_B: f["fold_b"], **extra},
                 {"m": m, "n": n, "k": k, "alpha": m_alpha}, dev)
    H.launch_inplace(FixupSpec("mxfp8", out_dtype, epilogue, tgt),
                     rows_grid(m, n, split=FIXUP_SPLIT),
                     {**ops, "flags": f["flags"], "c": c, **extra},
                     {"m": m, "n": n, "k": k, "alpha": alpha}, dev)
    return dev.to_host(c) if host else c


def block_scaled_matmul_twophase_mx8(a: Any, b: Any, sfa: Any, sfb: Any, *,
                                     k: int | None = None, alpha: float = 1.0,
                                     out_dtype: str = "bfloat16",
                                     epilogue: Epilogue | None = None,
                                     epilogue_inputs: dict[str, Any] | None = None,
                                     bm: int = 128, bn: int = 256, store: str = "direct",
                                     kstep: int | None = None, stages: int | None = None,
                                     device: Any = None) -> Any:
    """The MXFP8 two-phase kernels called directly (no dispatch), e.g. by tests and
    benchmarks: ``a [M, K]``, ``b [N, K]`` float8_e4m3fn, 5-D E8M0 ``sfa`` / ``sfb``, the
    contract of :func:`blockscale.ops.matmul.block_scaled_matmul_with_epilogue`; phase 2's
    tile ``bm`` x ``bn``, ``store``, ``kstep`` and ``stages`` as in
    :class:`~blockscale.ops.matmul_twophase.TwophaseMatmulSpec`. ValueError for K % 32 != 0
    or K > :data:`MAX_K`, or an epilogue input named ``mx8_fold_a`` / ``mx8_fold_b``."""
    d = _matmul._validate(a, b, sfa, sfb, MXFP8, k, "tcgen5d")
    H.require_aligned(a=a, b=b, sfa=sfa, sfb=sfb)  # no portable fallback here
    _check_k(d.k)
    _check_epilogue(epilogue)
    dev, tgt = H.device_and_target(device, "sm_90a")
    return _run(d, a, b, sfa, sfb, alpha, out_dtype, epilogue, dict(epilogue_inputs or {}),
                dev, tgt, {"bm": bm, "bn": bn, "store": store, "kstep": kstep,
                           "stages": stages})


def _dispatch_bn(m: int, n: int, device: Any) -> int:
    """Phase 2's tile width as the FP4 pair's dispatch chooses it."""
    return TP.dispatch_bn(m, n, device, "sm_90a")


def enabled() -> bool:
    """False when BLOCKSCALE_SM90_TWOPHASE_MX8=0 (default on: faster from M = :data:`MIN_M`
    on the H200, see there)."""
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off")


def dispatch_specs(m: int, n: int, out_dtype: str = "bfloat16", epilogue: Epilogue | None = None,
                   device: Any = None, target: str = "sm_90a") -> list[Any]:
    """The five kernels' specs the dispatch launches for an M x N output (fold, phase 1 of
    A and of B, phase 2, fixup); ``device``: the device whose SM count picks phase 2's tile
    width (see :func:`_dispatch_bn`)."""
    p2 = phase2_spec(out_dtype, epilogue, target, store=S.dispatch_store(out_dtype, n),
                     bn=_dispatch_bn(m, n, device))
    return [FoldSpec("mxfp8", target), DequantSpec("mxfp8", target, p2.bm),
            DequantSpec("mxfp8", target, p2.bn), p2,
            FixupSpec("mxfp8", out_dtype, epilogue, target)]


def fast_path(target: str, fmt: Format, m: int, n: int, k: int, out_dtype: str,
              epilogue: Epilogue | None) -> Any:
    """The :data:`blockscale.ops.matmul.FAST_PATHS` hook: a runner of the five launches for
    sm_90a MXFP8 with K % 32 == 0, K <= :data:`DISPATCH_MAX_K`, M >= :data:`MIN_M`,
    workspaces within :data:`MAX_WORKSPACE_BYTES`, when :func:`enabled`; else None. Phase 2
    as the FP4 pair's dispatch: staged stores where rows of C are 16-byte aligned, its tile
    width choice."""
    if (target not in TARGETS or fmt.name != "mxfp8" or k % 32 or k > DISPATCH_MAX_K or m < MIN_M
            or n == 0 or not enabled() or TP.workspace_bytes(m, n, k) > MAX_WORKSPACE_BYTES):
        return None
    names = {i.name for i in epilogue.inputs} if epilogue else set()
    if names & {FOLD_A, FOLD_B}:
        return None
    dims = _matmul._Dense(fmt, m, n, k)

    def run(a: Any, b: Any, sfa: Any, sfb: Any, alpha: float, extra: dict[str, Any],
            device: Any) -> Any:
        fields = {"store": S.dispatch_store(out_dtype, n), "bn": _dispatch_bn(m, n, device)}
        return _run(dims, a, b, sfa, sfb, alpha, out_dtype, epilogue, extra, device, target,
                    fields)
    return run


def kernel(spec: FoldSpec | DequantSpec | FixupSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


#: (M, N, K) of the GPU tests and the benchmark
GPU_SHAPES = ((8192, 5760, 2944), (512, 5760, 2944), (1024, 5760, 2944), (777, 2560, 4096))


def bundle_specs(target: str = "sm_90a") -> list[Any]:
    """The fold and fixup kernels (bf16 / f32 out), phase 1 for every workspace tile, and
    phase 2 (fold epilogue) for the dispatch's choices: 128 x {256, 240, 224}, direct and
    staged stores, bf16 / f32 out, plus round 1's per-element epilogue (bf16, staged: the
    benchmark's comparison); none off sm_90a."""
    if target not in TARGETS:
        return []
    specs: list[Any] = [FoldSpec("mxfp8", target)]
    specs += [DequantSpec("mxfp8", target, t) for t in TP.TILES]
    specs += [FixupSpec("mxfp8", o, None, target) for o in _matmul.OUT_DTYPES]
    bns = TP.WAVE_BNS
    specs += [phase2_spec(o, None, target, store=st, bn=bn) for o in _matmul.OUT_DTYPES
              for st in TP.STORES for bn in bns]
    # round 1's per-element fold epilogue, for benchmarks/bench_mx8.py's comparison row
    specs += [phase2_spec("bfloat16", None, target, hoist=False, store="staged", bn=bn)
              for bn in bns]
    return sorted(specs, key=lambda s: s.kernel_name)


H.register_before(_matmul.FAST_PATHS, fast_path, "blockscale.ops.matmul_wgmma")
_core.attach_kernel_api((block_scaled_matmul_twophase_mx8,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "DequantSpec",
    "FixupSpec",
    "FoldSpec",
    "block_scaled_matmul_twophase_mx8",
    "build",
    "bundle_specs",
    "dispatch_specs",
    "fast_path",
    "kernel",
    "phase2_spec",
    "split_alpha",
]
