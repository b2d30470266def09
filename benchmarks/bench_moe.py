"""MoE benchmarks on the GPU: the gate_up grouped GEMM, and the whole expert computation.

1. **gate_up** of gpt-oss-120b (E=128, top-4, K=2880, N=5760) and DeepSeek-V3 (E=256, top-8,
   K=7168, N=4096) at T tokens in {1, 16, 128, 1024, 4096}, uniform random routing (each token
   picks ``top_k`` distinct experts): blockscale's ``ops.grouped_matmul_block_scaled`` (NVFP4,
   MXFP4; W4A4) against ``torch._grouped_mm`` in bf16 and ``torch._scaled_grouped_mm`` in FP8
   with row-wise scales (each "unavailable" when torch lacks it or it refuses the case).
2. **whole expert computation** at E=256, top-6, hidden 4096, intermediate 2048 and batch 4 /
   16 / 64: grouped quantize (gather fused) -> gate_up -> fused SiLU + quantize -> down, in
   NVFP4 and MXFP4, beside FlashInfer's published H200 MXFP4xBF16 fused-MoE latencies and the
   HBM floor (bytes of the active experts' weights / measured copy bandwidth). Routing index
   construction and the final weighted combine are not in the timed region (host numpy).

Checks before timing: blockscale quantize outputs byte for byte against
``blockscale.reference`` (the fused SiLU too: its exp is exp_f32 on both sides, D10);
matmul outputs on sampled rows against the float64 product of the operands dequantized with
``blockscale.reference.dequantize_block_scaled`` (bf16 rounding + fp32 accumulation bound);
torch baselines on sampled rows against the float64 product of their own operands (normwise
relative error <= 1e-2). Each rotation set (see benchmarks/common.py) is checked.

Usage: ``python benchmarks/bench_moe.py [--quick]`` (or through benchmarks/run.py);
``--gate-up mxfp8,mxfp4 --t 1024,4096 --shapes gpt-oss-120b``: only those gate_up rows.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.common import (
    FIRST_RUN_CAP_S,
    Budget,
    Record,
    check_bytes,
    check_rel,
    check_rows,
    failed,
    first_run_s,
    interleave_stack,
    kernel_keys_without_mlir,
    random_bf16,
    random_data,
    random_scales,
    record_launches,
    replay,
    rotation_count,
    short_error,
    time_ms,
    with_rates,
)

#: kernel target: None = the device's own (sm_90a on H100 / H200)
TARGET: str | None = None
T_VALUES = (1, 16, 128, 1024, 4096)
E2E_BATCHES = (4, 16, 64)
#: FlashInfer PR #3084: H200 MXFP4 x BF16 fused MoE (E=256, top-6, 4096/2048), ms by batch
FLASHINFER_H200_MS = {4: 0.193, 16: 0.532, 64: 1.207}
FLASHINFER_LABEL = "FlashInfer MXFP4xBF16 fused MoE (published, PR #3084)"


@dataclasses.dataclass(frozen=True)
class MoEShape:
    """One MoE projection: E experts, top_k per token, K (in) and N (out) features."""

    name: str
    experts: int
    top_k: int
    k: int
    n: int


GATE_UP = (MoEShape("gpt-oss-120b", 128, 4, 2880, 5760),
           MoEShape("deepseek-v3", 256, 8, 7168, 4096))


# ----------------------------------------------------------------------------- routing


@dataclasses.dataclass
class Routing:
    """Uniform random top-k routing of T tokens and its ``moe_create_indices``."""

    topk_ids: np.ndarray
    token_order: np.ndarray
    expert_start: np.ndarray
    expert_ids: np.ndarray
    scales_offset: np.ndarray
    counts: np.ndarray  # rows per expert id [E]

    @property
    def rows(self) -> int:
        return int(self.expert_start[-1])

    @property
    def active(self) -> np.ndarray:
        return self.expert_ids[self.expert_ids >= 0]

    def group_of_rows(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.expert_ids)), np.diff(self.expert_start))

    def scale_rows(self) -> np.ndarray:
        """5-D scale row of each permuted row (padded per group, §2.5)."""
        es, g = self.expert_start.astype(np.int64), self.group_of_rows()
        tile0 = es[:-1] // 128 + self.scales_offset
        return tile0[g] * 128 + (np.arange(self.rows) - es[g])

    def num_tiles(self) -> int:
        return -(-self.rows // 128) + min(len(self.expert_ids), self.rows)


def route(rng: np.random.Generator, tokens: int, experts: int, top_k: int) -> Routing:
    """Each token picks ``top_k`` distinct experts uniformly at random."""
    from blockscale import reference as ref

    ids = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k].astype(np.int32)
    order, es, _restore, eids, _stats, offs = ref.moe_create_indices(ids.reshape(-1), experts)
    return Routing(ids, order.astype(np.int32), es.astype(np.int32), eids.astype(np.int32),
                   offs.astype(np.int64).astype(np.int32),
                   np.bincount(ids.reshape(-1), minlength=experts))


# ----------------------------------------------------------------------------- operands


@dataclasses.dataclass
class ExpertWeights:
    """Quantized expert weights ``[E, N, K]`` on host and device, with 2-D and 6-D scales."""

    fmt: Any
    data: np.ndarray  # [E, N, K/2 | K]
    scales2d: np.ndarray  # [E, N, J]
    data_dev: Any
    scales_dev: Any  # 6-D
    expert_scales: np.ndarray | None  # [E] float32 (NVFP4), None (MX)
    k: int
    _deq: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)

    def dequantized(self, e: int) -> np.ndarray:
        """Expert ``e`` as float64 ``[N, K]`` (reference dequantize; cached)."""
        if e not in self._deq:
            from blockscale import reference as ref

            self._deq[e] = ref.dequantize_block_scaled(
                self.data[e], self.scales2d[e], self.fmt, k=self.k,
                scale_layout="row_major").astype(np.float64)
        return self._deq[e]

    def expert_bytes(self) -> float:
        """Bytes of one expert's data and scales."""
        return (self.data[0].nbytes + self.scales2d[0].nbytes)


