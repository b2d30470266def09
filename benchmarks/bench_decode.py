"""Decode (few rows) block-scaled matmul variants on the GPU, one run: simt, mma, mma2,
mma_p, mma_p5, mma_psk (split-K rows name their split count: ``S=3``), mma_c, mma_c8, mma_c85,
mma_c86 (conflict-free staging; 8-row passes; 5 / 6 CTAs per SM), mma_c8t (mma_c8, last K step
peeled), mma_c8s2 / mma_c8s4 (mma_c8t over 2 / 4 column slices per CTA), mma_c8d2 (two steps
in flight), mma_c8w (grouped: persistent CTAs walking work units), mma_c8r / mma_c8r4 (the
same with the weights through a 3 / 4-stage TMA ring; rows of the persistent variants name
their CTA cap, ``P=auto``: one wave, one row per ``--stream-ctas`` entry), mma_shot /
mma_shot7k / mma_shot16 / mma_shot32 / mma_shot6 (16 columns a CTA, 32 for mma_shot32, its
whole weight slice in flight at once by cp.async.bulk; K <= 3072 (7168 for mma_shot7k), passes
of 8 rows (16 for mma_shot16), 4 warps (6 / 8 for mma_shot6 / mma_shot7k, mma_shot32); mma_shot1
is mma_shot with one copy per whole row: rows past a variant's K limit are skipped, not
failed).

1. MoE gate_up of gpt-oss-120b (E=128, top-4, K=2880, N=5760) and DeepSeek-V3 (E=256, top-8,
   K=7168, N=4096) at T in {1, 16, 128} tokens (uniform random routing, every group <= 16
   rows), NVFP4 and MXFP4, each decode variant called directly
   (``matmul_decode.grouped_matmul_decode(..., variant=v)``).
2. Dense M in {1, 16} at (N, K) = (5760, 2880) and (4096, 7168), both variants, beside torch's
   bf16 ``x @ w.T`` (cuBLAS) when torch is there. Both rotate weight sets whose bytes exceed
   the L2 (one 8 MB FP4 or 34 MB bf16 matrix would stay resident: session 6 found the
   earlier rows L2-hot), and ours replays the recorded launches of one call per set (host
   validation / allocation outside the number, as in the grouped rows).

Each timed call is first checked on sampled rows against the float64 product of the
dequantized operands (benchmarks/bench_moe.check_grouped_matmul / common.check_rows). Rates
count the active experts' weight and scale bytes (what the kernel must read) and are given
as a percentage of the measured D2D copy bandwidth.

Order: the dense rows, then gpt-oss-120b, then DeepSeek-V3 (the slow simt T=128 rows last);
``--budget-s`` (default 90) stops cleanly before a case once the run has taken that long,
printing what ran and what was skipped; ``--variants`` picks the decode variants.

Usage: ``python benchmarks/bench_decode.py [--quick] [--budget-s 90] [--variants mma,mma_p]
[--split-ctas 1056,2112,1056:1] [--stream-ctas 528,396]`` (one mma_psk row per split setting,
one mma_c8w row per CTA cap)
(needs the bundle: ``make gpu-bundle``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.bench_moe import (
    GATE_UP,
    check_grouped_matmul,
    grouped_activation_scales,
    make_weights,
    route,
    sample_rows,
)
from benchmarks.common import (
    bundle_device,
    check_rows,
    random_data,
    random_scales,
    record_launches,
    replay,
    rotation_count,
    short_error,
    time_ms,
)

VARIANTS = ("simt", "mma", "mma2", "mma_p", "mma_p5", "mma_psk", "mma_c", "mma_c8", "mma_c85",
            "mma_c86", "mma_c8t", "mma_c8s2", "mma_c8s4",
            "mma_c8d2", "mma_c8w", "mma_c8r", "mma_c8r4", "mma_shot", "mma_shot7k",
            "mma_shot16", "mma_shot32", "mma_shot6", "mma_shot1", "mma_leanb_t8_n4",
            "mma_leanb_t8_n6", "mma_leanb_t16_n4", "mma_leanb_t16_n6")
T_VALUES = (1, 16, 128)
DENSE = ((5760, 2880), (4096, 7168))
#: variants bundled for the grouped (MoE) kernels only
GROUPED_ONLY = ("mma_p5", "mma_c85", "mma_c86", "mma_c8w", "mma_c8r", "mma_c8r4")
#: the persistent variants' CTA caps (matmul_decode.STREAM_CTAS; 0: None, one wave) run by
#: default: one row each
STREAM_CTAS = (0,)


class Budget:
    """Wall-clock budget of a run: :meth:`over` is True (and says so once) past ``seconds``."""

    def __init__(self, seconds: float | None):
        self.seconds, self.t0, self.skipped = seconds, time.monotonic(), 0

    def over(self, what: str) -> bool:
        if self.seconds is None or time.monotonic() - self.t0 < self.seconds:
            return False
        if not self.skipped:
            print(f"  budget of {self.seconds:.0f} s reached after "
                  f"{time.monotonic() - self.t0:.0f} s: skipping the rest", flush=True)
        self.skipped += 1
        print(f"  skipped: {what}", flush=True)
        return True


def _row(case: str, impl: str, ms: float | None, nbytes: float, copy: float | None,
         note: str) -> str:
    if ms is None:
        return f"  {case:32} {impl:26}         - ms  {note}"
    tbps = nbytes / (ms * 1e-3) / 1e12
    pct = f"{100 * tbps / copy:5.1f} % of copy" if copy else ""
    return f"  {case:32} {impl:26} {ms:9.4f} ms {tbps:6.2f} TB/s {pct}  {note[:70]}"


Split = tuple[int, int]  # (SPLIT_K_P_CTAS, SPLIT_K_MIN_STEPS) of one mma_psk row


def _runs(variants: Sequence[str], splits: Sequence[Split],
          stream: Sequence[int] = STREAM_CTAS) -> list[tuple[str, Split | int | None]]:
    """(variant, setting to run it with): mma_psk once per ``splits`` entry, mma_c8w once
    per ``stream`` CTA cap."""
    from blockscale.ops import matmul_decode

    return [(v, c) for v in variants
            for c in (splits if v == "mma_psk" else stream
                      if v in matmul_decode.STREAM_VARIANTS else (None,))]


def _set_split(split: Split | int | None) -> None:
    """Set matmul_decode.SPLIT_K_P_CTAS / SPLIT_K_MIN_STEPS (mma_psk's split choice), or
    STREAM_CTAS (an int: the persistent variants' CTA cap, 0 for one wave)."""
    from blockscale.ops import matmul_decode

    if isinstance(split, int):
        matmul_decode.STREAM_CTAS = split or None
    elif split is not None:
        matmul_decode.SPLIT_K_P_CTAS, matmul_decode.SPLIT_K_MIN_STEPS = split


def _fits(v: str, k: int, m: int = 1, grouped: bool = False) -> bool:
    """False for a one-shot variant whose shared rows cannot hold K, or a lean (dense-only)
    variant that does not take the case (its row is skipped)."""
    from blockscale.ops import matmul_decode

    try:
        matmul_decode.check_variant_shape(v, k, m)
    except ValueError:
        return False
    return not (grouped and v in matmul_decode.LEAN_VARIANTS)


def _label(v: str, ctas: int, k: int) -> str:
    """``decode-<variant>``, with the split count for the split-K variant."""
    from blockscale.ops import matmul_decode

    if v == "mma_psk":
        return f"decode-{v} S={matmul_decode.split_k_p(ctas, k)}"
    if v in matmul_decode.STREAM_VARIANTS:
        return f"decode-{v} P={matmul_decode.STREAM_CTAS or 'auto'}"
    return f"decode-{v}"


def bench_moe_decode(dev: Any, copy: float | None, *, t_values: Sequence[int] = T_VALUES,
                     fmts: Sequence[str] = ("nvfp4", "mxfp4"), shapes=GATE_UP,
                     variants: Sequence[str] = VARIANTS, budget: Budget | None = None,
                     split_ctas: Sequence[Split] = ((1056, 2),),
                     stream_ctas: Sequence[int] = STREAM_CTAS) -> None:
    from blockscale.formats import Format
    from blockscale.ops import matmul_decode

    for shape in shapes:
        rng = np.random.default_rng(1)
        for f in fmts:
            fmt = Format.from_name(f)
            w = make_weights(dev, rng, fmt, shape.experts, shape.n, shape.k)
            for t in t_values:
                routings = [route(rng, t, shape.experts, shape.top_k) for _ in range(4)]
                nbytes = float(np.mean([len(r.active) for r in routings])) * w.expert_bytes()
                case = f"{shape.name} T={t} {f}"
                sets = []
                for r in routings:
                    a = random_data(rng, fmt, (r.rows, fmt.data_cols(shape.k)))
                    a_sc2d, a_sc5 = grouped_activation_scales(rng, fmt, r, shape.k)
                    sets.append((r, a, a_sc2d, dev.to_device(a), dev.to_device(a_sc5)))
                for v, sc in _runs([v for v in variants if _fits(v, shape.k, grouped=True)], split_ctas,
                                   stream_ctas):
                    _set_split(sc)
                    if budget is not None and budget.over(f"{case} decode-{v}"):
                        continue
                    try:
                        caps, note = [], ""
                        for si, (r, a, a_sc2d, a_dev, sc_dev) in enumerate(sets):
                            with record_launches(dev) as launches:
                                out = matmul_decode.grouped_matmul_decode(
                                    a_dev, w.data_dev, sc_dev, w.scales_dev, r.expert_start,
                                    r.scales_offset, r.expert_ids, w.expert_scales, fmt,
                                    k=shape.k, device=dev, variant=v)
                                dev.synchronize()
                            rows = sample_rows(rng, r.rows, 3)
                            ok, text = check_grouped_matmul(dev.to_host(out)[rows], a, a_sc2d,
                                                            rows, r, w)
                            if not ok:
                                raise AssertionError(f"set {si}: {text}")
                            note = note or text
                            caps.append(launches)
                        tm = time_ms(lambda i, caps=caps: replay(dev, caps[i % len(caps)]),
                                     device=dev)
                        ctas = -(-shape.n // 64) * len(sets[0][0].active)
                        print(_row(case, _label(v, ctas, shape.k), tm.ms, nbytes, copy, note),
                              flush=True)
                    except Exception as e:  # noqa: BLE001 - missing kernel, wrong output
                        print(_row(case, f"decode-{v}", None, nbytes, copy,
                                   f"FAIL/ERROR: {short_error(e)}"), flush=True)
            del w


def _fp8_rowwise_row(torch: Any, m: int, n: int, k: int, copy: float | None) -> None:
    """cuBLAS FP8 row-wise (``torch._scaled_mm``, e4m3 operands, f32 row / column scales,
    bf16 out) on rotated weights: what FP4 checkpoints converted to FP8 give."""
    try:
        f8 = torch.float8_e4m3fn
        mp = -(-m // 16) * 16  # (cuBLAS FP8 wants 16-row multiples)
        x = torch.randn(mp, k, device="cuda").to(f8)
        wts = [torch.randn(n, k, device="cuda").to(f8) for _ in range(rotation_count(1.0 * n * k))]
        sa = torch.ones(mp, 1, device="cuda")
        sb = torch.ones(1, n, device="cuda")
        tm = time_ms(lambda i: torch._scaled_mm(x, wts[i % len(wts)].T, scale_a=sa,
                                                scale_b=sb, out_dtype=torch.bfloat16))
        print(_row(f"dense M={m} N={n} K={k}", "torch FP8 rowwise (_scaled_mm)", tm.ms,
                   1.0 * n * k, copy, f"fp8 weights, {mp} rows"), flush=True)
    except Exception as e:  # noqa: BLE001 - an older torch / cuBLAS without it
        print(_row(f"dense M={m} N={n} K={k}", "torch FP8 rowwise (_scaled_mm)", None,
                   1.0 * n * k, copy, f"FAIL/ERROR: {short_error(e)}"), flush=True)


def bench_dense_decode(dev: Any, copy: float | None, *, ms_values: Sequence[int] = (1, 16),
                       fmts: Sequence[str] = ("nvfp4", "mxfp4"), dense=DENSE,
                       variants: Sequence[str] = VARIANTS, budget: Budget | None = None,
                       split_ctas: Sequence[Split] = ((1056, 2),)) -> None:
    from blockscale import reference as ref
    from blockscale.formats import Format
    from blockscale.layouts import interleave
    from blockscale.ops import matmul_decode

    rng = np.random.default_rng(2)
    torch = None
    try:
        import torch as _t

        torch = _t if _t.cuda.is_available() else None
    except ImportError:
        pass
    for n, k in dense:
        for m in ms_values:
            if torch is not None:  # rotated weights: one 34 MB bf16 matrix stays in the L2
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                wts = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                       for _ in range(rotation_count(2.0 * n * k))]
                tm = time_ms(lambda i, x=x, wts=wts: x @ wts[i % len(wts)].T)
                print(_row(f"dense M={m} N={n} K={k}", "torch bf16 (cuBLAS)", tm.ms,
                           2.0 * n * k, copy, "bf16 weights"), flush=True)
                _fp8_rowwise_row(torch, m, n, k, copy)
            for f in fmts:
                fmt = Format.from_name(f)
                a = random_data(rng, fmt, (m, fmt.data_cols(k)))
                b = random_data(rng, fmt, (n, fmt.data_cols(k)))
                sa = random_scales(rng, fmt, (m, fmt.kblocks(k)))
                sb = random_scales(rng, fmt, (n, fmt.kblocks(k)))
                # weight sets rotated so their bytes exceed the L2 (8 MB would stay resident)
                a_dev, sa_dev = dev.to_device(a), dev.to_device(interleave(sa))
                sets = [[a_dev, dev.to_device(b), sa_dev, dev.to_device(interleave(sb))]
                        for _ in range(rotation_count(float(b.nbytes + sb.nbytes)))]
                ad = ref.dequantize_block_scaled(a, sa, fmt, k=k, scale_layout="row_major")
                cols = np.unique(np.concatenate([[0, 63, 64, n - 1],
                                                 rng.integers(0, n, 60)]))
                bd = ref.dequantize_block_scaled(b[cols], sb[cols], fmt, k=k,
                                                 scale_layout="row_major")
                exact = ad.astype(np.float64) @ bd.astype(np.float64).T
                abs_sum = np.abs(ad).astype(np.float64) @ np.abs(bd).astype(np.float64).T
                nbytes = b.nbytes + sb.nbytes
                for v, sc in _runs([v for v in variants
                                    if v not in GROUPED_ONLY and _fits(v, k, m)], split_ctas):
                    _set_split(sc)
                    case = f"dense M={m} N={n} K={k} {f}"
                    if budget is not None and budget.over(f"{case} decode-{v}"):
                        continue
                    try:
                        caps = []  # the launches of one call per weight set, replayed
                        for args in sets:
                            with record_launches(dev) as launches:
                                out = matmul_decode.block_scaled_matmul_decode(
                                    *args, fmt, k=k, out_dtype="float32", device=dev,
                                    variant=v)
                                dev.synchronize()
                            ok, text = check_rows(dev.to_host(out)[:, cols].astype(np.float64),
                                                  exact, abs_sum, fmt.kblocks(k))
                            if not ok:
                                raise AssertionError(text)
                            caps.append(launches)
                        tm = time_ms(lambda i, caps=caps: replay(dev, caps[i % len(caps)]),
                                     device=dev)
                        print(_row(case, _label(v, -(-n // 64), k), tm.ms, nbytes, copy, text),
                              flush=True)
                    except Exception as e:  # noqa: BLE001
                        print(_row(case, f"decode-{v}", None, nbytes, copy,
                                   f"FAIL/ERROR: {short_error(e)}"), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from benchmarks import ceilings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="gpt-oss NVFP4 and dense M=1 only")
    p.add_argument("--budget-s", type=float, default=90.0,
                   help="stop (cleanly, before the next case) after this many seconds")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated decode variants (default {','.join(VARIANTS)})")
    p.add_argument("--split-ctas", default="1056",
                   help="comma-separated mma_psk split settings CTAS[:MIN_STEPS] (grid CTAs "
                        "and K steps per split: matmul_decode.SPLIT_K_P_CTAS, "
                        "SPLIT_K_MIN_STEPS), one mma_psk row each (default 1056, i.e. "
                        "1056:2: two waves, >= 2 steps a split)")
    p.add_argument("--stream-ctas", default=",".join(map(str, STREAM_CTAS)),
                   help="comma-separated CTA caps of the persistent variants (mma_c8w, "
                        "mma_c8r, mma_c8r4: matmul_decode.STREAM_CTAS), one row each "
                        "(default 0: one wave, STREAM_PER_SM x 132)")
    ns = p.parse_args(argv)
    try:
        stream = tuple(int(x) for x in ns.stream_ctas.split(",") if x)
    except ValueError:
        stream = ()
    if not stream or min(stream) < 0:
        p.error(f"--stream-ctas: expected ints >= 0, got {ns.stream_ctas!r}")
    try:
        split_ctas = tuple((int(x.split(":")[0]), int(x.split(":")[1]) if ":" in x else 2)
                           for x in ns.split_ctas.split(",") if x)
    except (ValueError, IndexError):
        split_ctas = ()
    if not split_ctas or min(min(c) for c in split_ctas) < 1:
        p.error(f"--split-ctas: expected CTAS[:MIN_STEPS] ints >= 1, got {ns.split_ctas!r}")
    variants = tuple(v for v in ns.variants.split(",") if v)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {bad}, expected some of {VARIANTS}")
    budget = Budget(ns.budget_s if ns.budget_s > 0 else None)
    dev = bundle_device()
    copy = ceilings.copy_tbps([ceilings.copy_bandwidth(dev)])
    print(f"D2D copy: {copy} TB/s", flush=True)
    kw = {"variants": variants, "budget": budget, "split_ctas": split_ctas}
    kw_moe = {**kw, "stream_ctas": stream}
    if ns.quick:
        bench_dense_decode(dev, copy, ms_values=(1,), fmts=("nvfp4",), dense=DENSE[:1], **kw)
        bench_moe_decode(dev, copy, fmts=("nvfp4",), shapes=GATE_UP[:1], **kw_moe)
    else:  # the dense and gpt-oss rows first: the DeepSeek T=128 simt rows take seconds
        bench_dense_decode(dev, copy, dense=DENSE[:1], **kw)
        bench_moe_decode(dev, copy, shapes=GATE_UP[:1], **kw_moe)
        bench_dense_decode(dev, copy, dense=DENSE[1:], **kw)
        bench_moe_decode(dev, copy, shapes=GATE_UP[1:], **kw_moe)
    print(f"done in {time.monotonic() - budget.t0:.0f} s"
          + (f", {budget.skipped} rows skipped (budget)" if budget.skipped else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
