"""What every benchmark shares: result records, GPU timing, launch capture, random operands,
and the output checks that run before anything is timed.

Timing (:func:`time_ms`): CUDA events around each call, the median over many calls after a
warm-up. With torch present, events are torch's and a short ``torch.cuda._sleep`` is queued
before each timed call so the GPU never waits for the host: the number is the GPU time of the
call (what a CUDA-graph replay gives), without Python launch overhead. Without torch,
blockscale's own events are used (no sleep). Callers rotate inputs: ``fn(i)`` uses input set
``i % R`` with R sets whose bytes together exceed the L2 (:func:`rotation_count`).

Launch capture (:func:`record_launches`): an op (or a chain of ops) is called once through its
public function with the launches of the blockscale device recorded; timing then replays the
recorded kernel launches on the same buffers, so the op's host-side validation, uploads and
output allocation stay out of the number while the kernels timed are exactly the ones the
public function chose.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ml_dtypes
import numpy as np

#: L2 of an H200 as torch reports it (bytes); rotation sets together exceed a few times this.
L2_BYTES = 60 * 2 ** 20
#: A case whose first (untimed) run takes longer than this is skipped and recorded as such.
FIRST_RUN_CAP_S = 1.0


# ----------------------------------------------------------------------------- records


@dataclasses.dataclass
class Record:
    """One row of the results: an implementation on one case.

    Attributes:
        suite: "ceiling" | "quantize" | "matmul" | "moe_gate_up" | "moe_e2e".
        case: a short case label (shape, model, T...).
        impl: "blockscale", "torch-bf16", ..., or "published: ..." for quoted numbers.
        fmt: the data format ("nvfp4", "bf16", "fp8-rowwise", ...).
        ms: median milliseconds; None when there is no trustworthy number.
        status: "ok" | "fail" (wrong output) | "error" | "skipped" | "unavailable" |
            "published" | "derived".
        check: what the correctness check found (or why it did not run).
        tbps / tflops: achieved TB/s (bytes moved / ms) or TFLOP/s, when meaningful.
        params: the case's numbers (M, N, K, T, E, top_k...) for plots.
        note: anything else a reader needs (timing method, skipped reason...).
    """

    suite: str
    case: str
    impl: str
    fmt: str = ""
    ms: float | None = None
    status: str = "ok"
    check: str = ""
    tbps: float | None = None
    tflops: float | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Record:
        fields = {f.name for f in dataclasses.fields(Record)}
        return Record(**{k: v for k, v in d.items() if k in fields})


def failed(suite: str, case: str, impl: str, fmt: str, status: str, why: str,
           params: dict[str, Any] | None = None) -> Record:
    """A record without a number (wrong output, missing kernel, unavailable baseline...)."""
    return Record(suite, case, impl, fmt, None, status, why[:300], params=params or {})


def short_error(e: BaseException, limit: int = 160) -> str:
    """``Type: message`` on one line, cut to ``limit`` characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:limit]


def with_rates(rec: Record, *, nbytes: float | None = None, flops: float | None = None
               ) -> Record:
    """Fill ``tbps`` / ``tflops`` of a timed record from bytes moved / flops done."""
    if rec.ms:
        if nbytes:
            rec.tbps = nbytes / (rec.ms * 1e-3) / 1e12
        if flops:
            rec.tflops = flops / (rec.ms * 1e-3) / 1e12
    return rec


# ----------------------------------------------------------------------------- timing


