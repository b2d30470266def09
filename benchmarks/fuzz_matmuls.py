"""Fuzz cases of the tiled matmul ops for benchmarks/fuzz_gpu.py (issue #8).

Three ops, each case drawn from menus around tile and block boundaries (all random draws come
first, so a case stream depends only on the seed, never on what the kernels return):

* ``dense_matmul``: :func:`blockscale.ops.block_scaled_matmul` (on sm_90a the decode kernel
  for M <= 16, wgmma for NVFP4 / MXFP4 with K % 32 == 0, mma.sync for aligned K, the portable
  kernel otherwise); bf16 / f32 out, random alpha. f32 within the stated bound
  (``assert_f32_within_bound``), bf16 ``assert_bf16_consistent`` (tests/test_matmul_common.py).
* ``grouped_matmul``: :func:`blockscale.ops.grouped_matmul_block_scaled` (decode kernel for
  groups of <= 16 rows, the mma.sync tile scheduler, the portable kernel): empty groups, unused
  (-1) experts, random expert scales, NVFP4 ``a_row_scales`` sometimes; bf16 consistent with
  the exact value (``exact_grouped`` / ``make_grouped_case`` of tests/test_matmul_grouped.py).
* ``grouped_swiglu``: :func:`blockscale.ops.matmul_swiglu.grouped_matmul_swiglu` (SiLU /
  SwiGLU-OAI) byte-equal, data and scales, to the chained compiled path on the same device
  (grouped matmul, then ``fused_silu_quantize``), the op's contract on sm_90a; the chained
  matmul is checked against the exact value as above and the chained activation against
  ``reference.fused_silu_quantize`` of that matmul's output, byte for byte.

Shapes stay <= 300 x 300 x 1024 so the float64 reference costs milliseconds per case.
:func:`specs` records every kernel these cases launch (for the bundle).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

FMTS = ("nvfp4", "mxfp4", "mxfp8")
M_MENU = (1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257,
          300)
N_MENU = (1, 2, 8, 24, 40, 63, 64, 65, 72, 127, 128, 129, 136, 200, 255, 256, 300)
#: K % 32 == 0 (every tensor-core kernel), K % 16 == 0 only (MXFP8 mma.sync), other even K
#: (portable kernel); MXFP8 also takes odd K
K_ALIGNED = (32, 64, 96, 128, 160, 192, 256, 320, 512, 544, 1024)
K_16 = (16, 48, 80, 144, 208, 528)
K_OTHER = (2, 6, 14, 30, 34, 62, 66, 100, 250, 520, 1000)
ALPHAS = (1.0, 0.37, 12.0, -0.75, 2.0 ** -10)
#: group sizes: small ones (decode kernel when all are <= 16), tile tails
COUNTS_SMALL = (0, 1, 2, 3, 5, 8, 15, 16)
COUNTS_BIG = (0, 1, 16, 17, 31, 64, 65, 127, 128, 129, 200)
D_MENU = (2, 6, 8, 16, 24, 32, 40, 64, 72, 100, 128, 136, 150)

Result = tuple[bool, str, float]


# ----------------------------------------------------------------------------- draws


def _k(rng: np.random.Generator, fmt: str) -> int:
    kind = rng.choice(3, p=[0.55, 0.15, 0.3])
    k = int(rng.choice((K_ALIGNED, K_16, K_OTHER)[kind]))
    if fmt == "mxfp8" and rng.random() < 0.2:
        k += 1
    return k


def _counts(rng: np.random.Generator) -> list[int]:
    """1..6 group sizes, total <= 320: all small (decode kernel) or from the tile-tail menu."""
    g = int(rng.integers(1, 7))
    menu = COUNTS_SMALL if rng.random() < 0.35 else COUNTS_BIG
    counts = [int(c) for c in rng.choice(menu, g)]
    while sum(counts) > 320:
        counts[int(np.argmax(counts))] //= 2
    return counts


def _groups(rng: np.random.Generator, counts: list[int]) -> tuple[list[int], int]:
    """Distinct expert ids (not in slot order), ~20% unused (-1); the expert count."""
    e_count = len(counts) + int(rng.integers(0, 3))
    ids = [int(i) for i in rng.permutation(e_count)[:len(counts)]]
    ids = [-1 if rng.random() < 0.2 else i for i in ids]
    return ids, e_count


def _bytes(x: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x)).view(np.uint8)


def _check(name: str, fn: Callable[..., Any], *args: Any) -> str:
    """'' when the assertion helper passes, else its first line prefixed with ``name``."""
    try:
        fn(*args)
    except AssertionError as e:
        return f"{name}: {str(e).splitlines()[0][:200]}"
    return ""


def _same_bytes(name: str, got: Any, want: Any) -> str:
    g, w = _bytes(got), _bytes(want)
    if g.shape != w.shape:
        return f"{name}: shape {g.shape} != {w.shape}"
    diff = int((g != w).sum())
    return f"{name}: {diff} of {g.size} bytes differ" if diff else ""


def _ratio(got: Any, exact: np.ndarray, bound: np.ndarray) -> float:
    err = np.abs(np.asarray(got, np.float64) - exact)
    return float(np.max(err / bound)) if err.size else 0.0


# ----------------------------------------------------------------------------- cases


def case_dense(rng: np.random.Generator, device: Any, target: str | None = None,
               check: bool = True) -> Result:
    """One random ``block_scaled_matmul`` case (module docstring)."""
    from test_matmul_common import (
        assert_bf16_consistent,
        assert_f32_within_bound,
        exact_dense,
        f32_error_bound,
        random_dense_case,
    )

    from blockscale.formats import Format
    from blockscale.ops import matmul as MM

    fmt = Format.from_name(str(rng.choice(FMTS)))
    m, n, k = int(rng.choice(M_MENU)), int(rng.choice(N_MENU)), _k(rng, fmt.name)
    out_dtype = str(rng.choice(["bfloat16", "float32"]))
    alpha = float(rng.choice(ALPHAS))
    a, b, sfa, sfb, sfa5, sfb5 = random_dense_case(rng, fmt, m, n, k)
    got = MM.block_scaled_matmul(a, b, sfa5, sfb5, fmt, k=k, alpha=alpha, out_dtype=out_dtype,
                                 device=device, target=target)
    what = f"{fmt.name} M={m} N={n} K={k} {out_dtype} alpha={alpha}"
    if not check:
        return True, what, 0.0
    got = np.asarray(got)
    exact, abs_sum = exact_dense(a, b, sfa, sfb, fmt, k, alpha)
    bound = f32_error_bound(abs_sum, fmt, k, n_mul=1)
    if out_dtype == "float32":
        why = _check("f32", assert_f32_within_bound, got, exact, bound)
    else:
        why = _check("bf16", assert_bf16_consistent, got, exact, bound)
    ratio = _ratio(got, exact, bound) if out_dtype == "float32" else 0.0
    return not why, f"{what}: {why or 'ok'} err/bound {ratio:.3g}", ratio


def _grouped_inputs(rng: np.random.Generator, fmt: Any, n: int) -> dict[str, Any]:
    """A random grouped case (make_grouped_case) with expert / row scales drawn."""
    from test_matmul_grouped import make_grouped_case

    from blockscale.formats import NVFP4

    counts = _counts(rng)
    ids, e_count = _groups(rng, counts)
    k = _k(rng, fmt.name)
    case, row_scales, w_scales = make_grouped_case(rng, fmt, counts, ids, e_count, n, k)
    esc = rng.uniform(0.5, 2.0, e_count).astype(np.float32)
    if fmt is not NVFP4 and rng.random() < 0.3:
        esc = None  # MX: None means ones
    rows = None
    if fmt is NVFP4 and rng.random() < 0.4:
        rows = rng.uniform(0.5, 2.0, sum(counts)).astype(ml_dtypes.bfloat16)
    return {"case": case, "row_scales": row_scales, "w_scales": w_scales, "esc": esc,
            "rows": rows, "k": k, "counts": counts, "e_count": e_count,
            "what": f"{fmt.name} counts={counts} ids={ids} E={e_count} N={n} K={k} "
                    f"esc={'none' if esc is None else 'rand'} rows={rows is not None}"}


def _grouped_check(g: dict[str, Any], fmt: Any, out: Any) -> tuple[str, float]:
    """The bf16 grouped output against the exact value; (why or '', err / bound)."""
    from test_matmul_common import assert_bf16_consistent, f32_error_bound
    from test_matmul_grouped import exact_grouped

    esc = g["esc"] if g["esc"] is not None else np.ones(g["e_count"], np.float32)
    exact, abs_sum = exact_grouped(g["case"], g["row_scales"], g["w_scales"], fmt, g["k"], esc,
                                   g["rows"])
    bound = f32_error_bound(abs_sum, fmt, g["k"], n_mul=2 if g["rows"] is not None else 1)
    return _check("bf16", assert_bf16_consistent, np.asarray(out), exact, bound), 0.0


def case_grouped(rng: np.random.Generator, device: Any, target: str | None = None,
                 check: bool = True) -> Result:
    """One random ``grouped_matmul_block_scaled`` case (module docstring)."""
    from blockscale.formats import Format
    from blockscale.ops import matmul_grouped as MG

    fmt = Format.from_name(str(rng.choice(FMTS)))
    n = int(rng.choice(N_MENU))
    g = _grouped_inputs(rng, fmt, n)
    out = MG.grouped_matmul_block_scaled(**g["case"], expert_scales=g["esc"], fmt=fmt,
                                         k=g["k"], a_row_scales=g["rows"], device=device,
                                         target=target)
    if not check:
        return True, g["what"], 0.0
    why, _ = _grouped_check(g, fmt, out)
    return not why, f"{g['what']}: {why or 'ok'}", 0.0


def case_swiglu(rng: np.random.Generator, device: Any, target: str | None = None,
                check: bool = True) -> Result:
    """One random ``grouped_matmul_swiglu`` case: fused == chained byte for byte."""
    from blockscale import layouts
    from blockscale import reference as ref
    from blockscale.formats import NVFP4, Format
    from blockscale.ops import matmul_grouped as MG
    from blockscale.ops import matmul_swiglu as SW
    from blockscale.ops import quantize_silu as QS

    fmt = Format.from_name(str(rng.choice(FMTS)))
    d = int(rng.choice(D_MENU))
    act = str(rng.choice(["silu", "swiglu_oai"]))
    g = _grouped_inputs(rng, fmt, 2 * d)
    isc = rng.uniform(0.1, 2.0, g["e_count"]).astype(np.float32) if fmt is NVFP4 else None
    case = g["case"]
    grp = (case["expert_start"], case["a_scale_offsets"], case["expert_ids"])
    tiles = case["a_scales"].shape[0]
    w_sigma = ref.sigma_permute_rows(case["weight"])
    sfb_sigma = np.stack([layouts.interleave(ref.sigma_permute_rows(s)) for s in g["w_scales"]])
    data, scales = SW.grouped_matmul_swiglu(
        case["hidden"], w_sigma, case["a_scales"], sfb_sigma, *grp, g["esc"], isc, fmt,
        k=g["k"], activation=act, a_row_scales=g["rows"], device=device, target=target)
    gate_up = MG.grouped_matmul_block_scaled(**case, expert_scales=g["esc"], fmt=fmt, k=g["k"],
                                             a_row_scales=g["rows"], device=device,
                                             target=target)
    c_data, c_scales = QS.fused_silu_quantize(gate_up, fmt, *grp, isc, activation=act,
                                              num_scale_tiles=tiles, device=device,
                                              target=target)
    what = f"{act} D={d} {g['what']}"
    if not check:
        return True, what, 0.0
    gate_up = np.asarray(gate_up)
    r_data, r_scales = ref.fused_silu_quantize(gate_up, fmt, *grp, isc, activation=act,
                                               num_scale_tiles=tiles)
    whys = [_same_bytes("fused vs chained data", data, c_data),
            _same_bytes("fused vs chained scales", scales, c_scales),
            _same_bytes("chained activation vs reference data", c_data, r_data),
            _same_bytes("chained activation vs reference scales", c_scales, r_scales),
            _grouped_check(g, fmt, gate_up)[0]]
    why = "; ".join(w for w in whys if w)
    return not why, f"{what}: {why or 'ok'}", 0.0


OPS: dict[str, Callable[..., Result]] = {
    "dense_matmul": case_dense,
    "grouped_matmul": case_grouped,
    "grouped_swiglu": case_swiglu,
}


# ----------------------------------------------------------------------------- specs


def specs(target: str = "sm_90a", seeds: tuple[int, ...] = (0, 1, 2),
          cases: int = 1000) -> list[Any]:
    """Every kernel spec the case streams launch on ``target``: for each op and seed the
    first ``cases`` cases (fuzz_gpu's default runs 1000 of seed 0) run on the interpreter
    device with launches skipped and checks off, recording each spec asked for (~10 s).
    Other seeds draw from the same menus: 6000 cases of seeds 0-3 ask for the same 60
    specs as 1000 of seed 0 (sm_90a)."""
    from blockscale import runtime
    from blockscale.ops import _core

    seen: dict[Any, None] = {}
    original = _core.get_kernel

    def recording(spec: Any, build: Any = None) -> Any:
        seen.setdefault(spec, None)
        return original(spec, build)

    dev = runtime.get_device("interp")  # a shared instance: its launch is restored below
    dev.launch = lambda kernel, grid, args, stream=None: None  # outputs stay unchecked
    _core.get_kernel = recording
    try:
        for name, fn in OPS.items():
            for seed in seeds:
                rng = np.random.default_rng([seed, op_index(name)])
                for _ in range(cases):
                    fn(rng, dev, target, check=False)
    finally:
        _core.get_kernel = original
        del dev.launch  # the class's method again
    return list(seen)


def op_index(name: str) -> int:
    """The rng stream index fuzz_gpu uses for op ``name`` (its position in fuzz_gpu.OPS)."""
    from benchmarks import fuzz_gpu

    return list(fuzz_gpu.OPS).index(name)
