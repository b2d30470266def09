"""Scale-factor layouts and the quantized-tensor value type.

Two layouts (DESIGN.md "Conventions"):

* ``ROW_MAJOR``: scales ``[rows, kblocks]``.
* ``TCGEN_5D``: the cuBLAS "128x4" / tcgen05 layout (SEMANTICS §1.3), a row-major 5-D tensor
  ``[ceil(rows/128), ceil(kblocks/4), 32, 4, 4]`` where ``S[r, j]`` sits at
  ``(r // 128, j // 4, r % 32, (r % 128) // 32, j % 4)``. Rows and K-blocks padded up to
  multiples of 128 and 4 hold zero bytes (D7).

:func:`interleave` / :func:`deinterleave` are the one implementation of that mapping; every
other part of blockscale (reference, ops host packing, tests) calls them.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from blockscale.formats import Format

SF_ATOM_ROWS = 128  # rows per 5-D tile
SF_ATOM_KBLOCKS = 4  # K-blocks per 5-D tile
SF_ATOM_BYTES = 512


class ScaleLayout(str, enum.Enum):
    """How block scales are stored: ``ROW_MAJOR`` or ``TCGEN_5D``."""

    ROW_MAJOR = "row_major"
    TCGEN_5D = "tcgen5d"

    @classmethod
    def parse(cls, value: ScaleLayout | str) -> ScaleLayout:
        """A layout from itself or its name ("row_major", "tcgen5d", any case)."""
        if isinstance(value, cls):
            return value
        hit = _BY_NAME.get(value) if type(value) is str else None
        if hit is not None:  # the common spellings, without walking the enum
            return hit
        if isinstance(value, str):
            for layout in cls:
                if value.lower() in (layout.value, layout.name.lower()):
                    return layout
        raise ValueError(f"scale_layout must be one of {[m.value for m in cls]}, got {value!r}")

    def __str__(self) -> str:
        return self.value


ROW_MAJOR = ScaleLayout.ROW_MAJOR
TCGEN_5D = ScaleLayout.TCGEN_5D
_BY_NAME = {n: m for m in ScaleLayout for n in (m.value, m.name.lower())}


def _check_count(value: int, arg: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{arg} must be a non-negative int, got {value!r}")
    return int(value)


def tcgen_tiles(rows: int, kblocks: int) -> tuple[int, int]:
    """(row tiles, K-block tiles) = (ceil(rows/128), ceil(kblocks/4))."""
    return -(-rows // SF_ATOM_ROWS), -(-kblocks // SF_ATOM_KBLOCKS)


def scale_shape(layout: ScaleLayout | str, rows: int, kblocks: int) -> tuple[int, ...]:
    """Shape of the scale tensor of ``rows`` x ``kblocks`` scales in ``layout``."""
    layout = ScaleLayout.parse(layout)
    rows, kblocks = _check_count(rows, "rows"), _check_count(kblocks, "kblocks")
    if layout is ROW_MAJOR:
        return (rows, kblocks)
    d0, d1 = tcgen_tiles(rows, kblocks)
    return (d0, d1, 32, 4, 4)


def tcgen_offset(r: np.ndarray | int, j: np.ndarray | int, kblocks: int) -> np.ndarray | int:
    """Flat byte offset of scale ``(r, j)`` in the 5-D layout of a ``kblocks``-wide matrix.

    ``((((r//128)*D1 + j//4)*32 + r%32)*4 + (r%128)//32)*4 + j%4`` with ``D1 = ceil(kblocks/4)``,
    computed in int64 (D12). Works on ints or arrays.
    """
    d1 = -(-_check_count(kblocks, "kblocks") // SF_ATOM_KBLOCKS)
    r = np.asarray(r, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    off = ((((r // 128) * d1 + j // 4) * 32 + r % 32) * 4 + (r % 128) // 32) * 4 + j % 4
    return int(off) if off.ndim == 0 else off


def interleave(scales_2d: np.ndarray) -> np.ndarray:
    """Row-major ``[R, J]`` scales -> 5-D ``[ceil(R/128), ceil(J/4), 32, 4, 4]``, same dtype.

    Any 1-byte dtype (uint8, float8_e4m3fn, float8_e8m0fnu); padding bytes are zero.
    """
    s = _one_byte(scales_2d, "scales_2d")
    if s.ndim != 2:
        raise ValueError(f"scales_2d must be 2-D [rows, kblocks], got shape {s.shape}")
    rows, kblocks = s.shape
    d0, d1 = tcgen_tiles(rows, kblocks)
    padded = np.zeros((d0 * 128, d1 * 4), dtype=np.uint8)
    padded[:rows, :kblocks] = s.view(np.uint8)
    # padded row r = i0*128 + i3*32 + i2, column j = i1*4 + i4
    out = padded.reshape(d0, 4, 32, d1, 4).transpose(0, 3, 2, 1, 4)
    return np.ascontiguousarray(out).view(s.dtype)


def deinterleave(scales_5d: np.ndarray, rows: int, kblocks: int) -> np.ndarray:
    """5-D scales -> row-major ``[rows, kblocks]`` (the inverse of :func:`interleave`).

    ``scales_5d`` may hold more row tiles than ``rows`` needs (grouped outputs); the leading
    ``ceil(rows/128)`` tiles are read.
    """
    s = _one_byte(scales_5d, "scales_5d")
    rows, kblocks = _check_count(rows, "rows"), _check_count(kblocks, "kblocks")
    d0, d1 = tcgen_tiles(rows, kblocks)
    if s.ndim != 5 or s.shape[1:] != (d1, 32, 4, 4) or s.shape[0] < d0:
        raise ValueError(f"scales_5d must have shape ({d0}+, {d1}, 32, 4, 4) for rows={rows}, "
                         f"kblocks={kblocks}, got {s.shape}")
    flat = s[:d0].view(np.uint8).transpose(0, 3, 2, 1, 4).reshape(d0 * 128, d1 * 4)
    return np.ascontiguousarray(flat[:rows, :kblocks]).view(s.dtype)


def _one_byte(a: np.ndarray, arg: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{arg} must be a numpy array, got {type(a).__name__}")
    if a.dtype.itemsize != 1:
        raise TypeError(f"{arg} must have a 1-byte dtype (uint8, float8_e4m3fn, float8_e8m0fnu), "
                        f"got {a.dtype}")
    return a


@dataclasses.dataclass(frozen=True, eq=False)
class QTensor:
    """A block-quantized matrix: payload, block scales and their description.

    Attributes:
        data: ``[rows, k/2]`` uint8 (FP4, packed) or ``[rows, k]`` float8_e4m3fn (MXFP8).
        scales: ``fmt.scale_dtype`` scales in ``layout`` (5-D tensors may carry spare row
            tiles, as grouped quantize outputs do).
        format: the :class:`Format`.
        layout: the :class:`ScaleLayout` of ``scales``.
        shape: the logical ``(rows, k)``.
        tensor_sf: the NVFP4 per-tensor scale used at quantization (1.0 for MX formats, D9).
    """

    data: np.ndarray
    scales: np.ndarray
    format: Format
    layout: ScaleLayout
    shape: tuple[int, int]
    tensor_sf: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.format, Format):
            raise TypeError(f"format must be a Format, got {type(self.format).__name__}")
        object.__setattr__(self, "layout", ScaleLayout.parse(self.layout))
        if len(self.shape) != 2:
            raise ValueError(f"shape must be (rows, k), got {self.shape!r}")
        rows, k = (_check_count(v, n) for v, n in zip(self.shape, ("rows", "k")))
        object.__setattr__(self, "shape", (rows, k))
        fmt = self.format
        fmt.check_k(k)
        for name, arr, dtype in (("data", self.data, fmt.elem_dtype),
                                 ("scales", self.scales, fmt.scale_dtype)):
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"{name} must be a numpy array, got {type(arr).__name__}")
            if arr.dtype != dtype:
                raise TypeError(f"{name} must have dtype {dtype} for {fmt.name}, got {arr.dtype}")
        if self.data.shape != (rows, fmt.data_cols(k)):
            raise ValueError(f"data must have shape {(rows, fmt.data_cols(k))} for {fmt.name} "
                             f"with shape {self.shape}, got {self.data.shape}")
        want = scale_shape(self.layout, rows, fmt.kblocks(k))
        got = self.scales.shape
        ok = got == want or (self.layout is TCGEN_5D and len(got) == 5
                             and got[1:] == want[1:] and got[0] >= want[0])
        if not ok:
            raise ValueError(f"scales must have shape {want} ({self.layout.value}), got {got}")
        tsf = float(self.tensor_sf)
        if not np.isfinite(tsf) or tsf <= 0:
            raise ValueError(f"tensor_sf must be finite and > 0, got {self.tensor_sf!r}")
        if fmt.is_mx and tsf != 1.0:
            raise ValueError(f"tensor_sf must be 1.0 for {fmt.name} (D9), got {tsf}")
        object.__setattr__(self, "tensor_sf", tsf)

    def require(self, *, layout: ScaleLayout | str | None = None,
                fmt: Format | str | None = None) -> QTensor:
        """Return self, or raise ValueError when its layout or format is not the one asked."""
        if layout is not None and self.layout is not ScaleLayout.parse(layout):
            raise ValueError(f"scale layout must be {ScaleLayout.parse(layout).value}, "
                             f"got {self.layout.value}")
        if fmt is not None and self.format is not Format.from_name(fmt):
            raise ValueError(f"format must be {Format.from_name(fmt).name}, "
                             f"got {self.format.name}")
        return self

    def with_layout(self, layout: ScaleLayout | str) -> QTensor:
        """The same tensor with its scales converted to ``layout`` (zero padding in 5-D)."""
        layout = ScaleLayout.parse(layout)
        if layout is self.layout:
            return self
        rows, kblocks = self.shape[0], self.format.kblocks(self.shape[1])
        if layout is TCGEN_5D:
            scales = interleave(self.scales)
        else:
            scales = deinterleave(self.scales, rows, kblocks)
        return dataclasses.replace(self, scales=scales, layout=layout)
