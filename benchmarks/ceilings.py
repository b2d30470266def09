"""Hardware ceilings measured on the machine itself, for the roofline and the HBM floor.

* device-to-device copy bandwidth (bytes read + bytes written per second) of a 1 GiB buffer,
  through torch (or blockscale's ``Device.copy`` without torch);
* cuBLAS bf16 GEMM (``torch.matmul``) and FP8 GEMM (``torch._scaled_mm``, per-tensor and
  row-wise scales) at 8192^3 on random data, in TFLOP/s.

Each GEMM output is checked on a few rows against a float64 product of the same operands
before it is timed. Usage: ``python benchmarks/ceilings.py`` (or through benchmarks/run.py).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.common import Record, check_rel, failed, short_error, time_ms, with_rates

COPY_BYTES = 2 ** 30
GEMM = 8192


def copy_bandwidth(dev: Any = None) -> Record:
    """D2D copy of ``COPY_BYTES`` (two source buffers rotated); TB/s counts read + write."""
    params = {"bytes": COPY_BYTES}
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("torch sees no CUDA GPU")
        srcs = [torch.randint(0, 255, (COPY_BYTES,), dtype=torch.uint8, device="cuda")
                for _ in range(2)]
        dst = torch.empty_like(srcs[0])
        dst.copy_(srcs[0])
        torch.cuda.synchronize()
        if not torch.equal(dst, srcs[0]):
            return failed("ceiling", "D2D copy 1 GiB", "torch copy_", "bytes", "fail",
                          "FAIL: copy differs", params)
        t = time_ms(lambda i: dst.copy_(srcs[i % 2]))
        impl = "torch copy_"
    except ImportError:
        if dev is None:
            from blockscale import runtime

            dev = runtime.get_device("cuda")
        srcs = [dev.to_device(np.random.default_rng(i).integers(0, 255, COPY_BYTES, np.uint8))
                for i in range(2)]
        dst = dev.alloc((COPY_BYTES,), np.uint8)
        t = time_ms(lambda i: dev.copy(dst, srcs[i % 2]), device=dev)
        impl = "blockscale Device.copy"
    rec = Record("ceiling", "D2D copy 1 GiB", impl, "bytes", t.ms, "ok", "ok (bytes equal)",
                 params=params, note=t.method)
    return with_rates(rec, nbytes=2 * COPY_BYTES)


def _sample_check(c: Any, a: Any, b64: np.ndarray, rows: np.ndarray, tol: float
                  ) -> tuple[bool, str]:
    """``c[rows]`` against the float64 product of ``a[rows]`` (torch) and ``b64``."""
    exact = a[rows].double().cpu().numpy() @ b64.T
    return check_rel(c[rows].float().cpu().numpy(), exact, tol)


def gemm_ceilings() -> list[Record]:
    """cuBLAS bf16 and FP8 (per-tensor, row-wise) GEMM at ``GEMM``^3, TFLOP/s."""
    n = GEMM
    params = {"m": n, "n": n, "k": n}
    flops = 2.0 * n ** 3
    case = f"GEMM {n}^3"
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("torch sees no CUDA GPU")
    except ImportError as e:
        return [failed("ceiling", case, "cuBLAS bf16", "bf16", "unavailable", short_error(e),
                       params)]
    out: list[Record] = []
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    rows = torch.tensor([0, 1, n // 2, n - 1], device="cuda")
    b64 = b.double().cpu().numpy()
    ok, text = _sample_check(a @ b.T, a, b64, rows, 1e-2)
    if ok:
        t = time_ms(lambda i: a @ b.T)
        out.append(with_rates(Record("ceiling", case, "cuBLAS bf16 (torch.matmul)", "bf16",
                                     t.ms, "ok", text, params=params, note=t.method),
                              flops=flops))
    else:
        out.append(failed("ceiling", case, "cuBLAS bf16 (torch.matmul)", "bf16", "fail", text,
                          params))
    if not hasattr(torch, "_scaled_mm"):
        out.append(failed("ceiling", case, "cuBLAS fp8", "fp8", "unavailable",
                          "torch._scaled_mm missing", params))
        return out
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.to(torch.float8_e4m3fn)
    b8_64 = b8.double().cpu().numpy()
    one = torch.ones((), device="cuda", dtype=torch.float32)
    variants = {
        "cuBLAS fp8 per-tensor (torch._scaled_mm)": (one, one),
        "cuBLAS fp8 row-wise (torch._scaled_mm)": (
            torch.ones(n, 1, device="cuda", dtype=torch.float32),
            torch.ones(1, n, device="cuda", dtype=torch.float32)),
    }
    for name, (sa, sb) in variants.items():
        try:
            def run(i: int, sa: Any = sa, sb: Any = sb) -> Any:
                return torch._scaled_mm(a8, b8.T, scale_a=sa, scale_b=sb,
                                        out_dtype=torch.bfloat16)

            ok, text = _sample_check(run(0), a8, b8_64, rows, 1e-2)
            if not ok:
                out.append(failed("ceiling", case, name, "fp8", "fail", text, params))
                continue
            t = time_ms(run)
            out.append(with_rates(Record("ceiling", case, name, "fp8", t.ms, "ok", text,
                                         params=params, note=t.method), flops=flops))
        except Exception as e:  # noqa: BLE001 - an unsupported variant is recorded, not fatal
            out.append(failed("ceiling", case, name, "fp8", "unavailable", short_error(e),
                              params))
    return out


def measure(dev: Any = None) -> list[Record]:
    """Every ceiling: copy bandwidth first, then the GEMMs."""
    recs = [copy_bandwidth(dev)]
    recs += gemm_ceilings()
    return recs


def copy_tbps(records: list[Record]) -> float | None:
    """The measured D2D copy TB/s in ``records`` (None when it was not measured)."""
    for r in records:
        if r.suite == "ceiling" and r.case.startswith("D2D copy") and r.tbps:
            return r.tbps
    return None


if __name__ == "__main__":
    for r in measure():
        rate = f"{r.tbps:.2f} TB/s" if r.tbps else f"{r.tflops:.0f} TFLOP/s" if r.tflops else "-"
        ms = f"{r.ms:.3f} ms" if r.ms else "-"
        print(f"{r.case:18} {r.impl:44} {ms:>12} {rate:>14}  {r.check}")
