"""Grouped (per-expert) dynamic quantization (SEMANTICS §2.5, D7, D8, D9, D11).

Rows sorted by expert are quantized with their expert's tensor scale (indexed by expert id);
scales go to the padded, expert-relative 5-D placement ``tile0(g) = expert_start[g] // 128 +
scales_offsets[g]``. Every output byte is written by the kernel: rows and tiles of groups
with expert id -1 and all spare tiles are zero. The kernel is the one of
:mod:`blockscale.ops.quantize_ir` in mode "grouped". No MLIR at import.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blockscale.formats import Format
from blockscale.ops import quantize as _q
from blockscale.ops.quantize import (
    QuantizeSpec,
    check_input,
    launch,
    launch_plan,
    out_dtypes,
)

#: kernel schedules of the grouped / fused quantize ops: "tiles" (the tile kernel of
#: quantize_ir, one block per slice of a 5-D tile) or "rows" / "rows2" (quantize_moe_ir: one
#: resident wave walking data rows, 1 or 2 row groups in flight per thread); "*_lut": the
#: fused op reads its sigmoid from a table indexed by the bf16 gate (quantize_silu.sigmoid_lut,
#: bit-identical), the grouped op runs the same kernel as without
SCHEDULES = ("tiles", "rows", "rows2", "rows_lut", "rows2_lut")
#: the "stream" schedules (:mod:`blockscale.ops._quantize_stream_ir`: the dense pipelined
#: loop over data rows, per-thread group state, no shared tables; "stream2": the next row
#: group's loads issued before this one's math); also accepted by the ops, not in SCHEDULES
#: (whose order the tests and the bundle index)
STREAM_SCHEDULES = ("stream", "stream2", "stream_lut", "stream2_lut")
#: the "wide" schedules (:mod:`blockscale.ops._quantize_wide_ir`: the stream loop with 2
#: (``wide4``: 4, grouped only) 16-element chunks of a row per thread visit, ring prefetch,
#: the block's first group from a warp count); also accepted by the ops, not in SCHEDULES;
#: "*_lut" as for the others (the fused op's sigmoid table; the grouped op: same kernel)
WIDE_SCHEDULES = ("wide", "wide_lut", "wide4", "wide4_lut", "wide_deep", "wide_deep_lut")
#: the "wide_bulk<S>" schedules (sm_90a: the wide kernel fed by a shared ring of S row groups
#: filled with ``cp.async.bulk`` row spans, :func:`blockscale.ops._quantize_wide_ir._bulk_body`);
#: "*_lut" as for the others. Also accepted by the ops, not in SCHEDULES. "wide1_bulk2_lut"
#: (fused op only): one chunk a thread visit, half the stage bytes and registers, so 3
#: resident blocks an SM at 80 registers instead of 2 at 128 (the grouped kernel, already at
#: 4 blocks, was 4-12 % slower with one chunk at 5 or 6 blocks: run CJ)
BULK_SCHEDULES = ("wide_bulk2", "wide_bulk2_lut", "wide_bulk3", "wide_bulk3_lut",
                  "wide_bulk4", "wide_bulk4_lut", "wide1_bulk2_lut")
#: the "<wide schedule>_x<W>" schedules: the same kernel as the wide / bulk schedule before the
#: suffix, launched with W times its resident wave of blocks (``MoeQuantizeSpec.waves``: each
#: block walks a W times shorter contiguous share of the row groups; blocks that finish
#: early are replaced by waiting ones, so SMs that the memory system serves faster take
#: more of the work, at the cost of W times the blocks' prologues). Also accepted by the
#: ops, not in SCHEDULES. The grouped op's large-input default and (session 12, run CF) the
#: fused op's for NVFP4 / MXFP8 from 2^26 output elements; the other "_x2" / "_x4" forms and
#: the fused op's "*_plut" product tables were removed in session 6 (measured slower: runs T /
#: U). Session 13 (run CL): the bulk kernels' "_x3" / "_x4" (large MX defaults)
WAVE_SCHEDULES = ("wide_bulk2_x2", "wide_bulk2_lut_x2", "wide1_bulk2_lut_x2",
                  "wide_bulk2_x3", "wide_bulk2_x4", "wide1_bulk2_lut_x4")
#: launch waves a "_x<W>" schedule may ask for
WAVES = (1, 2, 3, 4)
#: shared memory an SM gives its blocks (H200: 228 KB, 1 KB of it reserved per block)
SM_SHARED_BYTES, BLOCK_RESERVED_SHARED = 228 * 1024, 1024
#: most blocks per SM of a bulk kernel (its register cap is 65536 / (256 x blocks))
BULK_MAX_BLOCKS = 4
#: nvvm.maxnreg of the wide-schedule CUDA kernels by (mode, chunks, lut); blocks per SM =
#: 65536 // (256 * cap). Grouped wide at 48 spilled 48-60 words; wide4 at 64 / 80 spilled
#: 156-236 / 64-80 (NVFP4 still 52 at 96): the four chunks' loop-invariant columns
WIDE_REGISTER_CAPS = {("grouped", 2, False): 64, ("grouped", 4, False): 128,
                      ("silu", 2, False): 80, ("silu", 2, True): 80,
                      ("silu", 4, False): 128, ("silu", 4, True): 128}
#: nvvm.maxnreg of the "wide_deep" kernels (2 chunks, loads two row groups ahead)
WIDE_DEEP_REGISTER_CAP = 80
#: the schedule used when an op is called with ``schedule=None``
DEFAULT_SCHEDULE = "tiles"
#: the grouped op's schedule on GROUPED_SCHEDULE_TARGETS when none is given. Measured on the
#: H200 (run J, 2026-11-30, T=8192 K=4096 E=64, GPU time): stream2 0.0382 / 0.0341 / 0.0393 ms
#: (NVFP4 / MXFP4 / MXFP8) vs tiles 0.0415 / 0.0409 / 0.0429 ms; run P: wide 0.0373 / 0.0316 /
#: 0.0341 ms vs stream2 0.0383 / 0.0339 / 0.0392 (wide4 0.0361 / 0.0341 / 0.0361, wide_deep
#: 0.0387 / 0.0319 / 0.0352); other targets: not measured
DEFAULT_GROUPED_SCHEDULE = "wide"
GROUPED_SCHEDULE_TARGETS = ("sm_90a",)
#: per-format overrides of DEFAULT_GROUPED_SCHEDULE (format name -> schedule; empty: every
#: format runs DEFAULT_GROUPED_SCHEDULE). Run T (H200, T=8192 K=4096 E=64, ms): NVFP4 wide4
#: 0.0355 vs wide 0.0373, MXFP8 wide_bulk2_x2 0.0335 vs wide 0.0343, MXFP4 wide best (0.0316);
#: run U the same (0.0357 / 0.0375, 0.0336 / 0.0343)
DEFAULT_GROUPED_SCHEDULE_BY_FORMAT: dict[str, str] = {"nvfp4": "wide4", "mxfp8": "wide_bulk2_x2"}
#: from this many input elements (rows x K) on, every format runs LARGE_GROUPED_SCHEDULE: the
#: two resident waves of the bulk-ring kernel win once the grid is many waves deep. Runs Z / AA
#: (H200, E=64, ms): T=16384 K=8192 (134 M) wide_bulk2_x2 vs the per-format default: NVFP4
#: 0.1121 vs wide4 0.1333, MXFP4 0.0975 vs wide 0.1035, MXFP8 (already x2) 0.1146; at T=16384
#: K=2880 (47 M) NVFP4 wide4 0.0520 vs x2 0.0602, MXFP4 wide 0.0522 / x2 0.0499, MXFP8 x2 0.0454
LARGE_GROUPED_ELEMENTS = 1 << 26
LARGE_GROUPED_SCHEDULE = "wide_bulk2_x2"
#: per-format overrides of LARGE_GROUPED_SCHEDULE: the same kernel on more resident waves.
#: Run CL (session 13, T=16384 K=8192, ms, two runs): MXFP4 x3 0.0942 / 0.0941 vs x2 0.0972 /
#: 0.0968 (x4 0.0948 / 0.0944), MXFP8 x4 0.1109 / 0.1107 vs x2 0.1148 / 0.1143 (x3 0.1128 /
#: 0.1124); NVFP4 best on x2 (x3 0.1074 / 0.1066, x4 0.1094 / 0.1095 vs 0.1056 / 0.1050)
LARGE_GROUPED_SCHEDULE_BY_FORMAT: dict[str, str] = {"mxfp4": "wide_bulk2_x3",
                                                    "mxfp8": "wide_bulk2_x4"}


def grouped_default(fmt: str, elements: int = 0) -> str:
    """The grouped op's schedule for format ``fmt`` and an input of ``elements`` (rows x K) on
    GROUPED_SCHEDULE_TARGETS when none is given: from LARGE_GROUPED_ELEMENTS on its
    LARGE_GROUPED_SCHEDULE_BY_FORMAT entry, else LARGE_GROUPED_SCHEDULE; below, its
    DEFAULT_GROUPED_SCHEDULE_BY_FORMAT entry, else DEFAULT_GROUPED_SCHEDULE."""
    if elements >= LARGE_GROUPED_ELEMENTS:
        return LARGE_GROUPED_SCHEDULE_BY_FORMAT.get(fmt, LARGE_GROUPED_SCHEDULE)
    return DEFAULT_GROUPED_SCHEDULE_BY_FORMAT.get(fmt, DEFAULT_GROUPED_SCHEDULE)


def default_schedule(schedule: str | None, target: str, default: str,
                     targets: tuple[str, ...]) -> str | None:
    """``schedule`` when given, else ``default`` (the one measured fastest) on ``targets``,
    else None (:func:`with_schedule`: DEFAULT_SCHEDULE). The grouped and fused ops' choice."""
    return default if schedule is None and target in targets else schedule


