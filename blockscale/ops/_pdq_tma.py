"""Host side of the producer's TMA ring of packed weights
(:mod:`blockscale.ops._pdq_tma_ir`, ``b_source="tma"`` of
:mod:`blockscale.ops.matmul_grouped_pdq`): its constants, tensor-map arguments and their
launch values. Does not import MLIR."""

from __future__ import annotations

from blockscale.launch import KernelArg
from blockscale.ops._wgmma_ws import ATOM_BOX, ROW_BYTES, SCALE_DTYPES

#: a 512-byte scale atom (128 rows x 4 blocks; :data:`ATOM_BOX` of the TMA-fed wgmma loop)
ATOM_BYTES = ATOM_BOX[0] * ATOM_BOX[1]
#: static shared bytes the ring may take beside the 4-stage bf16 ring (227 KiB in all)
RING_BUDGET = 27 * 1024
#: at most this many slots (k64 steps in flight)
MAX_SLOTS = 6


def slot_bytes(rows: int) -> int:
    """Expect-tx bytes of a slot: the data box (``rows`` x 32 bytes) and its scale atoms."""
    return rows * ROW_BYTES + rows // 128 * ATOM_BYTES


def slots(rows: int) -> int:
    """Ring slots for B tiles of ``rows`` rows: 3 at 256 (9 KiB each), 6 at 128."""
    return min(MAX_SLOTS, RING_BUDGET // slot_bytes(rows))


def tensormap_args(fmt: str, rows: int = 256) -> tuple[KernelArg, KernelArg]:
    """``w_map`` over the packed weights ``w`` (boxes of 32 bytes x ``rows``) and ``sfw_map``
    over the 6-D scales ``sfb`` (boxes of one atom)."""
    return (KernelArg("w_map", "tensormap", "uint8", tensor="w", box=(ROW_BYTES, rows),
                      swizzle="32b"),
            KernelArg("sfw_map", "tensormap", SCALE_DTYPES[fmt], tensor="sfb", box=ATOM_BOX))


def tensormap_values(w_elements: int, sfb_elements: int, k: int) -> dict[str, tuple[int, int]]:
    """Launch values (dims, innermost first) of :func:`tensormap_args`."""
    return {"w_map": (k // 2, w_elements // (k // 2)), "sfw_map": (256, sfb_elements // 256)}
