"""Shared pieces of the two-phase matmul's pair tests (a launch knob on vs off must write
the same bytes): the operand pair runner and the H200 pair grid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_matmul_common import random_dense_case

from blockscale.formats import Format
from blockscale.ops import matmul_twophase as TP


def dense_operands(fmt: str, m: int, n: int, k: int,
                   seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Format]:
    """(a, b, sfa, sfb, format) of one random dense case (rng ``seed``), the scales in the
    5-d layout."""
    fmt_ = Format.from_name(fmt)
    a, b, _, _, sfa5, sfb5 = random_dense_case(np.random.default_rng(seed), fmt_, m, n, k)
    return a, b, sfa5, sfb5, fmt_


def knob_pair(fmt: str, m: int, n: int, k: int, knob: str, on: Any, off: Any, *, seed: int,
              device: str = "interp", **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    """(the two-phase matmul with ``knob=on`` and ``kw``, the same with ``knob=off``) of one
    random dense case (rng ``seed``), alpha 0.375."""
    ops = dense_operands(fmt, m, n, k, seed)
    run = lambda v: TP.block_scaled_matmul_twophase(*ops, alpha=0.375, device=device,
                                                    **{knob: v}, **kw)
    return run(on), run(off)


def dispatch_runs(monkeypatch: Any, env: str, value: str,
                  ops: tuple) -> tuple[np.ndarray, list[Any]]:
    """``block_scaled_matmul``'s dispatch of ``ops`` (a, b, sfa, sfb, format) in the
    interpreter with the environment switch ``env=value`` (two-phase from M = 100): (C, the
    two-phase phase-2 specs it ran)."""
    from blockscale.ops import matmul

    monkeypatch.setattr(TP, "MIN_M", 100)
    monkeypatch.setenv(env, value)
    launched: list[Any] = []
    real = TP._run
    monkeypatch.setattr(TP, "_run", lambda spec, *x: launched.append(spec) or real(spec, *x))
    got = matmul.block_scaled_matmul(*ops, device="interp", target="sm_90a")
    return got, launched


def gpu_pair_grid(test: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``test(shape, fmt, bn, out_dtype)`` gpu / cuda and parametrize it over the
    H200 pair grid: both formats, a large and a ragged shape, bn 256 / 240, f32 / bf16."""
    test = pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])(test)
    test = pytest.mark.parametrize("bn", [256, 240], ids=lambda b: f"bn{b}")(test)
    test = pytest.mark.parametrize("shape", [(8192, 5760, 2944), (300, 264, 512)],
                                   ids=lambda s: "x".join(map(str, s)))(test)
    test = pytest.mark.parametrize("fmt", TP.FORMATS)(test)
    return pytest.mark.gpu(pytest.mark.cuda(test))