def _torch_cuda() -> Any:
    """torch when it is importable and sees a CUDA GPU, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@dataclasses.dataclass
class Timing:
    """Median / min milliseconds over ``iters`` timed calls."""

    ms: float
    ms_min: float
    iters: int
    method: str


def time_ms(fn: Callable[[int], Any], *, device: Any = None, warmup: int = 3,
            target_ms: float = 250.0, min_iters: int = 5, max_iters: int = 200) -> Timing:
    """Median GPU milliseconds of ``fn(i)`` (i = call index, for input rotation).

    Warm-up calls first; the number of timed calls is chosen so they take about ``target_ms``
    of GPU time. ``device``: a blockscale Device for the torch-less fallback.
    """
    torch = _torch_cuda()
    if torch is None:
        return _time_ms_blockscale(fn, device, warmup, target_ms, min_iters, max_iters)
    sync = torch.cuda.synchronize
    sync()
    host = []
    for i in range(warmup):
        t0 = time.perf_counter()
        fn(i)
        host.append(time.perf_counter() - t0)
        sync()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(warmup)
    end.record()
    end.synchronize()
    est = max(start.elapsed_time(end), 1e-3)
    iters = int(min(max_iters, max(min_iters, target_ms // est)))
    sleeper = getattr(torch.cuda, "_sleep", None)
    # keep the GPU busy while the host enqueues the timed call (~2 GHz SM clock)
    cycles = int(min(max(3 * min(host, default=1e-4), 2e-5), 5e-3) * 2.0e9)
    pairs = []
    for i in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if sleeper is not None:
            sleeper(cycles)
        a.record()
        fn(warmup + 1 + i)
        b.record()
        pairs.append((a, b))
    sync()
    times = [a.elapsed_time(b) for a, b in pairs]
    method = "cuda events, median" + (", queue kept full" if sleeper else "")
    return Timing(statistics.median(times), min(times), iters, method)


def _time_ms_blockscale(fn: Callable[[int], Any], device: Any, warmup: int, target_ms: float,
                        min_iters: int, max_iters: int) -> Timing:
    if device is None:
        from blockscale import runtime

        device = runtime.get_device("cuda")
    for i in range(warmup):
        fn(i)
    device.synchronize()
    times: list[float] = []
    i = warmup
    while len(times) < max_iters and (len(times) < min_iters or sum(times) < target_ms):
        a, b = device.create_event(), device.create_event()
        a.record()
        fn(i)
        b.record()
        times.append(a.elapsed_ms(b))
        i += 1
    return Timing(statistics.median(times), min(times), len(times),
                  "cuda events (blockscale), median")


def first_run_s(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    """Run ``fn`` once, synchronize, and return (its result, wall seconds)."""
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def rotation_count(bytes_per_set: float, *, lo: int = 2, hi: int = 16,
                   factor: float = 3.0) -> int:
    """How many input sets to rotate so together they exceed ``factor`` x L2."""
    return int(min(hi, max(lo, math.ceil(factor * L2_BYTES / max(bytes_per_set, 1.0)))))


class Budget:
    """A wall-clock deadline shared by the suites of one run."""

    def __init__(self, seconds: float):
        self.start = time.monotonic()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def exhausted(self, reserve: float = 0.0) -> bool:
        return self.left() <= reserve


# ----------------------------------------------------------------------------- launch capture


@dataclasses.dataclass
class Launch:
    """One recorded kernel launch (the args keep their device buffers alive)."""

    kernel: Any
    grid: tuple[int, ...]
    args: list[Any]


@contextlib.contextmanager
def record_launches(dev: Any) -> Iterator[list[Launch]]:
    """Record every ``dev.launch`` inside the block (launches still run)."""
    launches: list[Launch] = []
    original = dev.launch

    def recording(kernel: Any, grid: Sequence[int], args: Sequence[Any],
                  stream: Any = None) -> None:
        launches.append(Launch(kernel, tuple(grid), list(args)))
        original(kernel, grid, args, stream)

    dev.launch = recording
    try:
        yield launches
    finally:
        del dev.launch


def replay(dev: Any, launches: Sequence[Launch]) -> None:
    """Launch the recorded kernels again, in order, on the same buffers."""
    for ln in launches:
        dev.launch(ln.kernel, ln.grid, ln.args)


def timed_launches(dev: Any, call: Callable[[], Any]) -> tuple[Any, float, list[Launch]]:
    """(``call()``'s result, the median ms of its launches replayed on the same buffers
    (:func:`time_ms`), the launches)."""
    with record_launches(dev) as launches:
        got = call()
    return got, time_ms(lambda i, ln=launches: replay(dev, ln), device=dev).ms, launches


def bundle_device() -> Any:
    """The CUDA device of a benchmark whose kernels come from the bundle
    (:func:`kernel_keys_without_mlir` first: the GPU machine has no MLIR)."""
    kernel_keys_without_mlir()
    from blockscale import runtime

    return runtime.get_device("cuda")


def kernel_keys_without_mlir() -> bool:
    """Workaround, active only where MLIR is not importable (the GPU machine): today
    ``blockscale.ops._core.generator_sources`` *imports* each ``KERNEL_SOURCES`` module to
    find its file, and those modules import mlir at import time, so no kernel key (hence no
    bundle lookup) can be computed there. Hand ``_core`` an ``importlib`` whose
    ``import_module`` returns, for a module not yet loaded, a stand-in carrying only the
    module's file path (from ``importlib.util.find_spec``, no import). The key is unchanged:
    the same files are hashed. Returns whether the workaround was applied."""
    import importlib
    import importlib.util
    import types

    from blockscale.ops import _core

    try:
        import mlir.ir  # noqa: F401
    except ImportError:
        pass
    else:
        return False

    stand_ins: dict[str, Any] = {}

    class _Importlib(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(importlib, name)

        @staticmethod
        def import_module(name: str, package: str | None = None) -> Any:
            if name in stand_ins:
                return stand_ins[name]
            try:
                return importlib.import_module(name, package)
            except ImportError:
                spec = importlib.util.find_spec(name, package)
                if spec is None or spec.origin is None:
                    raise
                stand_ins[name] = types.SimpleNamespace(__file__=spec.origin, __name__=name)
                return stand_ins[name]

    _core.importlib = _Importlib("importlib")
    return True


# ----------------------------------------------------------------------------- random operands


def random_bf16(rng: np.random.Generator, shape: Sequence[int], scale: float = 1.0
                ) -> np.ndarray:
    """Gaussian bf16 (never all zeros)."""
    return (rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(scale)).astype(
        ml_dtypes.bfloat16)


def random_bytes(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """Uniform random uint8 (fast, for large FP4 payloads: every byte is two valid E2M1)."""
    n = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(rng.bytes(n), dtype=np.uint8).reshape(tuple(shape))


def random_data(rng: np.random.Generator, fmt: Any, shape: Sequence[int]) -> np.ndarray:
    """Random payload of ``shape`` (last dim in bytes): FP4 pairs, or finite E4M3 for MXFP8."""
    b = random_bytes(rng, shape)
    if fmt.is_fp4:
        return b
    b = b.copy()
    b[(b & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    return b.view(ml_dtypes.float8_e4m3fn)


def random_scales(rng: np.random.Generator, fmt: Any, shape: Sequence[int]) -> np.ndarray:
    """Random block scales near 1: E4M3 0.25..3.0 (NVFP4) or E8M0 2^-3..2^3 (MX)."""
    b = random_bytes(rng, shape)
    if fmt.is_mx:
        return (np.uint8(124) + b % np.uint8(7)).view(ml_dtypes.float8_e8m0fnu)
    return (np.uint8(0x28) + b % np.uint8(29)).view(ml_dtypes.float8_e4m3fn)


def interleave_stack(s3: np.ndarray) -> np.ndarray:
    """``[E, R, J]`` row-major scales -> 6-D ``[E, ceil(R/128), ceil(J/4), 32, 4, 4]``
    (blockscale.layouts.interleave per expert, vectorized; zero padding)."""
    e, rows, kb = s3.shape
    d0, d1 = -(-rows // 128), -(-kb // 4)
    padded = np.zeros((e, d0 * 128, d1 * 4), dtype=np.uint8)
    padded[:, :rows, :kb] = s3.view(np.uint8)
    out = padded.reshape(e, d0, 4, 32, d1, 4).transpose(0, 1, 4, 3, 2, 5)
    return np.ascontiguousarray(out).view(s3.dtype)


# ----------------------------------------------------------------------------- checks

U32 = 2.0 ** -24


def check_rows(got: np.ndarray, exact: np.ndarray, abs_sum: np.ndarray, n_roundings: int,
               *, out_rel: float = 2.0 ** -8) -> tuple[bool, str]:
    """Elementwise check of bf16/fp32 outputs against a float64 ``exact``.

    Accepted: ``|got - exact| <= out_rel * |exact| + 1.01 * n * u32 * abs_sum`` (bf16
    rounding of the result plus ``n`` fp32 roundings of the accumulation; ``abs_sum`` is
    ``|A| @ |B|^T``). Returns (ok, text).
    """
    g = np.asarray(got, dtype=np.float64)
    err = np.abs(g - exact)
    bound = out_rel * np.abs(exact) + 1.01 * n_roundings * U32 * abs_sum + 1e-30
    bad = err > bound
    scale = float(np.max(np.abs(exact))) if exact.size else 0.0
    rel = float(err.max() / scale) if scale > 0 else float(err.max(initial=0.0))
    if not np.all(np.isfinite(g)):
        return False, f"FAIL: non-finite outputs ({int(np.sum(~np.isfinite(g)))})"
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        return False, (f"FAIL: {int(bad.sum())}/{bad.size} outside bound; first {i}: got "
                       f"{g[i]:.6g} want {exact[i]:.6g}")
    return True, f"ok ({g.shape[0]} rows, max rel err {rel:.1e})"


def check_rel(got: np.ndarray, exact: np.ndarray, tol: float) -> tuple[bool, str]:
    """Normwise relative check for baselines that round differently (bf16 / fp8 inputs)."""
    g = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(g)):
        return False, "FAIL: non-finite outputs"
    scale = float(np.max(np.abs(exact))) or 1.0
    rel = float(np.max(np.abs(g - exact)) / scale)
    ok = rel <= tol
    return ok, f"{'ok' if ok else 'FAIL'} ({g.shape[0]} rows, max rel err {rel:.1e}, tol {tol:g})"


def check_bytes(got: np.ndarray, want: np.ndarray, *, allow_fraction: float = 0.0
                ) -> tuple[bool, str]:
    """Byte comparison of quantized outputs; ``allow_fraction`` of differing bytes tolerated
    (0 by default: every quantize, the fused SiLU included, is bit-exact with the reference)."""
    g, w = np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)
    if g.shape != w.shape:
        return False, f"FAIL: shape {g.shape} != {w.shape}"
    diff = int(np.sum(g != w))
    if diff == 0:
        return True, "bit-exact"
    ok = diff <= allow_fraction * g.size
    return ok, f"{'ok' if ok else 'FAIL'}: {diff}/{g.size} bytes differ"
