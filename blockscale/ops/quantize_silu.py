"""Fused gated activation + grouped quantize (SEMANTICS §7.5, D8, D10).

``z = act(gate, up)`` in float32 from bf16 ``gate_up [T, 2D]`` (gate = columns [0, D), up =
[D, 2D)), then the grouped quantize of :mod:`blockscale.ops.quantize_grouped` with the NVFP4
encode scale ``f32(1 / input_scales[expert])`` (by expert id, D8). The sigmoid uses an IEEE
division and blockscale's ``exp_f32`` (a fixed IEEE mul/add sequence, ``ops/_expf_ir.py``,
not ``math.exp``): bit-exact with the reference in the interpreter and on every GPU target.
No MLIR at import.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from blockscale.activations import GatedActivation
from blockscale.formats import Format
from blockscale.ops.quantize import QuantizeSpec, check_input
from blockscale.ops.quantize_grouped import (
    BULK_SCHEDULES,
    LARGE_GROUPED_ELEMENTS,
    SCHEDULES,
    STREAM_SCHEDULES,
    WIDE_SCHEDULES,
    _i32,
    check_groups,
    default_schedule,
    expert_scales_arg,
    run_grouped,
    search_offsets,
    vector_len,
    with_schedule,
)

#: most table entries (both signs) a sigmoid table may have (its shared-memory copy: 32 KiB)
MAX_LUT = 8192


@functools.cache
def sigmoid_lut(kind: str, alpha: float, limit: float) -> tuple[np.ndarray, int, int]:
    """The gated activation's sigmoid as a table over the bf16 gate (D10, bit-identical).

    ``sigmoid(v)`` (SILU: ``v = g``; SWIGLU_OAI: ``v = alpha * min(g, limit)``) depends only
    on the gate's 16 bf16 bits, and is constant for gate magnitudes (bits ``& 0x7FFF``) below
    some ``lo`` or above some ``hi`` (exp_f32's clamps, ``1 + e`` rounding to 1), per sign.
    Returns ``(table, lo, width)``: float32 ``[2 * width]``, entry ``sign * width +
    min(max(mag, lo), lo + width - 1) - lo`` is the sigmoid of every gate with that sign and
    magnitude (Inf included; a NaN gate reads a finite entry, but its product is NaN anyway).
    Computed with :func:`blockscale.activations.exp_f32` and an IEEE float32 division, and
    checked here over all 65536 gates.
    """
    from blockscale.activations import exp_f32

    bits = np.arange(1 << 16, dtype=np.uint32)
    g = (bits << 16).view(np.float32)
    one = np.float32(1.0)
    with np.errstate(all="ignore"):
        v = g if kind == "silu" else np.float32(alpha) * np.minimum(g, np.float32(limit))
        sig = one / (one + exp_f32(-v))
    sb = sig.view(np.uint32).reshape(2, 1 << 15)[:, :0x7F81]  # finite gates and Inf
    lo = min(int(np.argmax(row != row[0])) - 1 for row in sb)
    hi = max(0x7F80 - int(np.argmax(row[::-1] != row[-1])) for row in sb) + 1
    width = hi - lo + 1
    if lo < 0 or 2 * width > MAX_LUT:
        raise ValueError(f"activation {kind}(alpha={alpha}, limit={limit}): its sigmoid varies "
                         f"over gate magnitudes [{lo:#x}, {hi:#x}], more than {MAX_LUT} "
                         "table entries")
    mag = np.arange(1 << 15)
    idx = np.clip(mag, lo, hi) - lo
    table = np.concatenate([sig[:1 << 15][lo:hi + 1], sig[1 << 15:][lo:hi + 1]])
    for sign in (0, 1):  # every finite / infinite gate reads its own sigmoid
        got = table[sign * width + idx[:0x7F81]].view(np.uint32)
        if not np.array_equal(got, sb[sign]):
            raise AssertionError("sigmoid table does not reproduce the sigmoid")
    return table.astype(np.float32), lo, width


#: device copies of the sigmoid tables: (id(device), activation key) -> (device, array)
_DEVICE_LUTS: dict[tuple[int, tuple], tuple[Any, Any]] = {}


def _lut_buffer(dev: Any, key: tuple, host: bool) -> Any:
    """The sigmoid table of activation ``key`` for a launch: numpy for host-array calls
    (copied with the inputs), else one device copy per device and table, made on first use."""
    table = sigmoid_lut(*key)[0]
    if host:
        return table
    hit = _DEVICE_LUTS.get((id(dev), key))
    if hit is None or hit[0] is not dev:
        hit = (dev, dev.to_device(table))
        _DEVICE_LUTS[(id(dev), key)] = hit
    return hit[1]


#: the fused op's schedule on SILU_SCHEDULE_TARGETS when none is given. Measured on the H200
#: (T=8192 K=4096 E=64, GPU time; NVFP4 / MXFP4 / MXFP8): run J (2026-11-30) stream_lut
#: 0.0361 / 0.0348 / 0.0350 ms vs rows2_lut 0.0413 / 0.0352 / 0.0352 ms and tiles 0.0547 /
#: 0.0539 / 0.0489 ms; run P: wide_lut 0.0355 / 0.0325 / 0.0311 ms vs stream_lut 0.0355 / 0.0343 /
#: 0.0338 (wide, without the table, 0.059 / 0.058 / 0.052). Other targets: DEFAULT_SCHEDULE
#: (not measured). Run Q: wide_bulk2_lut (a cp.async.bulk ring of rows) 0.0344 / 0.0322 / 0.0320
#: ms vs wide_lut 0.0357 / 0.0329 / 0.0317.
DEFAULT_SILU_SCHEDULE = "wide_bulk2_lut"
SILU_SCHEDULE_TARGETS = ("sm_90a",)
#: per-format overrides of DEFAULT_SILU_SCHEDULE: one chunk a thread visit, 3 resident blocks
#: an SM instead of 2 (session 13, run CI, T=8192 D=2048 E=64, ms, two runs): NVFP4 0.0327 /
#: 0.0326 vs 0.0348 / 0.0343, MXFP8 0.0300 / 0.0304 vs 0.0310 / 0.0314; MXFP4 slower (0.0312 /
#: 0.0311 vs 0.0303 / 0.0306), kept
SILU_SCHEDULE_BY_FORMAT = {"nvfp4": "wide1_bulk2_lut", "mxfp8": "wide1_bulk2_lut"}
#: from LARGE_GROUPED_ELEMENTS output elements (rows x D) on, these formats run their kernel
#: on two resident waves of blocks. Run CF (H200, T=16384, D=4096, E=64, ms, two runs):
#: NVFP4 0.0967 / 0.0961 vs 0.0988 / 0.0987, MXFP8 0.0969 / 0.0964 vs 0.1008 / 0.1002; MXFP4
#: slower there (0.0947 / 0.0944 vs 0.0916 / 0.0915). Run CI (one chunk a visit, session 13):
#: NVFP4 0.0937 / 0.0931 (run CJ 0.0935) vs two chunks 0.0969 / 0.0960, MXFP8 0.0939 / 0.0931
#: vs 0.0955 / 0.0946; MXFP4 0.0919 / 0.0912 vs one wave of two chunks 0.0914 / 0.0912, kept.
#: Run CL: MXFP8 on four waves 0.0895 / 0.0898 vs two 0.0922 / 0.0924 (three 0.0906 / 0.0908);
#: NVFP4 best on two (0.0916 / 0.0921 vs three 0.0939 / 0.0935, four 0.0970 / 0.0968)
LARGE_SILU_SCHEDULE_BY_FORMAT = {"nvfp4": "wide1_bulk2_lut_x2", "mxfp8": "wide1_bulk2_lut_x4"}


def _default_schedules() -> tuple[str, ...]:
    """The schedules :func:`silu_default` picks for some format and size (bundled)."""
    return tuple(dict.fromkeys((*SILU_SCHEDULE_BY_FORMAT.values(),
                                *LARGE_SILU_SCHEDULE_BY_FORMAT.values())))


def silu_default(fmt: str, elements: int = 0) -> str:
    """The fused op's schedule for format ``fmt`` and ``elements`` output elements (rows x
    D) on SILU_SCHEDULE_TARGETS when none is given."""
    if elements >= LARGE_GROUPED_ELEMENTS and fmt in LARGE_SILU_SCHEDULE_BY_FORMAT:
        return LARGE_SILU_SCHEDULE_BY_FORMAT[fmt]
    return SILU_SCHEDULE_BY_FORMAT.get(fmt, DEFAULT_SILU_SCHEDULE)


def _spec(fmt: Format, target: str, act: GatedActivation, aligned: bool,
          schedule: str | None = None, num_groups: int | None = None,
          elements: int = 0) -> QuantizeSpec:
    schedule = default_schedule(schedule, target, silu_default(fmt.name, elements),
                                SILU_SCHEDULE_TARGETS)
    return with_schedule(QuantizeSpec(fmt.name, target, None, "tcgen5d", aligned, "silu",
                                      False, act.kind, float(act.alpha), float(act.limit),
                                      name="fused_silu_quantize"), schedule, num_groups)


def fused_silu_quantize(gate_up: Any, fmt: Format | str, expert_start: Any, scales_offsets: Any,
                        expert_ids: Any, input_scales: Any, *,
                        activation: GatedActivation | str | None = None,
                        num_scale_tiles: int | None = None, device: Any = None,
                        target: str | None = None, schedule: str | None = None
                        ) -> tuple[Any, Any]:
    """Gated activation then grouped quantize; arguments and results as
    :func:`blockscale.reference.fused_silu_quantize` plus ``device`` and ``target``.

    ``input_scales``: float32 ``[E]`` NVFP4 activation scales by expert id, not inverted
    (required for NVFP4, None for MX). ``activation``: SILU (default) or SWIGLU_OAI.
    ``schedule``: kernel schedule (:data:`blockscale.ops.quantize_grouped.SCHEDULES`, None:
    the default one); every schedule gives the same bytes.
    """
    from blockscale.ops._matmul_host import device_and_target

    fmt = Format.from_name(fmt)
    act = GatedActivation.parse(activation)
    t, two_d = check_input(gate_up, "gate_up")
    if two_d % 2:
        raise ValueError(f"gate_up.shape[1] must be even (gate then up), got {two_d}")
    d = two_d // 2
    fmt.check_k(d, "gate_up.shape[1] // 2")
    ng = vector_len(expert_ids, "expert_ids")
    if num_scale_tiles is None:
        num_scale_tiles = -(-t // 128) + ng
    elif isinstance(num_scale_tiles, bool) or not isinstance(num_scale_tiles, (int, np.integer)) \
            or num_scale_tiles < 0:
        raise ValueError(f"num_scale_tiles must be a non-negative int, got {num_scale_tiles!r}")
    check_groups(expert_start, scales_offsets, expert_ids, t, num_scale_tiles)
    scales = expert_scales_arg(fmt, input_scales, "input_scales", expert_ids)
    dev, tgt = device_and_target(device, target)
    spec = _spec(fmt, tgt, act, d % 8 == 0, schedule, ng, t * d)
    buffers = {"x": gate_up, "expert_start": _i32(expert_start),
               "scales_offsets": _i32(search_offsets(expert_start, scales_offsets)),
               "expert_ids": _i32(expert_ids),
               "tensor_sf": scales}
    if getattr(spec, "lut", False):
        host = all(isinstance(v, np.ndarray) for v in buffers.values())
        buffers["sig_table"] = _lut_buffer(
            dev, (spec.activation, spec.act_alpha, spec.act_limit), host)
    if t == 0 and isinstance(gate_up, np.ndarray):
        return (np.zeros((0, fmt.data_cols(d)), fmt.elem_dtype),
                np.zeros((num_scale_tiles, -(-fmt.kblocks(d) // 4), 32, 4, 4), fmt.scale_dtype))
    return run_grouped(spec, gate_up, d, t, num_scale_tiles, buffers, {"num_groups": ng}, dev)


def fused_silu_quantize_kernel(fmt: Format | str, target: str = "sm_90a", *,
                               activation: GatedActivation | str | None = None,
                               aligned: bool = True, schedule: str | None = None) -> Any:
    """Compiled Kernel of the fused activation + quantize kernel."""
    from blockscale.ops.quantize import kernel

    return kernel(_spec(Format.from_name(fmt), target, GatedActivation.parse(activation),
                        aligned, schedule))


def bundle_specs(target: str = "sm_90a") -> list[QuantizeSpec]:
    """Fused SiLU / SwiGLU-OAI quantize specs for the GPU tests and benchmarks (every format
    and schedule)."""
    return [_spec(Format.from_name(f), target, a, True, sch)
            for sch in (SCHEDULES + STREAM_SCHEDULES + WIDE_SCHEDULES[:2] + BULK_SCHEDULES[1:2]
                        + ("wide_bulk2_lut_x2",) + _default_schedules())
            for f in ("nvfp4", "mxfp4", "mxfp8")
            for a in (GatedActivation.SILU, GatedActivation.SWIGLU_OAI)]


__all__ = ["MAX_LUT", "bundle_specs", "fused_silu_quantize", "fused_silu_quantize_kernel",
           "sigmoid_lut"]


import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)

_core.register_op_module(__name__)
