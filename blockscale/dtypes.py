"""dtype names: the one place that turns a dtype name, a numpy dtype or a torch dtype into a
numpy / ml_dtypes dtype.

numpy + ml_dtypes only (importable by every layer); torch is never imported: a torch dtype is
recognised by its name (``str(torch.bfloat16) == "torch.bfloat16"``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["TORCH_DTYPES", "as_np_dtype", "np_dtype", "torch_dtype_name"]

#: torch dtype name (after "torch.") -> the numpy / ml_dtypes dtype of the same bits
TORCH_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(dt) for name, dt in (
        ("uint8", np.uint8), ("int8", np.int8), ("int16", np.int16), ("int32", np.int32),
        ("int64", np.int64), ("uint32", np.uint32), ("float16", np.float16),
        ("float32", np.float32), ("float64", np.float64), ("bool", np.bool_),
        ("bfloat16", ml_dtypes.bfloat16), ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        ("float8_e5m2", ml_dtypes.float8_e5m2), ("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu))
}


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a dtype name (ml_dtypes for the narrow floats and bfloat16);
    TypeError for an unknown name."""
    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)


def torch_dtype_name(dt: object) -> str:
    """The name of a torch dtype (or of its string) without the ``torch.`` prefix."""
    return str(dt).removeprefix("torch.")


def as_np_dtype(dt: object) -> np.dtype | None:
    """The numpy / ml_dtypes dtype of a numpy dtype, a dtype name or a torch dtype (by name,
    :data:`TORCH_DTYPES`); None for None or when there is no such dtype."""
    if dt is None:
        return None
    try:
        return np.dtype(dt)  # type: ignore[call-overload]
    except TypeError:
        return TORCH_DTYPES.get(torch_dtype_name(dt))
