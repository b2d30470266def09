"""Register-A sm_90a grouped (MoE prefill) NVFP4 matmul: the consumer warpgroups convert the
weights into the wgmma's A registers (issue #10).

Same contract as :func:`blockscale.ops.matmul_grouped_pdq.grouped_matmul_block_scaled_pdq`
(SEMANTICS §5, D8, D10): packed NVFP4 hidden [T, K/2] with 5-D per-group padded A scales,
weight [E, N, K/2] with 6-D scales, ``C = bf16(acc * expert_scales[e] (* a_row_scales[m]))``
in fp32; expert id -1 -> zeros. A grouped phase 1 (:mod:`blockscale.ops.matmul_grouped_p1`,
f16, ``kperm``) dequantizes the routed activations once; the kernel
(:mod:`blockscale.ops._grouped_rs_ir`: design, K order, pipeline) computes 256 weight rows x
one (group, 128-token tile) per CTA with the weights as the wgmma's register A operand and the
activations bulk-copied as B. The products are the f16 pdq kernel's exact products; the fp32
sums run in another order inside each k16 wgmma (the permuted K), so the output agrees with
the other grouped kernels within the fp32 accumulation bound, not bit for bit.

Direct call only (:func:`grouped_matmul_block_scaled_rs`): the benchmarks and tests call it;
the dispatch does not (H200 runs AX-BG: 1.74 ms against the f16 paired pdq kernel's 1.47 at
gpt-oss gate_up T=4096; see the IR module's "Status"). N % 8 == 0 (16-byte output rows),
K % 32 == 0. Importing this module does not import MLIR.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg
from blockscale.ops import matmul_grouped as _grouped

#: token widths (= _grouped_rs_ir.WIDTHS): one K loop each
WIDTHS = (32, 64, 96, 128)
KERNEL_SOURCES = ("blockscale.ops._grouped_rs_ir", "blockscale.ops._f16_dequant_ir",
                  "blockscale.ops._grouped_wgmma_ir", "blockscale.ops._grouped_p1_ir",
                  "blockscale.ops._matmul_ir", "blockscale.ops.matmul_grouped_sm90",
                  "blockscale.ops.matmul_grouped")
TARGETS = ("sm_90a",)
FORMATS = ("nvfp4",)
#: token rows per work item (= _grouped_rs_ir's)
BT = 128
#: consumer warpgroups -> 64-row weight slabs each (_grouped_rs_ir.SHAPES): 256 or 192
#: weight rows a CTA
SLABS = {2: 2, 3: 1}
#: shared stages (16 KiB each; the staged output tile needs 66 KiB of the ring) and the
#: weights' load distance in K steps: 4 stages the fastest in every H200 run (AX-BG: gpt-oss
#: T=4096 1.74-1.84 ms against 1.88-2.00 with 6 and 1.75-1.86 with 8)
STAGES, DEPTH = 4, 2
MAX_STAGES = 12


@dataclasses.dataclass(frozen=True)
class GroupedRsSpec(FormatSpec):
    """What one register-A grouped kernel is specialised on (bf16 output).

    Attributes:
        fmt: "nvfp4".
        row_scales: whether the kernel reads ``a_row_scales`` (bf16 ``[T]``, D10).
        target: "sm_90a".
        stages: shared stages (2 .. :data:`MAX_STAGES`).
        depth: K steps between a weight load and its use (1 .. 3).
        wgs: consumer warpgroups (:data:`SLABS`): 2 (two 64-row slabs each: 256 weight rows,
            255 registers) or 3 (one slab each: 192 rows, 384 threads at 168 registers).
    """

    fmt: str
    row_scales: bool = False
    target: str = "sm_90a"
    stages: int = STAGES
    depth: int = DEPTH
    wgs: int = 2

    op: ClassVar[str] = "grouped_matmul_block_scaled_rs"
    out_dtype: ClassVar[str] = "bfloat16"
    epilogue: ClassVar[None] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.fmt, FORMATS, "fmt")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")
        if not isinstance(self.row_scales, bool):
            raise TypeError(f"row_scales must be a bool, got {type(self.row_scales).__name__}")
        if type(self.stages) is not int or not 2 <= self.stages <= MAX_STAGES:
            raise ValueError(f"stages must be an int in [2, {MAX_STAGES}], got {self.stages!r}")
        H.check_choice(self.depth, (1, 2, 3), "depth")
        H.check_choice(self.wgs, tuple(SLABS), "wgs")

    @property
    def block(self) -> tuple[int, int, int]:
        """``wgs`` consumer warpgroups (thread 0 also issues the bulk copies)."""
        return (128 * self.wgs, 1, 1)

    @property
    def weight_rows(self) -> int:
        """Weight rows of a CTA: 64 x wgs x slabs."""
        return 64 * self.wgs * SLABS[self.wgs]

    @property
    def dynamic_shared_bytes(self) -> int:
        from blockscale.ops._grouped_p1_ir import TILE

        ring = self.stages * TILE * 128  # 128 rows x 64 f16 a stage
        return max(ring, BT * (self.weight_rows * 2 + 16)) + 16 * self.stages

    @property
    def kernel_name(self) -> str:
        rs = "_rowsc" if self.row_scales else ""
        return (f"bs_grouped_rs_{self.fmt}_{self.weight_rows}x{BT}_s{self.stages}_d{self.depth}"
                f"{rs}")

    def args(self) -> tuple[KernelArg, ...]:
        """The grouped pdq kernel's workspace arguments: ``wa`` (the f16 kperm workspace) in
        place of ``a`` / ``sfa``."""
        base = _grouped.GroupedMatmulSpec(self.fmt, "tcgen5d", "bfloat16", self.row_scales,
                                          self.target).args()
        return (KernelArg("wa", "buffer", "uint8"),
                *(a for a in base if a.name not in ("a", "sfa")))


def grid(t: int, n: int, num_groups: int, bw: int = 256) -> tuple[int, int, int]:
    """Weight-row tiles (``bw`` rows) x an upper bound of the (group, 128-token tile)
    items."""
    return (max(1, -(-n // bw)), -(-t // BT) + num_groups, 1)


def build(spec: GroupedRsSpec) -> Any:
    """The ``mlir.ir.Module`` of ``spec``'s kernel (IR only)."""
    import blockscale.ops._grouped_rs_ir as R
    from blockscale.compiler import ir as bir

    if R.BT != BT or dict(R.SHAPES) != SLABS or R.WIDTHS != WIDTHS or R.shared_bytes(
            spec.stages, spec.wgs, SLABS[spec.wgs]) != spec.dynamic_shared_bytes:
        raise AssertionError("matmul_grouped_rs's constants disagree with _grouped_rs_ir's")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        R.emit(kb, spec.stages, spec.depth, spec.row_scales, spec.wgs)
    return kb.module


