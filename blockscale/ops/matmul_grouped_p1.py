"""The grouped (MoE prefill) phase 1: the routed rows' packed FP4 A + 5-D scales -> one bf16
workspace of per-(group, 128-row tile) tiles, dequantized ONCE (issue #10).

The grouped producer-dequant kernel (:mod:`blockscale.ops.matmul_grouped_pdq`,
``a_source="workspace"``) then bulk-copies A's stages from it (``cp.async.bulk`` by one
producer thread) and its producer warpgroup dequantizes only the weights: without it every
A tile is dequantized once per column tile (23 times at N = 5760). Layout, tile placement
and zeros: :mod:`blockscale.ops._grouped_p1_ir` (tile ``w = start // 128 +
a_scale_offsets[g] + i`` of group g's row tile i, 128 rows x k_pad bf16, stage-ordered), the
bytes the grouped pdq kernel's producer stores for the same rows. Importing this module
does not import MLIR.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

import blockscale.ops._core as _core  # noqa: PLR0402 (no package __getattr__ scan)
import blockscale.ops._matmul_host as H
from blockscale.formats import Format, FormatSpec
from blockscale.launch import KernelArg

#: modules whose source shapes the kernel (part of the kernel key, see ops/_core.py)
KERNEL_SOURCES = ("blockscale.ops._grouped_p1_ir", "blockscale.ops._f16_dequant_ir",
                  "blockscale.ops._mx8_window_ir",
                  "blockscale.ops._grouped_wgmma_ir",
                  "blockscale.ops._twophase_p1_ir", "blockscale.ops._twophase_ir",
                  "blockscale.ops._wgmma_ir", "blockscale.ops._mma_ir",
                  "blockscale.ops._matmul_ir")
TARGETS = ("sm_90a",)
FORMATS = ("nvfp4", "mxfp4", "mxfp8")
#: threads per block, rows per workspace tile, pieces per thread (= _grouped_p1_ir's)
THREADS, TILE, PIECES = 256, 128, (1, 2)
DEFAULT_PIECES = 2
#: the workspace's types: bf16, or f16 (NVFP4: the grouped pdq kernel's ``dtype="f16"``)
DTYPES = ("bf16", "f16")
#: K of the workspace is padded to a multiple of this (= _twophase_ir.KPAD)
KPAD = 64


@dataclasses.dataclass(frozen=True)
class GroupedP1Spec(FormatSpec):
    """The grouped phase-1 kernel.

    Attributes:
        fmt: "nvfp4" | "mxfp4" | "mxfp8" (E4M3 times the block's power of two, exact inside
            the window of :mod:`blockscale.ops._mx8_window_ir`).
        target: "sm_90a".
        pieces: 64-element pieces of a row per thread (:data:`PIECES`).
        dtype: the workspace's type, "bf16", or "f16" (NVFP4: values times 2^-7, the
            operands of the grouped pdq kernel's ``dtype="f16"``;
            :mod:`blockscale.ops._f16_dequant_ir`).
        kperm: the register-A kernel's K order inside every 64-element step
            (:func:`kperm_source`; f16 only): the grouped
            register-A kernel's B operand (:mod:`blockscale.ops.matmul_grouped_rs`).
    """

    fmt: str
    target: str = "sm_90a"
    pieces: int = DEFAULT_PIECES
    dtype: str = "bf16"
    kperm: bool = False

    op: ClassVar[str] = "grouped_matmul_dequant_a"
    block: ClassVar[tuple[int, int, int]] = (THREADS, 1, 1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Format.from_name(self.fmt).name)
        H.check_choice(self.fmt, FORMATS, "fmt")
        object.__setattr__(self, "target", H.target_name(self.target))
        H.check_choice(self.target, TARGETS, "target")
        H.check_choice(self.pieces, PIECES, "pieces")
        H.check_choice(self.dtype, DTYPES, "dtype")
        if self.dtype == "f16" and self.fmt != "nvfp4":
            raise ValueError(f"dtype='f16' is NVFP4 only, got fmt={self.fmt}")
        if self.kperm and self.dtype != "f16":
            raise ValueError(f"kperm needs dtype='f16', got dtype={self.dtype!r}")

    @property
    def kernel_name(self) -> str:
        f16 = "_f16" if self.dtype == "f16" else ""
        f16 += "_kp" if self.kperm else ""
        return f"bs_grouped_p1_{self.fmt}_t{TILE}_p{self.pieces}{f16}"

    def args(self) -> tuple[KernelArg, ...]:
        """a, sfa, expert_start, a_scale_offsets, expert_ids, ws (the workspace bytes), t, k,
        num_groups, ws_tiles."""
        sd = Format.from_name(self.fmt).scale_dtype.name
        return (KernelArg("a", "buffer", "uint8"), KernelArg("sfa", "buffer", sd),
                KernelArg("expert_start", "buffer", "int32"),
                KernelArg("a_scale_offsets", "buffer", "int32"),
                KernelArg("expert_ids", "buffer", "int32"),
                KernelArg("ws", "buffer", "uint8", "out"),
                *(KernelArg(x, "scalar", "i32") for x in ("t", "k", "num_groups", "ws_tiles")))


def kperm_source(pos: int) -> int:
    """The K element (inside its 64-element step) that position ``pos`` of a ``kperm``
    workspace row holds: the register-A kernel's order (:mod:`blockscale.ops._grouped_rs_ir`).
    Position ``16 j + 8 hi + 2 q + i`` (k16 slice j, the wgmma A fragment's column pair
    ``2q + 8 hi + i`` of thread quad q) holds element ``16 q + 4 j + 2 hi + i``: thread quad q's
    A registers then hold the 16 consecutive weight codes ``16 q ..`` (one 8-byte load, one
    NVFP4 block) in slice order. Pairs (i = 0, 1) stay adjacent: a permutation of f16 pairs."""
    j, r = divmod(pos, 16)
    hi, r = divmod(r, 8)
    q, i = divmod(r, 2)
    return 16 * q + 4 * j + 2 * hi + i


def k_padded(k: int) -> int:
    """K rounded up to :data:`KPAD`."""
    return -(-k // KPAD) * KPAD


def tile_bytes(k: int) -> int:
    """Bytes of one workspace tile (128 rows x k_pad bf16)."""
    return TILE * 2 * k_padded(k)


def grid(t: int, k: int, num_groups: int, pieces: int = DEFAULT_PIECES) -> tuple[int, int, int]:
    """Blocks per tile (128 rows x ceil(pieces / P) items) x an upper bound of the tiles."""
    items = TILE * -(-(k_padded(k) // 64) // pieces)
    return (-(-items // THREADS), -(-t // TILE) + num_groups, 1)


def build(spec: GroupedP1Spec) -> Any:
    """The ``mlir.ir.Module`` of the kernel (IR only)."""
    import blockscale.ops._grouped_p1_ir as P
    from blockscale.compiler import ir as bir

    if (P.THREADS, P.TILE, P.PIECES) != (THREADS, TILE, PIECES):
        raise AssertionError("matmul_grouped_p1's constants disagree with _grouped_p1_ir's")
    with bir.kernel_module(spec.kernel_name, spec.target, spec.args(), spec.block) as kb:
        P.emit(kb, spec.fmt, spec.pieces, spec.dtype, spec.kperm)
    return kb.module


def kernel(spec: GroupedP1Spec) -> Any:
    """The compiled Kernel (every asm stage) of ``spec``; needs the compiler."""
    return H.compile_spec(spec)


def check_tile_placement(expert_start: Any, a_scale_offsets: Any, expert_ids: Any,
                         ws_tiles: int) -> None:
    """ValueError unless every used group's row tiles ``start // 128 + a_scale_offsets[g] +
    i`` (i < ceil(n_g / 128)) lie in ``[0, ws_tiles)`` and no two used groups share one (D8's
    placement: the workspace holds one tile per (group, row tile)); device arrays are
    trusted."""
    if not all(isinstance(v, np.ndarray) for v in (expert_start, a_scale_offsets, expert_ids)):
        return
    es = expert_start.astype(np.int64)
    rows = es[1:] - es[:-1]
    used = (expert_ids >= 0) & (rows > 0)
    first = es[:-1] // TILE + a_scale_offsets.astype(np.int64)
    tiles = -(-rows // TILE)
    lo, hi = first[used], (first + tiles)[used]
    if lo.size and (lo.min() < 0 or hi.max() > ws_tiles):
        raise ValueError(f"a_scale_offsets must place every used group's tiles in [0, "
                         f"{ws_tiles}) (a_scales.shape[0]), got tiles [{lo.min()}, {hi.max()})")
    order = np.argsort(lo, kind="stable")
    if np.any(lo[order][1:] < hi[order][:-1]):
        raise ValueError("a_scale_offsets must give the used groups disjoint scale tiles (D8: "
                         f"tile0(g) sums the earlier groups' ceil(n/128)), got "
                         f"{a_scale_offsets.tolist()[:16]}")


def launch(spec: GroupedP1Spec, buffers: dict[str, Any], t: int, k: int, num_groups: int,
           device: Any) -> Any:
    """Launch ``spec`` on the grouped op's (checked) buffers (a, sfa, expert_start,
    a_scale_offsets, expert_ids; others ignored): the workspace, flat uint8 of
    ``a_scales.shape[0]`` tiles (numpy when every input is numpy)."""
    ws_tiles = int(buffers["sfa"].shape[0])
    check_tile_placement(buffers["expert_start"], buffers["a_scale_offsets"],
                         buffers["expert_ids"], ws_tiles)
    ins = {x: buffers[x] for x in ("a", "sfa", "expert_start", "a_scale_offsets", "expert_ids")}
    _, out = _core.launch_op(spec, grid(t, k, num_groups, spec.pieces),
                             (("ws", (ws_tiles * tile_bytes(k),), np.dtype(np.uint8)),), ins,
                             {"t": t, "k": k, "num_groups": num_groups, "ws_tiles": ws_tiles},
                             device)
    return out["ws"]


def with_workspace(spec: GroupedP1Spec, buffers: dict[str, Any], t: int, k: int,
                   num_groups: int, device: Any) -> tuple[dict[str, Any], bool]:
    """The grouped op's (checked) buffers for a matmul that reads A from the workspace: ``spec``
    launched, ``a`` / ``sfa`` replaced by ``wa`` (the workspace), and whether every input was
    numpy (the caller then returns numpy). Numpy inputs are uploaded once, after their tile
    placement is checked, so the workspace stays on the device between the launches."""
    host = all(isinstance(v, np.ndarray) for v in buffers.values())
    if host:
        check_tile_placement(buffers["expert_start"], buffers["a_scale_offsets"],
                             buffers["expert_ids"], int(buffers["sfa"].shape[0]))
        buffers = {x: device.to_device(np.ascontiguousarray(v)) for x, v in buffers.items()}
    ws = launch(spec, buffers, t, k, num_groups, device)
    return {**{x: v for x, v in buffers.items() if x not in ("a", "sfa")}, "wa": ws}, host


def dequantize_grouped_a(hidden: Any, a_scales: Any, expert_start: Any, a_scale_offsets: Any,
                         expert_ids: Any, fmt: Format | str, *, k: int | None = None,
                         pieces: int = DEFAULT_PIECES, device: Any = None) -> Any:
    """The workspace alone (tests, timing): flat uint8 of ``a_scales.shape[0]`` tiles of 128
    rows x k_pad bf16 (module docstring). ``hidden`` packed FP4 ``[T, K/2]``, ``a_scales``
    5-D with per-group padded tiles, the group vectors as the grouped matmul's (SEMANTICS
    §5). Raises ValueError for a format other than NVFP4 / MXFP4, K % 32 != 0, or tiles not
    placed as D8 says (:func:`check_tile_placement`)."""
    from blockscale.ops import matmul_grouped as _grouped

    fmt = Format.from_name(fmt)
    H.check_choice(fmt.name, FORMATS, "fmt")
    t, cols = H.shape_of(hidden, "hidden", 2)
    H.check_dtype(hidden, fmt.elem_dtype, "hidden", fmt)
    k = (cols if fmt.name == "mxfp8" else 2 * cols) if k is None else k
    if k % 32 or fmt.data_cols(k) != cols:
        raise ValueError(f"the grouped phase 1 takes k % 32 == 0 and hidden.shape[1] == "
                         f"{'k' if fmt.name == 'mxfp8' else 'k / 2'}, "
                         f"got k={k}, hidden.shape[1]={cols}")
    es, offs, ids = _grouped.group_vectors(expert_start, a_scale_offsets, expert_ids, t,
                                           2 ** 31 - 1)
    dev, tgt = H.device_and_target(device, "sm_90a")
    spec = GroupedP1Spec(fmt.name, tgt, pieces)
    bufs = {"a": hidden, "sfa": a_scales, "expert_start": es, "a_scale_offsets": offs,
            "expert_ids": ids}
    return launch(spec, bufs, t, k, es.shape[0] - 1, dev)


def bundle_specs(target: str = "sm_90a") -> list[Any]:
    """NVFP4 / MXFP4, every :data:`PIECES` (NVFP4 also f16, the default pieces, plain and
    ``kperm``); none off sm_90a."""
    if target not in TARGETS:
        return []
    return [GroupedP1Spec(f, target, p) for f in FORMATS for p in PIECES] + [
        GroupedP1Spec("nvfp4", target, dtype="f16", kperm=kp) for kp in (False, True)]


_core.attach_kernel_api((dequantize_grouped_a,), kernel, build)
_core.register_op_module(__name__)

__all__ = [
    "GroupedP1Spec",
    "build",
    "bundle_specs",
    "check_tile_placement",
    "dequantize_grouped_a",
    "grid",
    "kernel",
    "kperm_source",
    "launch",
    "with_workspace",
]