def make_weights(dev: Any, rng: np.random.Generator, fmt: Any, experts: int, n: int, k: int,
                 data: np.ndarray | None = None, data_dev: Any = None) -> ExpertWeights:
    """Random quantized weights (``data``/``data_dev`` reused across FP4 formats if given)."""
    if data is None:
        data = random_data(rng, fmt, (experts, n, fmt.data_cols(k)))
        data_dev = dev.to_device(data)
    s2 = random_scales(rng, fmt, (experts, n, fmt.kblocks(k)))
    es = None if fmt.is_mx else rng.uniform(0.5, 2.0, experts).astype(np.float32)
    return ExpertWeights(fmt, data, s2, data_dev, dev.to_device(interleave_stack(s2)), es, k)


def grouped_activation_scales(rng: np.random.Generator, fmt: Any, r: Routing, k: int
                              ) -> tuple[np.ndarray, np.ndarray]:
    """Random per-row scales ``[rows, J]`` and their padded grouped 5-D placement."""
    from blockscale.layouts import interleave

    j = fmt.kblocks(k)
    rows2d = random_scales(rng, fmt, (r.rows, j))
    padded = np.zeros((r.num_tiles() * 128, j), dtype=np.uint8)
    padded[r.scale_rows()] = rows2d.view(np.uint8)
    return rows2d, interleave(padded.view(rows2d.dtype))


def rows_of_grouped_scales(sc5: np.ndarray, r: Routing, j: int) -> np.ndarray:
    """Per-row ``[rows, J]`` scales out of a padded grouped 5-D scale tensor."""
    from blockscale.layouts import deinterleave

    return deinterleave(sc5, sc5.shape[0] * 128, j)[r.scale_rows()]


def sample_rows(rng: np.random.Generator, rows: int, count: int) -> np.ndarray:
    """First, last and ``count - 2`` random rows (sorted, unique)."""
    pick = [0, rows - 1] + list(rng.integers(0, rows, max(0, count - 2)))
    return np.unique(np.array(pick, dtype=np.int64))