#: SMs of the GPU the rows schedule sizes its single wave for (H200)
NUM_SMS = 132
#: modules whose source enters the key of a MoeQuantizeSpec kernel (quantize_silu: the sigmoid
#: table's window is built into the table kernels)
KERNEL_SOURCES = _q.KERNEL_SOURCES + ("blockscale.ops.quantize_moe_ir",
                                       "blockscale.ops.quantize_silu",
                                       "blockscale.ops._quantize_stream_ir",
                                       "blockscale.ops._quantize_wide_ir")
#: nvvm.maxnreg of the rows-schedule CUDA kernels by (mode, unroll); blocks per SM =
#: 65536 // (256 * cap): 5, 4, 4, 3
REGISTER_CAPS = {("grouped", 1): 48, ("grouped", 2): 64, ("silu", 1): 64, ("silu", 2): 80}
#: nvvm.maxnreg of the stream-schedule CUDA kernels by (mode, unroll, lut): blocks per SM =
#: 65536 // (256 * cap). Grouped "stream2" spills 20-32 words at 40; fused "stream2" with
#: exp_f32 spilled 16-68 words at 64. Exception: STREAM_CAP_40.
STREAM_REGISTER_CAPS = {("grouped", 1, False): 48, ("grouped", 2, False): 48,
                        ("silu", 1, False): 64, ("silu", 2, False): 80,
                        ("silu", 1, True): 64, ("silu", 2, True): 64}
