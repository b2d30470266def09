"""Host side of the TMA-fed wgmma K loop (``pipeline="ws"``, :mod:`blockscale.ops._wgmma_ws_ir`):
its constants, tensor-map arguments and their launch values. Does not import MLIR."""

from __future__ import annotations

from blockscale.launch import KernelArg

#: the spec field values that select the TMA-fed loop: "ws" (a producer warpgroup issues the
#: copies) and "tma" (thread 0 of the consumers does: 2 bm threads, no idle warpgroup, the
#: register cap of 256 threads)
PIPELINE = "ws"
PIPELINES = (PIPELINE, "tma")
#: (bm, bn) built (one or two 128-row scale atoms of B per stage)
TILES = ((128, 128), (128, 256))
#: the formats, scaling and K-step built (NVFP4: a step is one scale atom column of 4
#: blocks; MXFP4: half of one, two 32-blocks)
FORMATS, SCALING, KSTEP = ("nvfp4", "mxfp4"), "fold", 64
#: packed (TMA) stages in flight
RING = 4
#: the producer warpgroup (after the 2 bm consumer threads; its lane 0 issues the copies;
#: a whole warpgroup so that the warpgroup-wide instructions see whole warpgroups)
PRODUCER_THREADS = {"ws": 128, "tma": 0}
#: bytes of a packed row per step (64 FP4 codes)
ROW_BYTES = KSTEP // 2
#: a 512-byte 5-D scale atom (128 rows x 4 blocks) as a TMA box of (256, 2) bytes
ATOM_BOX = (256, 2)
#: data boxes: 32-byte rows, 32-byte swizzle (bit 4 of the byte offset ^= bit 7)
SWIZZLE = "32b"


#: the scale buffers' dtype per format
SCALE_DTYPES = {"nvfp4": "float8_e4m3fn", "mxfp4": "float8_e8m0fnu"}


def tensormap_args(bm: int, bn: int, fmt: str = "nvfp4") -> tuple[KernelArg, ...]:
    """The TMA maps over a, b (packed rows: boxes of 32 bytes x rows) and sfa, sfb (atoms)."""
    sd = SCALE_DTYPES[fmt]
    return (KernelArg("a_map", "tensormap", "uint8", tensor="a", box=(ROW_BYTES, bm),
                      swizzle=SWIZZLE),
            KernelArg("b_map", "tensormap", "uint8", tensor="b", box=(ROW_BYTES, bn),
                      swizzle=SWIZZLE),
            KernelArg("sfa_map", "tensormap", sd, tensor="sfa", box=ATOM_BOX),
            KernelArg("sfb_map", "tensormap", sd, tensor="sfb", box=ATOM_BOX))


def tensormap_values(m: int, n: int, k: int, block: int = 16) -> dict[str, tuple[int, int]]:
    """Launch values (dims, innermost first) of :func:`tensormap_args` for an M x N x K
    problem with ``block``-element scale blocks: a, b as ``[rows, K/2]`` bytes, the 5-D
    scales as ``[atoms * 2, 256]`` bytes."""
    blocks = -(-k // block)
    d1 = -(-blocks // 4)

    def atoms(rows: int) -> int:
        return -(-rows // 128) * d1 * 2
    return {"a_map": (k // 2, m), "b_map": (k // 2, n), "sfa_map": (256, atoms(m)),
            "sfb_map": (256, atoms(n))}


def ring_bytes(bm: int, bn: int) -> int:
    """Static shared memory of the packed ring (data and scale atoms of every stage)."""
    return RING * ((bm + bn) * ROW_BYTES + 512 * (bm // 128 + bn // 128))