def check_grouped_matmul(out_rows: np.ndarray, a_data: np.ndarray, a_sc2d: np.ndarray,
                         rows: np.ndarray, r: Routing, w: ExpertWeights) -> tuple[bool, str]:
    """Sampled output rows of a grouped matmul against the float64 reference product."""
    from blockscale import reference as ref

    fmt = w.fmt
    a = ref.dequantize_block_scaled(a_data[rows], a_sc2d[rows], fmt, k=w.k,
                                    scale_layout="row_major").astype(np.float64)
    expert = r.expert_ids[r.group_of_rows()[rows]]
    exact = np.empty((len(rows), w.data.shape[1]))
    abs_sum = np.empty_like(exact)
    for i, e in enumerate(expert):
        wd = w.dequantized(int(e))
        s = 1.0 if w.expert_scales is None else float(w.expert_scales[e])
        exact[i] = (a[i] @ wd.T) * s
        abs_sum[i] = (np.abs(a[i]) @ np.abs(wd).T) * s
    n_round = fmt.kblocks(w.k) - 1 + (0 if fmt.is_fp4 else fmt.block_size - 1) + 1
    return check_rows(out_rows.astype(np.float64), exact, abs_sum, n_round)


# ----------------------------------------------------------------------------- gate_up


def _skip_slow(first_s: float) -> str:
    return (f"skipped: first run took {first_s:.2f} s (> {FIRST_RUN_CAP_S:.0f} s cap per "
            f"case)")


def _ours_gate_up(dev: Any, shape: MoEShape, w: ExpertWeights, routings: Sequence[Routing],
                  rng: np.random.Generator, case: str, params: dict[str, Any]) -> Record:
    """blockscale grouped matmul on every rotation set: capture, check, then time."""
    from blockscale import ops

    fmt = w.fmt
    impl = f"blockscale {fmt.name}"
    caps, rec_note = [], ""
    for si, r in enumerate(routings):
        a = random_data(rng, fmt, (r.rows, fmt.data_cols(shape.k)))
        a_sc2d, a_sc5 = grouped_activation_scales(rng, fmt, r, shape.k)
        a_dev, sc_dev = dev.to_device(a), dev.to_device(a_sc5)

        def call(a_dev: Any = a_dev, sc_dev: Any = sc_dev, r: Routing = r) -> Any:
            return ops.grouped_matmul_block_scaled(
                a_dev, w.data_dev, sc_dev, w.scales_dev, r.expert_start, r.scales_offset,
                r.expert_ids, w.expert_scales, fmt, k=shape.k, device=dev, target=TARGET)

        with record_launches(dev) as launches:
            out, sec = first_run_s(call, dev.synchronize)
        if sec > FIRST_RUN_CAP_S:
            return failed("moe_gate_up", case, impl, fmt.name, "skipped", _skip_slow(sec),
                          params)
        rows = sample_rows(rng, r.rows, 4 if si == 0 else 2)
        got = dev.to_host(out)[rows]
        ok, text = check_grouped_matmul(got, a, a_sc2d, rows, r, w)
        if not ok:
            return failed("moe_gate_up", case, impl, fmt.name, "fail", f"set {si}: {text}",
                          params)
        rec_note = text if si == 0 else rec_note
        caps.append(launches)
    t = time_ms(lambda i: replay(dev, caps[i % len(caps)]), device=dev)
    return Record("moe_gate_up", case, impl, fmt.name, t.ms, "ok",
                  f"{rec_note}; {len(caps)} sets checked", params=params,
                  note=f"{t.method}; {len(caps)} rotating input sets; "
                       f"{sum(len(c) for c in caps) // len(caps)} launch(es)")


