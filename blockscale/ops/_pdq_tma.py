"""Host side of the producer's TMA ring of packed weights
(:mod:`blockscale.ops._pdq_tma_ir`, ``b_source="tma"`` of
:mod:`blockscale.ops.matmul_grouped_pdq`): its constants, tensor-map arguments and their
launch values. Does not import MLIR."""

from __future__ import annotations

from blockscale.launch import KernelArg

#: packed bytes of a weight row per k64 step
ROW_BYTES = 32
#: a 512-byte scale atom (128 rows x 4 blocks) as a box of (256, 2) bytes
ATOM_BYTES, ATOM_BOX = 512, (256, 2)
#: static shared bytes the ring may take beside the 4-stage bf16 ring (227 KiB in all)
RING_BUDGET = 27 * 1024
#: at most this many slots (k64 steps in flight)
MAX_SLOTS = 6
SCALE_DTYPES = {"nvfp4": "float8_e4m3fn", "mxfp4": "float8_e8m0fnu"}


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
