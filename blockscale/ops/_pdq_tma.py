"""Host side of the producer's TMA ring of packed weights
(:mod:`blockscale.ops._pdq_tma_ir`, ``b_source="tma"`` of
:mod:`blockscale.ops.matmul_grouped_pdq`): its constants, tensor-map arguments and their
launch values. Does not import MLIR."""

from __future__ import annotations

from blockscale.launch import KernelArg

#: ring slots (k64 steps in flight): 3 x 9 KiB beside the 4-stage bf16 ring fits 227 KiB
SLOTS = 3
#: packed bytes of a weight row per k64 step; weight rows a step (the B tile)
ROW_BYTES, ROWS = 32, 256
#: a 512-byte scale atom (128 rows x 4 blocks) as a box of (256, 2) bytes
ATOM_BYTES, ATOM_BOX = 512, (256, 2)
#: expect-tx bytes of a slot: the data box and two atoms
SLOT_TX = ROWS * ROW_BYTES + 2 * ATOM_BYTES
#: static shared bytes of the ring (data, atoms; the mbarriers besides)
SHARED_BYTES = SLOTS * SLOT_TX
SCALE_DTYPES = {"nvfp4": "float8_e4m3fn", "mxfp4": "float8_e8m0fnu"}


def tensormap_args(fmt: str) -> tuple[KernelArg, KernelArg]:
    """``w_map`` over the packed weights ``w`` and ``sfw_map`` over the 6-D scales ``sfb``."""
    return (KernelArg("w_map", "tensormap", "uint8", tensor="w", box=(ROW_BYTES, ROWS),
                      swizzle="32b"),
            KernelArg("sfw_map", "tensormap", SCALE_DTYPES[fmt], tensor="sfb", box=ATOM_BOX))


def tensormap_values(w_elements: int, sfb_elements: int, k: int) -> dict[str, tuple[int, int]]:
    """Launch values (dims, innermost first) of :func:`tensormap_args`."""
    return {"w_map": (k // 2, w_elements // (k // 2)), "sfw_map": (256, sfb_elements // 256)}