class TorchGateUp:
    """bf16 and FP8 row-wise grouped GEMM baselines of one MoE shape (torch on the GPU)."""

    def __init__(self, torch: Any, shape: MoEShape, seed: int):
        self.torch, self.shape = torch, shape
        g = torch.Generator(device="cuda").manual_seed(seed)
        e, n, k = shape.experts, shape.n, shape.k
        self.w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16, generator=g)
        self.w.mul_(k ** -0.5)
        self.w8 = torch.empty(e, n, k, device="cuda", dtype=torch.float8_e4m3fn)
        self.sw = torch.empty(e, n, device="cuda", dtype=torch.float32)
        for lo in range(0, e, 16):  # chunked to bound the temporaries
            chunk = self.w[lo:lo + 16].float()
            s = chunk.abs().amax(dim=2).clamp(min=1e-12) / 448.0
            self.sw[lo:lo + 16] = s
            self.w8[lo:lo + 16] = (chunk / s[:, :, None]).to(torch.float8_e4m3fn)
        self.gen = g

    def inputs(self, r: Routing) -> dict[str, Any]:
        torch = self.torch
        x = torch.randn(r.rows, self.shape.k, device="cuda", dtype=torch.bfloat16,
                        generator=self.gen)
        sx = x.float().abs().amax(dim=1).clamp(min=1e-12) / 448.0
        x8 = (x.float() / sx[:, None]).to(torch.float8_e4m3fn)
        offs = torch.tensor(np.cumsum(r.counts).astype(np.int32), device="cuda")
        return {"x": x, "x8": x8, "sx": sx.contiguous(), "offs": offs, "routing": r}

    def bf16(self, inp: dict[str, Any]) -> Any:
        return self.torch._grouped_mm(inp["x"], self.w.transpose(1, 2), offs=inp["offs"])

    def fp8(self, inp: dict[str, Any]) -> Any:
        return self.torch._scaled_grouped_mm(inp["x8"], self.w8.transpose(1, 2), inp["sx"],
                                             self.sw, offs=inp["offs"],
                                             out_dtype=self.torch.bfloat16)

    def check(self, kind: str, out: Any, inp: dict[str, Any], rows: np.ndarray
              ) -> tuple[bool, str]:
        """Sampled rows against the float64 product of the same (bf16 / fp8) operands."""
        r: Routing = inp["routing"]
        # rows are sorted by expert id; row m belongs to the expert whose offs range holds it
        experts = np.searchsorted(np.cumsum(r.counts), rows, side="right")
        exact = np.empty((len(rows), self.shape.n))
        for i, (m, e) in enumerate(zip(rows.tolist(), experts.tolist())):
            if kind == "bf16":
                a = inp["x"][m].double().cpu().numpy()
                wd = self.w[e].double().cpu().numpy()
            else:
                a = inp["x8"][m].double().cpu().numpy() * float(inp["sx"][m])
                wd = (self.w8[e].double() * self.sw[e].double()[:, None]).cpu().numpy()
            exact[i] = wd @ a
        got = out[self.torch.as_tensor(rows, device="cuda")].float().cpu().numpy()
        return check_rel(got, exact, 1e-2)

    def bench(self, kind: str, routings: Sequence[Routing], rng: np.random.Generator,
              case: str, params: dict[str, Any]) -> Record:
        impl = {"bf16": "torch._grouped_mm bf16",
                "fp8": "torch._scaled_grouped_mm fp8 row-wise"}[kind]
        fn_name = {"bf16": "_grouped_mm", "fp8": "_scaled_grouped_mm"}[kind]
        if not hasattr(self.torch, fn_name):
            return failed("moe_gate_up", case, impl, kind, "unavailable",
                          f"torch {self.torch.__version__} has no torch.{fn_name}", params)
        fn = getattr(self, kind)
        sets = [self.inputs(r) for r in routings]
        first_text = ""
        try:
            for si, inp in enumerate(sets):
                out, sec = first_run_s(lambda inp=inp: fn(inp), self.torch.cuda.synchronize)
                if sec > FIRST_RUN_CAP_S:  # the very first call may include library set-up
                    out, sec = first_run_s(lambda inp=inp: fn(inp), self.torch.cuda.synchronize)
                if sec > FIRST_RUN_CAP_S:
                    return failed("moe_gate_up", case, impl, kind, "skipped", _skip_slow(sec),
                                  params)
                rows = sample_rows(rng, inp["routing"].rows, 4 if si == 0 else 2)
                ok, text = self.check(kind, out, inp, rows)
                if not ok:
                    return failed("moe_gate_up", case, impl, kind, "fail", f"set {si}: {text}",
                                  params)
                first_text = text if si == 0 else first_text
        except Exception as e:  # noqa: BLE001 - e.g. unsupported on this GPU / build
            return failed("moe_gate_up", case, impl, kind, "unavailable", short_error(e), params)
        t = time_ms(lambda i: fn(sets[i % len(sets)]))
        return Record("moe_gate_up", case, impl, kind, t.ms, "ok",
                      f"{first_text}; {len(sets)} sets checked", params=params,
                      note=f"{t.method}; {len(sets)} rotating input sets")