#: formats whose grouped "stream" kernel fits 40 registers without spills (NVFP4 39, MXFP8
#: 40; MXFP4 spills 36 words): 6 blocks per SM, as the dense pipelined p1 kernel
STREAM_CAP_40 = ("nvfp4", "mxfp8")


def wide_register_cap(spec: MoeQuantizeSpec) -> int:
    """nvvm.maxnreg of a wide-schedule CUDA kernel."""
    if spec.bulk:
        return bulk_register_cap(spec)
    if spec.unroll == 2:
        return WIDE_DEEP_REGISTER_CAP
    return WIDE_REGISTER_CAPS[(spec.mode, spec.wide, spec.lut)]


#: rows of scale bytes an NVFP4 bulk kernel collects in shared memory before writing them
#: (``_quantize_wide_ir._ScaleStage``)
SCALE_STAGE_ROWS = 8
#: most rows a wide kernel's row group has (256 threads x 2 chunks, >= 4 chunks a block row)
MAX_GROUP_ROWS = 128


def stages_scales(spec: MoeQuantizeSpec) -> bool:
    """Whether the bulk kernel of ``spec`` writes its scale bytes through shared memory
    (``_quantize_wide_ir._ScaleStage``; NVFP4: a byte a thread's chunk; two ring stages, the
    default schedules': with three or four its 10 KB would cost a resident block)."""
    return spec.bulk == 2 and spec.fmt == "nvfp4" and spec.wide in (1, 2)


def scale_stage_bytes(spec: MoeQuantizeSpec) -> int:
    """Static shared bytes of the scale stage of ``spec``'s kernel (0 where it has none):
    two sets of SCALE_STAGE_ROWS rows' records and row bases."""
    if not stages_scales(spec):
        return 0
    return 2 * SCALE_STAGE_ROWS * 256 * spec.wide + 2 * MAX_GROUP_ROWS * 8