def grouped_matmul_block_scaled_rs(hidden: Any, weight: Any, a_scales: Any, b_scales: Any,
                                   expert_start: Any, a_scale_offsets: Any, expert_ids: Any,
                                   expert_scales: Any, fmt: Format | str = "nvfp4", *,
                                   k: int | None = None, a_row_scales: Any = None,
                                   stages: int = STAGES, depth: int = DEPTH, wgs: int = 2,
                                   device: Any = None) -> Any:
    """The register-A grouped kernel called directly (no dispatch). Arguments as
    :func:`blockscale.ops.matmul_grouped.grouped_matmul_block_scaled` plus ``stages``,
    ``depth`` and ``wgs`` (:class:`GroupedRsSpec`). Raises ValueError for a format other than NVFP4,
    K % 32 != 0, N % 8 != 0, or scale tiles not placed as D8 says."""
    fmt = Format.from_name(fmt)
    H.check_choice(fmt.name, FORMATS, "fmt")
    t, n, k, g_count, buffers = _grouped.tiled_grouped_operands(
        hidden, weight, a_scales, b_scales, expert_start, a_scale_offsets, expert_ids,
        expert_scales, fmt, k, a_row_scales, "grouped register-A kernel")
    if n % 8:
        raise ValueError(f"the register-A grouped kernel stores 16-byte rows: n % 8 == 0, "
                         f"got n={n}")
    dev, tgt = H.device_and_target(device, "sm_90a")
    spec = GroupedRsSpec(fmt.name, a_row_scales is not None, tgt, stages, depth, wgs)
    return launch(spec, t, n, g_count, buffers, {"t": t, "n": n, "k": k, "num_groups": g_count},
                  dev)


def launch(spec: GroupedRsSpec, t: int, n: int, num_groups: int, buffers: dict[str, Any],
           scalars: dict[str, Any], device: Any) -> Any:
    """The phase 1 (f16, kperm) then ``spec`` on the grouped op's (checked) buffers; bf16
    ``[T, N]`` (numpy when every input is numpy)."""
    from blockscale.ops import matmul_grouped_p1 as G1

    if t == 0 or n == 0:
        return H.launch(spec, grid(t, n, num_groups, spec.weight_rows), (t, n), "bfloat16",
                        buffers, scalars, device, empty=True)
    bufs, host = G1.with_workspace(
        G1.GroupedP1Spec(spec.fmt, spec.target, dtype="f16", kperm=True), buffers, t,
        scalars["k"], num_groups, device)
    out = H.launch(spec, grid(t, n, num_groups, spec.weight_rows), (t, n), "bfloat16", bufs,
                   scalars, device)
    return device.to_host(out) if host else out


def kernel(spec: GroupedRsSpec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def bundle_specs(target: str = "sm_90a") -> list[Any]:
    """NVFP4 with and without row scales at the default stages / depth, both shapes, and
    depth 1 / 3 and 6 / 8 stages plain (the benchmark's sweep); none off sm_90a."""
    if target not in TARGETS:
        return []
    specs = [GroupedRsSpec("nvfp4", rs, target, wgs=w) for rs in (False, True) for w in SLABS]
    specs += [GroupedRsSpec("nvfp4", False, target, stages=4, wgs=3)]
    specs += [GroupedRsSpec("nvfp4", False, target, depth=d) for d in (1, 3)]
    specs += [GroupedRsSpec("nvfp4", False, target, stages=s) for s in (4, 8)]
    return specs


_core.attach_kernel_api((grouped_matmul_block_scaled_rs,), kernel, build)
_core.register_op_module(__name__)

__all__ = ["GroupedRsSpec", "build", "bundle_specs", "grid", "grouped_matmul_block_scaled_rs",
           "kernel", "launch"]