def _gate_up_traffic(shape: MoEShape, routings: Sequence[Routing], w_bytes_per_expert: float,
                     a_bytes_per_row: float) -> float:
    """Mean bytes one call moves: active experts' weights + activations in + bf16 out."""
    per = [len(r.active) * w_bytes_per_expert + r.rows * (a_bytes_per_row + 2 * shape.n)
           for r in routings]
    return float(np.mean(per))


#: the shapes the suite runs MXFP8 at (DeepSeek-V3's 7.5 GB of E4M3 weights: host time)
MXFP8_SHAPES = ("gpt-oss-120b",)


def bench_gate_up(dev: Any, budget: Budget, *, t_values: Sequence[int] = T_VALUES,
                  fmts: Sequence[str] = ("nvfp4", "mxfp4", "mxfp8"),
                  shapes: Sequence[MoEShape] = GATE_UP,
                  baselines: bool = True, log: Any = print) -> list[Record]:
    """gate_up grouped GEMM: ours per format (MXFP8 on :data:`MXFP8_SHAPES` only), torch
    bf16 and FP8 per shape and T."""
    from blockscale.formats import Format

    torch = None
    if baselines:
        try:
            import torch as _torch

            torch = _torch if _torch.cuda.is_available() else None
        except ImportError:
            torch = None
    records: list[Record] = []
    for shape in shapes:
        if budget.exhausted(reserve=30):
            records.append(failed("moe_gate_up", shape.name, "all", "", "skipped",
                                  "skipped: time budget"))
            continue
        rng = np.random.default_rng(1)
        log(f"[moe] {shape.name}: generating weights E={shape.experts} N={shape.n} "
            f"K={shape.k}")
        weights: dict[str, ExpertWeights | Exception] = {}
        data = data_dev = None
        shape_fmts = [f for f in fmts if f != "mxfp8" or shape.name in MXFP8_SHAPES]
        for f in shape_fmts:
            fmt = Format.from_name(f)
            try:
                reuse = data if fmt.is_fp4 else None
                weights[f] = make_weights(dev, rng, fmt, shape.experts, shape.n, shape.k,
                                          reuse, data_dev if reuse is not None else None)
                if fmt.is_fp4:
                    data, data_dev = weights[f].data, weights[f].data_dev
            except Exception as e:  # noqa: BLE001
                weights[f] = e
        tg = None
        if torch is not None:
            try:
                tg = TorchGateUp(torch, shape, seed=2)
            except Exception as e:  # noqa: BLE001
                tg = e
        for t in t_values:
            case = f"{shape.name} T={t}"
            r_probe = route(rng, t, shape.experts, shape.top_k)
            w_any = next((w for w in weights.values() if isinstance(w, ExpertWeights)), None)
            per_expert = w_any.expert_bytes() if w_any else shape.n * shape.k / 2
            n_sets = rotation_count(_gate_up_traffic(shape, [r_probe], per_expert,
                                                     shape.k / 2))
            routings = [r_probe] + [route(rng, t, shape.experts, shape.top_k)
                                    for _ in range(n_sets - 1)]
            flops = 2.0 * t * shape.top_k * shape.n * shape.k
            base = {"model": shape.name, "T": t, "E": shape.experts, "top_k": shape.top_k,
                    "K": shape.k, "N": shape.n, "flops": flops,
                    "active_experts": float(np.mean([len(r.active) for r in routings]))}
            if budget.exhausted(reserve=20):
                records.append(failed("moe_gate_up", case, "all", "", "skipped",
                                      "skipped: time budget", base))
                continue
            for f in shape_fmts:
                w = weights[f]
                if isinstance(w, Exception):
                    records.append(failed("moe_gate_up", case, f"blockscale {f}", f, "error",
                                          short_error(w), base))
                    continue
                nbytes = _gate_up_traffic(shape, routings, w.expert_bytes(),
                                          w.fmt.data_cols(shape.k) + w.fmt.kblocks(shape.k))
                params = {**base, "bytes": nbytes}
                try:
                    rec = _ours_gate_up(dev, shape, w, routings, rng, case, params)
                except Exception as e:  # noqa: BLE001 - missing kernel, launch failure...
                    rec = failed("moe_gate_up", case, f"blockscale {f}", f, "error",
                                 short_error(e), params)
                records.append(with_rates(rec, nbytes=nbytes, flops=flops))
                log(_line(records[-1]))
            for kind in ("bf16", "fp8"):
                eb = 2 if kind == "bf16" else 1
                nbytes = _gate_up_traffic(shape, routings, shape.n * shape.k * eb,
                                          shape.k * eb)
                params = {**base, "bytes": nbytes}
                impl = {"bf16": "torch._grouped_mm bf16",
                        "fp8": "torch._scaled_grouped_mm fp8 row-wise"}[kind]
                if tg is None or isinstance(tg, Exception):
                    why = short_error(tg) if isinstance(tg, Exception) else "torch with CUDA " \
                        "not available" if baselines else "baselines off"
                    records.append(failed("moe_gate_up", case, impl, kind, "unavailable", why,
                                          params))
                    continue
                rec = tg.bench(kind, routings, rng, case, params)
                records.append(with_rates(rec, nbytes=nbytes, flops=flops))
                log(_line(records[-1]))
        del weights, tg
        if torch is not None:
            torch.cuda.empty_cache()
    return records


