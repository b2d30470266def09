"""Input validation shared by the reference ops (errors name the argument, expected, actual)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from blockscale.formats import Format

BF16 = np.dtype(ml_dtypes.bfloat16)
_FLOAT_INPUTS = (BF16, np.dtype(np.float32))


def fmt_arg(fmt: Format | str, arg: str = "fmt") -> Format:
    if isinstance(fmt, (Format, str)):
        return Format.from_name(fmt)
    raise TypeError(f"{arg} must be a Format or a format name, got {type(fmt).__name__}")


def array(a: object, arg: str, *, ndim: int | None = None,
          dtypes: tuple[np.dtype, ...] | None = None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{arg} must be a numpy array, got {type(a).__name__}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{arg} must be {ndim}-D, got shape {a.shape}")
    if dtypes is not None and a.dtype not in dtypes:
        raise TypeError(f"{arg} must have dtype in {[str(d) for d in dtypes]}, got {a.dtype}")
    return a


def float_input(x: object, arg: str = "x") -> np.ndarray:
    """A 2-D bfloat16 (or float32) matrix, widened to float32 (exact)."""
    return array(x, arg, ndim=2, dtypes=_FLOAT_INPUTS).astype(np.float32)


def positive_scalar(v: object, arg: str) -> np.float32:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise TypeError(f"{arg} must be a number, got {type(v).__name__}")
    if not math.isfinite(float(v)) or float(v) <= 0:
        raise ValueError(f"{arg} must be finite and > 0, got {v!r}")
    return np.float32(v)


def finite_scalar(v: object, arg: str) -> np.float32:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise TypeError(f"{arg} must be a number, got {type(v).__name__}")
    if not math.isfinite(float(v)):
        raise ValueError(f"{arg} must be finite, got {v!r}")
    return np.float32(v)


def mx_tensor_sf(fmt: Format, tensor_sf: float) -> None:
    """D9: MX formats take no tensor scale."""
    if fmt.is_mx and float(tensor_sf) != 1.0:
        raise ValueError(f"tensor_sf must be 1.0 for {fmt.name} (MX formats take no tensor "
                         f"scale), got {tensor_sf!r}")


def k_arg(fmt: Format, k: object, data_cols: int, arg: str = "k") -> int:
    """Check the logical K against the stored data columns."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{arg} must be an int, got {type(k).__name__}")
    k = int(k)
    fmt.check_k(k, arg)
    if fmt.data_cols(k) != data_cols:
        raise ValueError(f"{arg}={k} needs {fmt.data_cols(k)} data columns for {fmt.name}, "
                         f"got {data_cols}")
    return k


def data_arg(a: object, fmt: Format, arg: str, ndim: int = 2) -> np.ndarray:
    return array(a, arg, ndim=ndim, dtypes=(fmt.elem_dtype,))


def scales_arg(s: object, fmt: Format, arg: str, shape: tuple[int, ...]) -> np.ndarray:
    s = array(s, arg, dtypes=(fmt.scale_dtype,))
    if s.shape != tuple(shape):
        raise ValueError(f"{arg} must have shape {tuple(shape)}, got {s.shape}")
    return s


def int_vector(v: object, arg: str, length: int | None = None) -> np.ndarray:
    v = np.asarray(v)
    if v.ndim != 1 or (v.size and v.dtype.kind not in "iu"):
        raise TypeError(f"{arg} must be a 1-D integer array, got dtype {v.dtype}, "
                        f"shape {v.shape}")
    if length is not None and v.shape[0] != length:
        raise ValueError(f"{arg} must have length {length}, got {v.shape[0]}")
    return v.astype(np.int64)


def groups(expert_start: object, expert_ids: object, total: int, *,
           num_experts: int | None = None, exact_total: bool = True
           ) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``expert_start [G+1]`` (0, non-decreasing, ends at ``total``) and
    ``expert_ids [G]`` (each -1 or in range)."""
    es = int_vector(expert_start, "expert_start")
    if es.shape[0] < 1:
        raise ValueError("expert_start must have at least one entry (G+1), got 0")
    ids = int_vector(expert_ids, "expert_ids", es.shape[0] - 1)
    if es[0] != 0:
        raise ValueError(f"expert_start[0] must be 0, got {es[0]}")
    if np.any(np.diff(es) < 0):
        raise ValueError(f"expert_start must be non-decreasing, got {es.tolist()}")
    if exact_total and es[-1] != total:
        raise ValueError(f"expert_start[-1] must equal the number of rows {total}, got {es[-1]}")
    if not exact_total and es[-1] > total:
        raise ValueError(f"expert_start[-1] must be <= the number of rows {total}, got {es[-1]}")
    if np.any(ids < -1):
        raise ValueError(f"expert_ids must be -1 or >= 0, got {ids.tolist()}")
    if num_experts is not None and np.any(ids >= num_experts):
        raise ValueError(f"expert_ids must be < num_experts={num_experts}, got {ids.tolist()}")
    return es, ids


def per_expert_vector(v: object, arg: str, *, positive: bool = True) -> np.ndarray:
    """A 1-D float32 vector indexed by expert id (D8), finite (and > 0 if ``positive``)."""
    a = np.asarray(v)
    if a.ndim != 1 or a.dtype.kind not in "fiu":
        raise TypeError(f"{arg} must be a 1-D float array, got dtype {a.dtype}, shape {a.shape}")
    a = a.astype(np.float32)
    if not np.all(np.isfinite(a)) or (positive and np.any(a <= 0)):
        raise ValueError(f"{arg} must be finite{' and > 0' if positive else ''}, "
                         f"got {a.tolist()[:8]}")
    return a
