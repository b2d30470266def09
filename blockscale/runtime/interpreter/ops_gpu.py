"""gpu dialect ops and the nvvm / rocdl intrinsics our kernels use.

Thread and block ids come from the :class:`Frame`. Warp-level ops see the thread axis as
warps of ``warp_size`` consecutive linear thread ids of a block; a lane that reads an inactive
or missing lane raises :class:`ShuffleError` (undefined on hardware). Barriers require every
thread of a block to be active or none, and end the race-detection interval.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import intrinsics
from .compiler import Compiler, handles, type_str
from .dtypes import value_dtype
from .frame import BarrierDivergenceError, Frame, ShuffleError
from .ops_arith import _max_signed_zero

# ---- ids ------------------------------------------------------------------------------------

_DIMS = {"x": 0, "y": 1, "z": 2}


def _dim(op: Any) -> int:
    return _DIMS[str(op.attributes["dimension"]).rstrip(">")[-1]]


def _id_factory(getter: Callable[[Frame, int], np.ndarray], dim_of: Callable[[Any], int]):
    def factory(op: Any, c: Compiler):
        out = c.slot(op.results[0])
        _, dt = value_dtype(type_str(op.results[0]))
        d = dim_of(op)

        def run(f: Frame) -> None:
            f.vals[out] = np.asarray(getter(f, d)).reshape(-1).astype(dt)
        return run
    return factory


def _global_id(f: Frame, d: int) -> np.ndarray:
    return f.block_xyz[d] * f.block[d] + f.thread_xyz[d]


_GETTERS: dict[str, Callable[[Frame, int], Any]] = {
    "thread_id": lambda f, d: f.thread_xyz[d],
    "block_id": lambda f, d: f.block_xyz[d],
    "block_dim": lambda f, d: f.block[d],
    "grid_dim": lambda f, d: f.grid[d],
    "global_id": _global_id,
}
for _name, _get in _GETTERS.items():
    handles(f"gpu.{_name}")(_id_factory(_get, _dim))

_SREGS = {"tid": "thread_id", "ntid": "block_dim", "ctaid": "block_id", "nctaid": "grid_dim"}
for _sreg, _kind in _SREGS.items():
    for _axis, _d in _DIMS.items():
        handles(f"nvvm.read.ptx.sreg.{_sreg}.{_axis}")(
            _id_factory(_GETTERS[_kind], lambda op, d=_d: d))
_ROCDL = {"workitem.id": "thread_id", "workgroup.id": "block_id", "workgroup.dim": "block_dim",
          "grid.dim": "grid_dim"}
for _reg, _kind in _ROCDL.items():
    for _axis, _d in _DIMS.items():
        handles(f"rocdl.{_reg}.{_axis}")(_id_factory(_GETTERS[_kind], lambda op, d=_d: d))

_WARP_GETTERS = {
    "gpu.lane_id": lambda f, d: f.tid % f.warp_size,
    "nvvm.read.ptx.sreg.laneid": lambda f, d: f.tid % f.warp_size,
    "gpu.subgroup_id": lambda f, d: f.tid // f.warp_size,
    "gpu.num_subgroups": lambda f, d: -(-f.nthreads // f.warp_size),
    "gpu.subgroup_size": lambda f, d: f.warp_size,
    "nvvm.read.ptx.sreg.warpsize": lambda f, d: f.warp_size,
    "rocdl.wavefrontsize": lambda f, d: f.warp_size,
}
for _name, _get in _WARP_GETTERS.items():
    handles(_name)(_id_factory(_get, lambda op: 0))


# ---- barriers -------------------------------------------------------------------------------


def barrier(f: Frame) -> None:
    """Check that each block is fully active or fully inactive, then end the race interval."""
    if f.mask is None:
        blocks = np.ones(f.nblocks, bool)
    else:
        per_block = f.mask.reshape(f.nblocks, f.nthreads)
        full, none = per_block.all(axis=1), ~per_block.any(axis=1)
        if not (full | none).all():
            b = int(np.argmax(~(full | none)))
            n = int(per_block[b].sum())
            raise BarrierDivergenceError(
                f"barrier reached by {n} of {f.nthreads} threads of {f.describe_block(b)} "
                "(barrier under divergent control flow)")
        blocks = full
    for buf in getattr(f, "shared", ()):
        if buf.race is not None:
            buf.race.reset(blocks)


@handles("gpu.barrier", "nvvm.barrier0", "nvvm.barrier", "rocdl.barrier", "rocdl.s.barrier")
def _barrier(op: Any, c: Compiler):
    c.uses_barrier = True
    return barrier


@handles("nvvm.setmaxregister")
def _setmaxregister(op: Any, c: Compiler):
    """``setmaxnreg``: no effect on values; the count must be a multiple of 8 in [24, 256]
    (ValueError when the kernel is compiled) and the 128 threads of a warpgroup execute it
    together (BarrierDivergenceError otherwise)."""
    count = ir_int(op.attributes["regCount"])
    if count % 8 or not 24 <= count <= 256:
        raise ValueError(f"setmaxnreg: count must be a multiple of 8 in [24, 256], got {count}")

    def run(f: Frame) -> None:
        if f.mask is None:
            return
        if f.nthreads % 128:
            raise BarrierDivergenceError(f"setmaxnreg in a block of {f.nthreads} threads "
                                         "(not whole warpgroups)")
        groups = f.mask.reshape(-1, 128)
        mixed = groups.any(axis=1) & ~groups.all(axis=1)
        if mixed.any():
            g = int(np.argmax(mixed))
            raise BarrierDivergenceError(
                f"setmaxnreg reached by {int(groups[g].sum())} of the 128 threads of "
                f"warpgroup {g % (f.nthreads // 128)} of {f.describe_block(g // (f.nthreads // 128))}")
    return run


@handles("nvvm.griddepcontrol")
def _griddepcontrol(op: Any, c: Compiler):
    """``griddepcontrol.wait`` / ``.launch_dependents`` (programmatic dependent launch): the
    interpreter runs launches one after another, so a grid's predecessor has completed and
    its writes are visible before the grid starts: both are no-ops."""
    kind = str(op.attributes["kind"])
    if "wait" not in kind and "launch_dependents" not in kind:
        raise NotImplementedError(f"interpreter: griddepcontrol kind {kind}")
    return lambda f: None


def ir_int(attr: Any) -> int:
    """The value of an integer attribute (``232 : i32``)."""
    return int(str(attr).split(":")[0])


# ---- lane exchange --------------------------------------------------------------------------


def gather_lanes(f: Frame, val: np.ndarray, src_lane: np.ndarray, valid: np.ndarray,
                 what: str) -> np.ndarray:
    """Each active thread reads ``val`` from lane ``src_lane`` of its warp where ``valid``
    (its own value elsewhere). Reading an inactive lane, or a lane past the end of the block
    (a partial last warp), raises ShuffleError."""
    lane = f.tid % f.warp_size
    t = np.arange(f.T, dtype=np.int64)
    valid = valid & (src_lane >= 0) & (src_lane < f.warp_size)
    active = f.active()
    missing = active & valid & ((f.tid - lane + src_lane) >= f.nthreads)
    if missing.any():
        i = int(np.argmax(missing))
        raise ShuffleError(f"{what}: {f.describe(i)} reads lane {int(src_lane[i])}, which does "
                           f"not exist (block of {f.nthreads} threads, warp of {f.warp_size})")
    src_t = np.where(valid, t - lane + src_lane, t)
    if f.mask is not None:
        bad = active & valid & ~f.mask[src_t]
        if bad.any():
            i = int(np.argmax(bad))
            raise ShuffleError(f"{what}: {f.describe(i)} reads inactive lane "
                               f"{int(src_lane[i])}")
    full = f.full(val)
    return np.where(valid.reshape(valid.shape + (1,) * (full.ndim - 1)), full[src_t], full)


@handles("gpu.shuffle")
def _gpu_shuffle(op: Any, c: Compiler):
    val_s, off_s, width_s = c.slots(op.operands)
    mode = str(op.attributes["mode"]).rstrip(">").split()[-1]
    out_v, out_ok = c.slots(op.results)

    def run(f: Frame) -> None:
        lane = f.tid % f.warp_size
        off = np.broadcast_to(f.vals[off_s].astype(np.int64), (f.T,))
        width = np.broadcast_to(f.vals[width_s].astype(np.int64), (f.T,))
        seg = lane - lane % np.maximum(width, 1)
        if mode == "xor":
            src = lane ^ off
        elif mode == "down":
            src = lane + off
        elif mode == "up":
            src = lane - off
        elif mode == "idx":
            src = seg + off
        else:
            raise NotImplementedError(f"interpreter: gpu.shuffle mode {mode}")
        valid = (src >= seg) & (src < seg + width)
        f.vals[out_v] = gather_lanes(f, f.vals[val_s], src, valid, f"gpu.shuffle {mode}")
        f.vals[out_ok] = valid.copy()
    return run


@handles("nvvm.shfl.sync")
def _nvvm_shfl(op: Any, c: Compiler):
    _, val_s, b_s, c_s = c.slots(op.operands)
    kind = str(op.attributes["kind"]).rstrip(">").split("<")[-1].split()[-1]
    if "return_value_and_is_valid" in op.attributes:
        raise NotImplementedError("interpreter: nvvm.shfl.sync with return_value_and_is_valid")
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        lane = f.tid % f.warp_size
        bval = np.broadcast_to(f.vals[b_s].astype(np.int64), (f.T,)) & 0x1F
        cc = np.broadcast_to(f.vals[c_s].astype(np.int64), (f.T,))
        cval, segmask = cc & 0x1F, (cc >> 8) & 0x1F
        max_lane = (lane & segmask) | (cval & ~segmask)
        min_lane = lane & segmask
        if kind == "up":
            j = lane - bval
            ok = j >= max_lane
        elif kind == "down":
            j, ok = lane + bval, None
        elif kind == "bfly":
            j, ok = lane ^ bval, None
        elif kind == "idx":
            j, ok = min_lane | (bval & ~segmask), None
        else:
            raise NotImplementedError(f"interpreter: nvvm.shfl.sync kind {kind}")
        if ok is None:
            ok = j <= max_lane
        f.vals[out] = gather_lanes(f, f.vals[val_s], j, ok, f"nvvm.shfl.sync {kind}")
    return run


@handles("rocdl.ds_bpermute")
def _ds_bpermute(op: Any, c: Compiler):
    idx_s, val_s = c.slots(op.operands)
    out = c.slot(op.results[0])

    def run(f: Frame) -> None:
        src = (np.broadcast_to(f.vals[idx_s].astype(np.int64), (f.T,)) >> 2) % f.warp_size
        f.vals[out] = gather_lanes(f, f.vals[val_s], src, np.ones(f.T, bool), "ds_bpermute")
    return run


_REDUCE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": lambda a, b: a ^ b if a.dtype == np.bool_ else a + b,
    "mul": lambda a, b: a & b if a.dtype == np.bool_ else a * b,
    "minsi": np.minimum, "maxsi": np.maximum,
    "minui": lambda a, b: np.where(_uv(a) <= _uv(b), a, b),
    "maxui": lambda a, b: np.where(_uv(a) >= _uv(b), a, b),
    "minnumf": lambda a, b: _max_signed_zero(a, b, False, False),
    "maxnumf": lambda a, b: _max_signed_zero(a, b, False, True),
    "minimumf": lambda a, b: _max_signed_zero(a, b, True, False),
    "maximumf": lambda a, b: _max_signed_zero(a, b, True, True),
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}


def _uv(a: np.ndarray) -> np.ndarray:
    return a.view(a.dtype.str.replace("i", "u")) if a.dtype.kind == "i" else a


@handles("gpu.subgroup_reduce")
def _subgroup_reduce(op: Any, c: Compiler):
    """Butterfly reduction (xor offsets stride, 2*stride, ...), the order of the upstream
    lowering of gpu.subgroup_reduce to shuffles; every lane of a cluster gets the result."""
    val_s = c.slot(op.operands[0])
    out = c.slot(op.results[0])
    kind = str(op.attributes["op"]).rstrip(">").split()[-1]
    fn = _REDUCE[kind]
    cluster = int(str(op.attributes["cluster_size"]).split(":")[0]) \
        if "cluster_size" in op.attributes else None
    stride = int(str(op.attributes["cluster_stride"]).split(":")[0]) \
        if "cluster_stride" in op.attributes else 1

    def run(f: Frame) -> None:
        lane = f.tid % f.warp_size
        size = cluster or f.warp_size
        v = f.full(f.vals[val_s])
        off = stride
        with np.errstate(all="ignore"):
            while off < stride * size:
                other = gather_lanes(f, v, lane ^ off, np.ones(f.T, bool),
                                     f"gpu.subgroup_reduce {kind}")
                v = fn(v, other)
                off <<= 1
        f.vals[out] = v
    return run


# ---- conversion intrinsics ------------------------------------------------------------------


def _flag(op: Any, name: str) -> bool:
    return name in op.attributes and str(op.attributes[name]) in ("true", "unit")


@handles("nvvm.convert.f32x2.to.f4x2")
def _cvt_e2m1x2(op: Any, c: Compiler):
    a_s, b_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    if str(op.attributes["dstTy"]) != "f4E2M1FN":
        raise NotImplementedError(f"interpreter: nvvm.convert.f32x2.to.f4x2 to "
                                  f"{op.attributes['dstTy']}")
    if type_str(op.results[0]) != "i8":
        raise NotImplementedError("interpreter: nvvm.convert.f32x2.to.f4x2 result must be i8")
    relu = _flag(op, "relu")

    def run(f: Frame) -> None:
        f.vals[out] = intrinsics.cvt_f32x2_to_e2m1x2(f.vals[a_s], f.vals[b_s], relu)
    return run


@handles("nvvm.convert.f32x2.to.f8x2")
def _cvt_f8x2(op: Any, c: Compiler):
    a_s, b_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    dst = str(op.attributes["dstTy"])
    rnd = str(op.attributes["rnd"]).rstrip(">").split("<")[-1] if "rnd" in op.attributes else ""
    sat = "sat" in op.attributes and "satfinite" in str(op.attributes["sat"])
    relu = _flag(op, "relu")
    if type_str(op.results[0]) != "i16":
        raise NotImplementedError("interpreter: nvvm.convert.f32x2.to.f8x2 with a vector result")
    if dst == "f8E8M0FNU":
        if relu:
            raise NotImplementedError("interpreter: ue8m0x2 conversion with relu")
        fn = lambda a, b: intrinsics.cvt_f32x2_to_ue8m0x2(a, b, rnd, sat)
    elif dst == "f8E4M3FN" and sat and rnd in ("", "rn"):
        fn = lambda a, b: intrinsics.cvt_f32x2_to_e4m3x2(a, b, relu)
    else:
        raise NotImplementedError(f"interpreter: nvvm.convert.f32x2.to.f8x2 to {dst} "
                                  f"rnd={rnd} satfinite={sat}")

    def run(f: Frame) -> None:
        f.vals[out] = fn(f.vals[a_s], f.vals[b_s])
    return run


def _sel(op: Any, name: str) -> int:
    return int(str(op.attributes[name]).split(":")[0])


@handles("rocdl.cvt.scalef32.pk.fp4.f32")
def _scalef32_fp4_f32(op: Any, c: Compiler):
    old_s, a_s, b_s, sc_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    sel = _sel(op, "dstSelIndex")

    def run(f: Frame) -> None:
        v = f.vals
        f.vals[out] = intrinsics.cvt_scalef32_pk_fp4_f32(v[old_s], v[a_s], v[b_s], v[sc_s], sel)
    return run


@handles("rocdl.cvt.scalef32.pk.fp4.bf16")
def _scalef32_fp4_bf16(op: Any, c: Compiler):
    old_s, src_s, sc_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    sel = _sel(op, "dstSelIndex")

    def run(f: Frame) -> None:
        v = f.vals
        f.vals[out] = intrinsics.cvt_scalef32_pk_fp4_bf16(v[old_s], v[src_s], v[sc_s], sel)
    return run


@handles("rocdl.cvt.scalef32.pk.f32.fp4", "rocdl.cvt.scalef32.pk.bf16.fp4")
def _scalef32_from_fp4(op: Any, c: Compiler):
    src_s, sc_s = c.slots(op.operands)
    out = c.slot(op.results[0])
    sel = _sel(op, "srcSelIndex")
    fn = intrinsics.cvt_scalef32_pk_f32_fp4 if op.operation.name.endswith("f32.fp4") \
        else intrinsics.cvt_scalef32_pk_bf16_fp4

    def run(f: Frame) -> None:
        f.vals[out] = fn(f.vals[src_s], f.vals[sc_s], sel)
    return run