# ----------------------------------------------------------------------------- whole MoE


@dataclasses.dataclass
class E2EConfig:
    experts: int = 256
    top_k: int = 6
    hidden: int = 4096
    inter: int = 2048


def _silu_amax_by_expert(gate_up: np.ndarray, r: Routing, experts: int, d: int) -> np.ndarray:
    """amax of SiLU(gate) * up per expert id (for NVFP4 down input scales)."""
    g = gate_up[:, :d].astype(np.float32)
    u = gate_up[:, d:].astype(np.float32)
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g: SiLU -> 0
        z = np.abs(g / (1.0 + np.exp(-g)) * u).max(axis=1)
    amax = np.ones(experts, np.float32)
    owner = r.expert_ids[r.group_of_rows()]
    np.maximum.at(amax, owner, z)
    return amax


def _e2e_set(dev: Any, cfg: E2EConfig, fmt: Any, w1: ExpertWeights, w2: ExpertWeights,
             r: Routing, batch: int, rng: np.random.Generator, n_check: int
             ) -> tuple[list[Any], str]:
    """Run the expert chain once (recording launches) and check every stage."""
    from blockscale import ops
    from blockscale import reference as ref

    nv = not fmt.is_mx
    glob = np.float32(448.0 * 6.0)
    x = random_bf16(rng, (batch, cfg.hidden))
    x_dev = dev.to_device(x)
    in_scale = np.float32(np.abs(x.astype(np.float32)).max() / glob)
    tsf = np.full(cfg.experts, np.float32(1.0) / in_scale, np.float32) if nv else None
    kw = {"device": dev, "target": TARGET}
    with record_launches(dev) as launches:
        hq, hs = ops.grouped_quantize_dynamic_scaled(
            x_dev, fmt, r.expert_start, r.scales_offset, r.expert_ids, tsf,
            indices=r.token_order, indices_divisor=cfg.top_k, **kw)
        gu = ops.grouped_matmul_block_scaled(hq, w1.data_dev, hs, w1.scales_dev, r.expert_start,
                                             r.scales_offset, r.expert_ids, w1.expert_scales,
                                             fmt, k=cfg.hidden, **kw)
        dev.synchronize()
        gu_host = dev.to_host(gu)
        down_in = (_silu_amax_by_expert(gu_host, r, cfg.experts, cfg.inter) / glob
                   ).astype(np.float32) if nv else None
        h, h_s = ops.fused_silu_quantize(gu, fmt, r.expert_start, r.scales_offset,
                                         r.expert_ids, down_in, **kw)
        y = ops.grouped_matmul_block_scaled(h, w2.data_dev, h_s, w2.scales_dev, r.expert_start,
                                            r.scales_offset, r.expert_ids, w2.expert_scales,
                                            fmt, k=cfg.inter, **kw)
        dev.synchronize()
    # 1. grouped quantize with the fused gather: bit-exact
    rd, rs = ref.grouped_quantize_dynamic_scaled(x, fmt, r.expert_start, r.scales_offset,
                                                 r.expert_ids, tsf, indices=r.token_order,
                                                 indices_divisor=cfg.top_k)
    hq_h, hs_h = dev.to_host(hq), dev.to_host(hs)
    for name, (ok, text) in (("quantize data", check_bytes(hq_h, rd)),
                             ("quantize scales", check_bytes(hs_h, rs))):
        if not ok:
            raise AssertionError(f"{name}: {text}")
    # 2. gate_up on sampled rows (inputs: the device's quantized activations)
    rows = sample_rows(rng, r.rows, n_check)
    a_sc = rows_of_grouped_scales(hs_h, r, fmt.kblocks(cfg.hidden))
    ok, t_gu = check_grouped_matmul(gu_host[rows], hq_h, a_sc, rows, r, w1)
    if not ok:
        raise AssertionError(f"gate_up: {t_gu}")
    # 3. fused SiLU + quantize on the device's gate_up output
    rd, rs = ref.fused_silu_quantize(gu_host, fmt, r.expert_start, r.scales_offset,
                                     r.expert_ids, down_in)
    h_h, hs2_h = dev.to_host(h), dev.to_host(h_s)
    ok1, t1 = check_bytes(h_h, rd)
    ok2, t2 = check_bytes(hs2_h, rs)
    if not (ok1 and ok2):
        raise AssertionError(f"fused silu quantize: data {t1}, scales {t2}")
    # 4. down on sampled rows
    h_sc = rows_of_grouped_scales(hs2_h, r, fmt.kblocks(cfg.inter))
    ok, t_dn = check_grouped_matmul(dev.to_host(y)[rows], h_h, h_sc, rows, r, w2)
    if not ok:
        raise AssertionError(f"down: {t_dn}")
    return launches, (f"quantize bit-exact; gate_up {t_gu}; silu-quantize {t1}; "
                      f"down {t_dn}")