def bulk_blocks_per_sm(spec: MoeQuantizeSpec) -> int:
    """Resident blocks per SM of a bulk-schedule kernel: its ring, mbarriers and static
    tables (NVFP4 reciprocals 2 KB and staged scales 10 KB, the sigmoid table 32 KB) in
    SM_SHARED_BYTES, at most BULK_MAX_BLOCKS."""
    static = ((4 * 128 * 4 if spec.fmt == "nvfp4" else 0) + (4 * 8192 if spec.lut else 0)
              + scale_stage_bytes(spec))
    per = spec.dynamic_shared_bytes + static + BLOCK_RESERVED_SHARED
    return max(1, min(BULK_MAX_BLOCKS, SM_SHARED_BYTES // per))


def bulk_register_cap(spec: MoeQuantizeSpec) -> int:
    """nvvm.maxnreg of a bulk-schedule kernel: the registers of bulk_blocks_per_sm blocks."""
    return min(128, 65536 // (256 * bulk_blocks_per_sm(spec)) // 8 * 8)


def stream_register_cap(spec: MoeQuantizeSpec) -> int:
    """nvvm.maxnreg of a stream-schedule CUDA kernel."""
    if spec.mode == "grouped" and spec.unroll == 1 and spec.fmt in STREAM_CAP_40:
        return 40
    return STREAM_REGISTER_CAPS[(spec.mode, spec.unroll, spec.lut)]


@dataclasses.dataclass(frozen=True)
class MoeQuantizeSpec(QuantizeSpec):
    """A grouped / fused quantize kernel on the rows schedule (:mod:`.quantize_moe_ir`).

    ``unroll``: row groups a thread loads before quantizing them (1 = "rows", 2 = "rows2").
    ``lut``: mode "silu" only: the sigmoid comes from a shared-memory table indexed by the
    bf16 gate (:func:`blockscale.ops.quantize_silu.sigmoid_lut`) instead of exp_f32 + div.rn.
    ``stream``: the stream schedule; ``wide``: chunks per thread visit of the wide schedule
    (0: not wide); ``bulk``: row groups in the wide schedule's shared ring (0: no ring, the
    loads go to registers); ``waves``: wide schedules' grid in resident waves of blocks
    (:func:`wide_plan`; the kernel does not depend on it).
    """

    unroll: int = 1
    lut: bool = False
    stream: bool = False
    wide: int = 0
    bulk: int = 0
    waves: int = 1

    @property
    def stage_bytes(self) -> int:
        """Bytes of one ring stage: a row group's 256 x ``wide`` chunks of 16 bf16 (fused:
        gate and up)."""
        return 32 * 256 * self.wide * (2 if self.mode == "silu" else 1)

    @property
    def dynamic_shared_bytes(self) -> int:
        """The bulk ring (``bulk`` stages), its ``bulk`` mbarriers and with ``lut`` the
        sigmoid table copy's; 0 without a ring."""
        return self.bulk * (self.stage_bytes + 8) + 8 * self.lut if self.bulk else 0

    def build_facts(self) -> dict[str, int]:
        """What the wide kernels' generator reads from this module's tunables (the register
        cap, from BULK_MAX_BLOCKS and the shared budget) rather than the fields: part of the
        kernel key, so a test that patches them compiles (and caches) a kernel of its own."""
        return {"maxnreg": wide_register_cap(self)} if self.wide else {}

    def args(self) -> tuple[Any, ...]:
        from blockscale.launch import KernelArg

        extra = (KernelArg("sig_table", "buffer", "float32"),) if self.lut else ()
        return _q.kernel_args(self) + extra

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in ("grouped", "silu"):
            raise ValueError(f"mode must be 'grouped' or 'silu' for the rows schedule, "
                             f"got {self.mode!r}")
        if self.unroll not in (1, 2):
            raise ValueError(f"unroll must be 1 or 2, got {self.unroll!r}")
        if self.wide not in (0, 1, 2, 4) or (self.wide == 1 and not (
                self.bulk and self.mode == "silu")):
            raise ValueError(f"wide must be 0, 2 or 4 (1: fused bulk kernels), got "
                             f"wide={self.wide!r} mode={self.mode!r} bulk={self.bulk!r}")
        if self.lut and self.mode != "silu":
            raise ValueError(f"lut needs mode 'silu', got mode {self.mode!r}")
        if self.bulk not in (0, 2, 3, 4) or (self.bulk and (
                self.wide not in (1, 2) or self.unroll != 1 or self.target != "sm_90a")):
            raise ValueError(f"bulk must be 0 or 2-4 ring stages of a wide (1-2 chunks, unroll 1) "
                             f"sm_90a kernel, got bulk={self.bulk!r} wide={self.wide!r} "
                             f"unroll={self.unroll!r} target={self.target!r}")
        if self.waves not in WAVES or (self.waves != 1 and not self.wide):
            raise ValueError(f"waves must be one of {WAVES} (more than 1: wide schedules "
                             f"only), got waves={self.waves!r} wide={self.wide!r}")

    @property
    def kernel_name(self) -> str:
        kind = "stream" if self.stream else "rows"
        if self.wide:
            kind, n = ("wide" if self.unroll == 1 else "wided"), self.wide
            if self.bulk:
                kind, n = f"wide{n}_bulk", self.bulk
        else:
            n = self.unroll
        return (f"{super().kernel_name}_{kind}{n}"
                + ("_lut" if self.lut else "")
                + (f"_x{self.waves}" if self.waves != 1 else ""))


def build(spec: MoeQuantizeSpec) -> Any:
    """The kernel module of a rows-, stream- or wide-schedule spec (imports MLIR)."""
    if spec.wide:
        from blockscale.ops import _quantize_wide_ir

        return _quantize_wide_ir.build(spec)
    if spec.stream:
        from blockscale.ops import _quantize_stream_ir

        return _quantize_stream_ir.build(spec)
    from blockscale.ops import quantize_moe_ir

    return quantize_moe_ir.build(spec)


def with_schedule(spec: QuantizeSpec, schedule: str | None, num_groups: int | None = None
                  ) -> QuantizeSpec:
    """``spec`` on ``schedule`` (None: DEFAULT_SCHEDULE). The rows schedules hold at most
    quantize_moe_ir.MAX_GROUPS (256) groups in shared memory: with more, the tile kernel runs
    (same bytes)."""
    from blockscale.ops._matmul_host import check_choice

    schedule = DEFAULT_SCHEDULE if schedule is None else schedule
    check_choice(schedule, SCHEDULES + STREAM_SCHEDULES + WIDE_SCHEDULES + BULK_SCHEDULES
                 + WAVE_SCHEDULES, "schedule")
    waves = 1
    if schedule in WAVE_SCHEDULES:
        schedule, w = schedule.rsplit("_x", 1)
        waves = int(w)
    if schedule.startswith("wide1") and spec.mode != "silu":
        raise ValueError(f"schedule {schedule!r} is the fused op's (fused_silu_quantize) only, "
                         f"got it for mode {spec.mode!r}")
    wide = schedule.startswith("wide")
    stream = schedule.startswith("stream")
    if schedule == "tiles" or ((stream or wide) and not spec.aligned) or (
            not stream and num_groups is not None and num_groups > 256):
        return spec
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(QuantizeSpec)}
    if wide:
        base = schedule.removesuffix("_lut")
        bulk = int(base[-1]) if base.startswith(("wide_bulk", "wide1_bulk")) else 0
        if bulk and spec.target != "sm_90a":
            return spec  # the ring is sm_90a's cp.async.bulk: the tile kernel elsewhere
        return MoeQuantizeSpec(**fields, lut=schedule.endswith("_lut") and spec.mode == "silu",
                               wide=4 if base == "wide4" else 1 if base.startswith("wide1")
                               else 2,
                               unroll=2 if base == "wide_deep" else 1, bulk=bulk, waves=waves)
    return MoeQuantizeSpec(**fields, unroll=2 if schedule.removesuffix("_lut")[-1] == "2"
                           else 1, lut=schedule.endswith("_lut") and spec.mode == "silu",
                           stream=stream)


def stream_plan(spec: MoeQuantizeSpec, m: int, k: int, n_tiles: int
                ) -> tuple[tuple[int, int, int], dict[str, int]]:
    """Grid and scalars of the stream schedule: the tile plan's x split and chunk geometry,
    ``gy`` = one resident wave (NUM_SMS x blocks per SM at the register cap), no more than
    there are row groups."""
    grid, sc = launch_plan(spec, m, k, n_tiles)
    gx = grid[0]
    rpb = 256 >> sc["cb_log2"]
    cap = stream_register_cap(spec)
    resident = NUM_SMS * (65536 // (256 * cap))
    sc.update(split_log2=0, tiles_per_step=1, tile_iters=1)
    return (gx, max(1, min(-(-m // rpb), resident // gx)), 1), sc


def wide_plan(spec: MoeQuantizeSpec, m: int, k: int, n_tiles: int
              ) -> tuple[tuple[int, int, int], dict[str, int]]:
    """Grid and scalars of the wide schedule: the tile plan's x split (``cb_log2``: chunks
    a block covers per row, log2; ``spec.wide`` per thread), ``gy`` = ``spec.waves``
    resident waves, no more than there are row groups of ``256 * wide >> cb_log2`` rows."""
    grid, sc = launch_plan(spec, m, k, n_tiles)
    gx = grid[0]
    lanes = spec.format.block_size // 16
    if (1 << sc["cb_log2"]) < spec.wide * lanes:  # never for a valid K (NVFP4 >= 4, MX >= 8)
        raise ValueError(f"the wide schedule needs >= {spec.wide * lanes} chunks per block "
                         f"row, got {1 << sc['cb_log2']} (k={k})")
    rpb = (256 * spec.wide) >> sc["cb_log2"]
    per_sm = (bulk_blocks_per_sm(spec) if spec.bulk
              else 65536 // (256 * wide_register_cap(spec)))
    resident = NUM_SMS * per_sm * spec.waves
    sc.update(split_log2=0, tiles_per_step=1, tile_iters=1)
    return (gx, max(1, min(-(-m // rpb), resident // gx)), 1), sc


def rows_plan(spec: MoeQuantizeSpec, m: int, k: int, n_tiles: int, ng: int
              ) -> tuple[tuple[int, int, int], dict[str, int]]:
    """Grid and scalars of the rows schedule: the tile plan's x split and chunk geometry,
    ``gy`` = one resident wave of blocks (NUM_SMS x blocks per SM at the register cap), no
    more than there are units."""
    grid, sc = launch_plan(spec, m, k, n_tiles)
    gx = grid[0]
    rows_per_unit = (256 >> sc["cb_log2"]) * spec.unroll
    units = -(-m // rows_per_unit) + ng + n_tiles
    cap = REGISTER_CAPS[(spec.mode, spec.unroll)]
    resident = NUM_SMS * (65536 // (256 * cap))
    sc.update(split_log2=0, tiles_per_step=1, tile_iters=1)
    return (gx, max(1, min(units, resident // gx)), 1), sc


def _host_int(v: Any, arg: str, n: int | None = None) -> np.ndarray | None:
    """int32 copy of a 1-D numpy integer vector (None for device arrays: not validated)."""
    if not isinstance(v, np.ndarray):
        if not hasattr(v, "shape"):
            raise TypeError(f"{arg} must be an integer array, got {type(v).__name__}")
        return None
    if v.ndim != 1 or v.dtype.kind not in "iu":
        raise TypeError(f"{arg} must be a 1-D integer array, got {v.dtype} {v.shape}")
    if n is not None and v.shape[0] != n:
        raise ValueError(f"{arg} must have {n} entries, got {v.shape[0]}")
    return v.astype(np.int64)


def vector_len(v: Any, arg: str) -> int:
    """Length of a 1-D array argument (numpy or device array); TypeError otherwise."""
    shape = getattr(v, "shape", None)
    if shape is None or len(tuple(shape)) != 1:
        raise TypeError(f"{arg} must be a 1-D integer array, got {type(v).__name__}"
                        f"{'' if shape is None else f' of shape {tuple(shape)}'}")
    return int(tuple(shape)[0])


def check_groups(expert_start: Any, scales_offsets: Any, expert_ids: Any, num_rows: int,
                 num_tiles: int) -> int:
    """Validate the group vectors (numpy ones fully) and return G.

    expert_start ``[G+1]`` non-decreasing from 0 to ``num_rows``; tile0 non-decreasing over
    non-empty groups, whose tiles lie in ``[0, num_tiles)`` without overlap (the kernels'
    group lookups rely on this).
    """
    ng = vector_len(expert_ids, "expert_ids")
    es = _host_int(expert_start, "expert_start", ng + 1)
    offs = _host_int(scales_offsets, "scales_offsets", ng)
    ids = _host_int(expert_ids, "expert_ids", ng)
    if ids is not None and ng and ids.min() < -1:
        raise ValueError(f"expert_ids must be -1 (unused group) or >= 0, got {ids.tolist()[:16]}")
    if es is None or offs is None or ids is None:
        return ng
    if es[0] != 0 or es[-1] != num_rows or np.any(np.diff(es) < 0):
        raise ValueError(f"expert_start must rise from 0 to {num_rows}, got {es.tolist()[:16]}")
    end = 0
    for g in range(ng):
        n = int(es[g + 1] - es[g])
        if n == 0:
            continue
        t0 = int(es[g] // 128 + offs[g])
        t1 = t0 + -(-n // 128)
        if t0 < end or t1 > num_tiles:
            raise ValueError(f"scales_offsets[{g}] places group {g} at scale tiles [{t0}, {t1}), "
                             f"which must be >= {end} (sorted, no overlap) and <= {num_tiles}")
        end = t1
    return ng


def search_offsets(expert_start: Any, scales_offsets: Any) -> Any:
    """``scales_offsets`` as a binary search over tile0 needs them (numpy inputs).

    The fused matmul-SwiGLU kernel finds a tile's group as the last g with tile0(g) <= tile
    (binary search), so tile0 must rise over *all* groups (the quantize kernels' warp scan
    tests each group's own tiles and does not need it). An empty group owns no tiles and its
    tile0 means nothing (the reference ignores it); here it is moved to the end of the tiles
    of the groups before it, which keeps tile0 sorted without changing any output. Device
    arrays pass unchanged.
    """
    if not isinstance(expert_start, np.ndarray) or not isinstance(scales_offsets, np.ndarray):
        return scales_offsets
    es = expert_start.astype(np.int64)
    offs = scales_offsets.astype(np.int64).copy()
    end = 0
    for g in range(offs.shape[0]):
        n = int(es[g + 1] - es[g])
        base = int(es[g] // 128)
        if n == 0:
            offs[g] = end - base
            continue
        end = base + int(offs[g]) + -(-n // 128)
    return offs.astype(np.int32)


def expert_scales_arg(fmt: Format, values: Any, arg: str, ids: Any) -> Any:
    """The per-expert float32 vector for NVFP4 (required, D9); ones for MX formats."""
    ng = int(ids.shape[0])
    if values is None:
        if not fmt.is_mx:
            raise ValueError(f"NVFP4 requires {arg} (one float32 per expert), got None")
        # the kernel reads the vector at every active expert id: cover the largest one
        top = int(ids.max(initial=-1)) + 1 if isinstance(ids, np.ndarray) else 0
        return np.ones(max(1, ng, top), np.float32)
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "fiu":
            raise TypeError(f"{arg} must be a 1-D float32 array [E], got dtype {values.dtype}, "
                            f"shape {values.shape}")
        v = values.astype(np.float32)
        if fmt.is_mx and np.any(v != 1):
            raise ValueError(f"{arg} must be None or 1.0 for {fmt.name} (D9), got {v[:8]}")
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"{arg} must be finite and > 0, got {v[:8]}")
        if isinstance(ids, np.ndarray) and ng and ids.max(initial=-1) >= v.shape[0]:
            raise ValueError(f"expert_ids must be < len({arg})={v.shape[0]}, "
                             f"got max {ids.max()}")
        return v
    return values


def run_grouped(spec: QuantizeSpec, x: Any, k: int, num_rows: int, num_tiles: int,
                buffers: dict[str, Any], extra: dict[str, int], device: Any) -> tuple[Any, Any]:
    """Launch a grouped/fused kernel over ``num_tiles`` scale tiles; returns (data, scales)."""
    fmt = spec.format
    data_dt, scale_dt = out_dtypes(fmt)
    dshape = (num_rows, fmt.data_cols(k))
    sshape = (num_tiles, -(-fmt.kblocks(k) // 4), 32, 4, 4)
    host = all(isinstance(v, np.ndarray) for v in buffers.values())
    if num_rows == 0 or k == 0:
        mk = (lambda s, d: np.zeros(s, d)) if host else device.zeros
        return mk(dshape, data_dt), mk(sshape, scale_dt)
    ng = int(extra["num_groups"])
    if isinstance(spec, MoeQuantizeSpec) and spec.wide:
        grid, scalars = wide_plan(spec, num_rows, k, num_tiles)
    elif isinstance(spec, MoeQuantizeSpec) and spec.stream:
        grid, scalars = stream_plan(spec, num_rows, k, num_tiles)
    elif isinstance(spec, MoeQuantizeSpec):
        grid, scalars = rows_plan(spec, num_rows, k, num_tiles, ng)
    else:
        grid, scalars = launch_plan(spec, num_rows, k, num_tiles)
    scalars.update(extra)
    scalars["search_steps"] = max(1, ng - 1).bit_length() if ng > 1 else 0
    out = launch(spec, grid, {"data": (dshape, data_dt), "scales": (sshape, scale_dt)},
                 buffers, scalars, device)
    return out["data"], out["scales"]


def _i32(v: Any) -> Any:
    return v.astype(np.int32) if isinstance(v, np.ndarray) else v


def grouped_quantize_dynamic_scaled(x: Any, fmt: Format | str, expert_start: Any,
                                    scales_offsets: Any, expert_ids: Any, tensor_sf: Any, *,
                                    indices: Any = None, indices_divisor: int = 1,
                                    device: Any = None, target: str | None = None,
                                    schedule: str | None = None) -> tuple[Any, Any]:
    """Per-expert quantize, same arguments and results as
    :func:`blockscale.reference.grouped_quantize_dynamic_scaled`.

    Args:
        x: bfloat16 ``[T_in, K]``.
        fmt: the format (MX formats use "up" E8M0 rounding).
        expert_start: int32 ``[G+1]``; scales_offsets: int32 ``[G]``; expert_ids: int32 ``[G]``
            (-1: unused group, written as zeros).
        tensor_sf: float32 ``[E]`` NVFP4 encode scales by expert id (required for NVFP4).
        indices: optional int32 ``[num_rows]``: row i reads ``x[indices[i] // indices_divisor]``.
        indices_divisor: positive int.
        device, target: as for :func:`blockscale.ops.quantize.quantize_dynamic_block_scaled`.
        schedule: kernel schedule, one of SCHEDULES + STREAM_SCHEDULES (None:
            grouped_default(fmt) on GROUPED_SCHEDULE_TARGETS, else DEFAULT_SCHEDULE); same
            bytes.

    Numpy group vectors are validated on the host; device arrays are trusted.
    """
    from blockscale.ops._matmul_host import device_and_target

    fmt = Format.from_name(fmt)
    t_in, k = check_input(x)
    fmt.check_k(k, "x.shape[1]")
    if isinstance(indices_divisor, bool) or not isinstance(indices_divisor, (int, np.integer)) \
            or indices_divisor < 1:
        raise ValueError(f"indices_divisor must be a positive int, got {indices_divisor!r}")
    if indices is None and indices_divisor != 1:
        raise ValueError(f"indices_divisor must be 1 without indices, got {indices_divisor!r}")
    num_rows = t_in
    if indices is not None:
        num_rows = vector_len(indices, "indices")
        idx = _host_int(indices, "indices", num_rows)
        if idx is not None and idx.size and (idx.min() < 0
                                             or (idx // indices_divisor).max() >= t_in):
            raise ValueError(f"indices // indices_divisor must be in [0, {t_in}), got range "
                             f"[{idx.min()}, {(idx // indices_divisor).max()}]")
    ng = vector_len(expert_ids, "expert_ids")
    num_tiles = -(-num_rows // 128) + min(ng, num_rows)
    check_groups(expert_start, scales_offsets, expert_ids, num_rows, num_tiles)
    tsf = expert_scales_arg(fmt, tensor_sf, "tensor_sf", expert_ids)
    dev, tgt = device_and_target(device, target)
    spec = QuantizeSpec(fmt.name, tgt, None, "tcgen5d", k % 8 == 0, "grouped",
                        gather=indices is not None, name="grouped_quantize_dynamic_scaled")
    schedule = default_schedule(schedule, tgt, grouped_default(fmt.name, num_rows * k),
                                GROUPED_SCHEDULE_TARGETS)
    spec = with_schedule(spec, schedule, ng)
    buffers = {"x": x, "expert_start": _i32(expert_start),
               "scales_offsets": _i32(search_offsets(expert_start, scales_offsets)),
               "expert_ids": _i32(expert_ids), "tensor_sf": tsf}
    extra = {"num_groups": ng}
    if indices is not None:
        buffers["indices"] = _i32(indices)
        extra["indices_divisor"] = int(indices_divisor)
    return run_grouped(spec, x, k, num_rows, num_tiles, buffers, extra, dev)


def grouped_quantize_dynamic_scaled_fp4_async(x: Any, fmt: Format | str, expert_start: Any,
                                              scales_offsets: Any, expert_ids: Any,
                                              tensor_sf: Any, **kw: Any) -> tuple[Any, Any]:
    """MAX's name for :func:`grouped_quantize_dynamic_scaled` (same kernel and results)."""
    return grouped_quantize_dynamic_scaled(x, fmt, expert_start, scales_offsets, expert_ids,
                                           tensor_sf, **kw)


def grouped_quantize_dynamic_scaled_kernel(fmt: Format | str, target: str = "sm_90a", *,
                                           aligned: bool = True, gather: bool = False,
                                           schedule: str | None = None) -> Any:
    """Compiled Kernel of the grouped quantize kernel."""
    from blockscale.ops.quantize import kernel

    return kernel(with_schedule(QuantizeSpec(Format.from_name(fmt).name, target, None,
                                             "tcgen5d", aligned, "grouped", gather=gather,
                                             name="grouped_quantize_dynamic_scaled"), schedule))


def grouped_quantize_dynamic_scaled_fp4_async_kernel(fmt: Format | str = "nvfp4",
                                                     target: str = "sm_90a", *,
                                                     aligned: bool = True,
                                                     gather: bool = False) -> Any:
    """MAX's name for :func:`grouped_quantize_dynamic_scaled_kernel` (the kernel behind
    :func:`grouped_quantize_dynamic_scaled_fp4_async`)."""
    return grouped_quantize_dynamic_scaled_kernel(fmt, target, aligned=aligned, gather=gather)


def _grouped_only(schedules: tuple[str, ...]) -> tuple[str, ...]:
    """The schedules of ``schedules`` that differ for the grouped op (not the fused op's
    "*_lut" table forms: the same grouped kernel, or none)."""
    return tuple(s for s in schedules if "lut" not in s)


def bundle_specs(target: str = "sm_90a") -> list[QuantizeSpec]:
    """Grouped quantize specs the GPU tests and benchmarks use (every kernel schedule)."""
    return [with_schedule(QuantizeSpec(f, target, None, "tcgen5d", a, "grouped", gather=g,
                                       name="grouped_quantize_dynamic_scaled"), sch)
            for sch in SCHEDULES[:3] for f in ("nvfp4", "mxfp4", "mxfp8") for a in (True, False)
            for g in (False, True)] + [
        with_schedule(QuantizeSpec(f, target, None, "tcgen5d", True, "grouped", gather=g,
                                   name="grouped_quantize_dynamic_scaled"), sch)
        for sch in STREAM_SCHEDULES[:2] + WIDE_SCHEDULES[::2] + _grouped_only(BULK_SCHEDULES)
        for f in ("nvfp4", "mxfp4", "mxfp8") for g in (False, True)] + [
        with_schedule(QuantizeSpec(f, target, None, "tcgen5d", True, "grouped",
                                   name="grouped_quantize_dynamic_scaled"), sch)
        for sch in _grouped_only(WAVE_SCHEDULES) for f in ("nvfp4", "mxfp4", "mxfp8")] + [
        # the per-format and large-input defaults in every form the op launches (aligned or
        # not, gathered or not)
        with_schedule(QuantizeSpec(f, target, None, "tcgen5d", a, "grouped", gather=g,
                                   name="grouped_quantize_dynamic_scaled"), sch)
        for f in ("nvfp4", "mxfp4", "mxfp8")
        for sch in dict.fromkeys((grouped_default(f), grouped_default(f, LARGE_GROUPED_ELEMENTS)))
        for a in (True, False) for g in (False, True)]


__all__ = [
    "BULK_SCHEDULES",
    "DEFAULT_SCHEDULE",
    "LARGE_GROUPED_ELEMENTS",
    "LARGE_GROUPED_SCHEDULE",
    "LARGE_GROUPED_SCHEDULE_BY_FORMAT",
    "SCHEDULES",
    "STREAM_SCHEDULES",
    "WAVE_SCHEDULES",
    "WIDE_SCHEDULES",
    "MoeQuantizeSpec",
    "bundle_specs",
    "check_groups",
    "grouped_default",
    "grouped_quantize_dynamic_scaled",
    "grouped_quantize_dynamic_scaled_fp4_async",
    "grouped_quantize_dynamic_scaled_fp4_async_kernel",
    "grouped_quantize_dynamic_scaled_kernel",
    "search_offsets",
    "with_schedule",
]


import blockscale.ops._core as _core  # noqa: E402, PLR0402 (no package __getattr__ scan)

_core.register_op_module(__name__)