def bench_e2e(dev: Any, budget: Budget, copy_tbps: float | None, *,
              batches: Sequence[int] = E2E_BATCHES, fmts: Sequence[str] = ("nvfp4", "mxfp4"),
              log: Any = print) -> list[Record]:
    """The whole expert computation per format and batch, plus published and floor rows."""
    from blockscale.formats import Format

    cfg = E2EConfig()
    records: list[Record] = []
    rng = np.random.default_rng(3)
    log(f"[moe] whole-MoE: generating weights E={cfg.experts} H={cfg.hidden} "
        f"I={cfg.inter}")
    weights: dict[str, tuple[ExpertWeights, ExpertWeights] | Exception] = {}
    shared: tuple[Any, ...] | None = None
    for f in fmts:
        fmt = Format.from_name(f)
        try:
            if shared is None or not fmt.is_fp4:
                w1 = make_weights(dev, rng, fmt, cfg.experts, 2 * cfg.inter, cfg.hidden)
                w2 = make_weights(dev, rng, fmt, cfg.experts, cfg.hidden, cfg.inter)
                if fmt.is_fp4:
                    shared = (w1.data, w1.data_dev, w2.data, w2.data_dev)
            else:
                w1 = make_weights(dev, rng, fmt, cfg.experts, 2 * cfg.inter, cfg.hidden,
                                  shared[0], shared[1])
                w2 = make_weights(dev, rng, fmt, cfg.experts, cfg.hidden, cfg.inter,
                                  shared[2], shared[3])
            weights[f] = (w1, w2)
        except Exception as e:  # noqa: BLE001
            weights[f] = e
    for batch in batches:
        case = f"E=256 top-6 4096/2048 batch={batch}"
        routings = [route(rng, batch, cfg.experts, cfg.top_k)]
        w_any = next((w for w in weights.values() if isinstance(w, tuple)), None)
        per_expert = (w_any[0].expert_bytes() + w_any[1].expert_bytes()) if w_any else \
            3 * cfg.hidden * cfg.inter / 2
        n_sets = rotation_count(len(routings[0].active) * per_expert)
        routings += [route(rng, batch, cfg.experts, cfg.top_k) for _ in range(n_sets - 1)]
        active = float(np.mean([len(r.active) for r in routings]))
        flops = 2.0 * batch * cfg.top_k * 3 * cfg.hidden * cfg.inter
        base = {"batch": batch, "T": batch, "E": cfg.experts, "top_k": cfg.top_k,
                "hidden": cfg.hidden, "inter": cfg.inter, "active_experts": active,
                "flops": flops}
        records.append(Record("moe_e2e", case, FLASHINFER_LABEL, "mxfp4xbf16",
                              FLASHINFER_H200_MS.get(batch), "published",
                              "not run here (quoted)", params=base,
                              note="FlashInfer PR #3084, H200; includes routing/finalize"))
        for f in fmts:
            w = weights[f]
            impl = f"blockscale {f} (4 kernels)"
            if isinstance(w, Exception):
                records.append(failed("moe_e2e", case, impl, f, "error", short_error(w), base))
                continue
            nbytes = active * (w[0].expert_bytes() + w[1].expert_bytes())
            params = {**base, "bytes": nbytes}
            if copy_tbps:
                floor = nbytes / (copy_tbps * 1e12) * 1e3
                records.append(Record("moe_e2e", case, f"HBM floor {f} (active experts' "
                                      "weights / copy BW)", f, floor, "derived",
                                      f"{nbytes / 1e6:.1f} MB at {copy_tbps:.2f} TB/s",
                                      params=params))
            if budget.exhausted(reserve=10):
                records.append(failed("moe_e2e", case, impl, f, "skipped",
                                      "skipped: time budget", params))
                continue
            try:
                caps, text = [], ""
                for si, r in enumerate(routings):
                    launches, t = _e2e_set(dev, cfg, w[0].fmt, w[0], w[1], r, batch, rng,
                                           4 if si == 0 else 2)
                    caps.append(launches)
                    text = t if si == 0 else text
                tm = time_ms(lambda i, caps=caps: replay(dev, caps[i % len(caps)]), device=dev)
                rec = Record("moe_e2e", case, impl, f, tm.ms, "ok",
                             f"{text}; {len(caps)} sets checked", params=params,
                             note=f"{tm.method}; {len(caps)} rotating input sets; routing "
                                  "indices and combine on the host, not timed")
                if tm.ms > FIRST_RUN_CAP_S * 1e3:
                    rec.note += "; slower than the 1 s cap"
            except AssertionError as e:
                rec = failed("moe_e2e", case, impl, f, "fail", f"FAIL: {e}", params)
            except Exception as e:  # noqa: BLE001 - missing kernel etc.
                rec = failed("moe_e2e", case, impl, f, "error", short_error(e), params)
            records.append(with_rates(rec, nbytes=nbytes, flops=flops))
            log(_line(records[-1]))
    return records


# ----------------------------------------------------------------------------- CLI


def _line(r: Record) -> str:
    ms = f"{r.ms:9.4f} ms" if r.ms else "        - ms"
    rate = f"{r.tflops:7.2f} TFLOP/s" if r.tflops else ""
    return f"  {r.case:34} {r.impl:40} {ms} {rate:16} {r.status}: {r.check[:90]}"


def run(dev: Any, budget: Budget, copy_tbps: float | None, *, quick: bool = False,
        log: Any = print) -> list[Record]:
    """Both MoE benchmarks (a small subset with ``quick``)."""
    if quick:
        recs = bench_gate_up(dev, budget, t_values=(16, 1024), fmts=("nvfp4",),
                             shapes=GATE_UP[:1], log=log)
        return recs + bench_e2e(dev, budget, copy_tbps, batches=(16,), fmts=("nvfp4",),
                                log=log)
    recs = bench_gate_up(dev, budget, log=log)
    return recs + bench_e2e(dev, budget, copy_tbps, log=log)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from benchmarks import ceilings
    from blockscale import runtime

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--gate-up", metavar="FMTS", default=None,
                   help="only the gate_up benchmark, these formats (e.g. mxfp8,mxfp4)")
    p.add_argument("--t", default=",".join(map(str, T_VALUES)), help="gate_up token counts")
    p.add_argument("--shapes", default=",".join(s.name for s in GATE_UP),
                   help="gate_up shapes by name")
    ns = p.parse_args(argv)
    kernel_keys_without_mlir()
    dev = runtime.get_device("cuda")
    if ns.gate_up is not None:
        shapes = [s for s in GATE_UP if s.name in ns.shapes.split(",")]
        bench_gate_up(dev, Budget(600), t_values=[int(x) for x in ns.t.split(",")],
                      fmts=ns.gate_up.split(","), shapes=shapes)
        return 0
    copy = ceilings.copy_tbps([ceilings.copy_bandwidth(dev)])
    run(dev, Budget(600), copy, quick=ns.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
