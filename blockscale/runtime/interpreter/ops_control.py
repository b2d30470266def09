"""scf ops under an execution mask.

* ``scf.if``: a condition uniform over the active threads runs one branch under the current
  mask; a divergent one runs both branches under ``mask & cond`` / ``mask & ~cond`` and
  merges the results per thread.
* ``scf.for``: uniform bounds iterate in Python; per-thread bounds iterate to the largest
  trip count with threads that are done masked off.
* ``scf.while``: iterates while any active thread's condition holds; finished threads are
  masked off and keep the values they passed to ``scf.condition``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .compiler import Compiler, handles
from .frame import Frame, and_mask, where


def _any_active(f: Frame, cond: np.ndarray) -> tuple[bool, bool]:
    """(some active thread has cond true, some active thread has cond false)."""
    c = cond.astype(bool, copy=False)
    if c.shape[0] == 1:
        v = bool(c[0])
        return v, not v
    if f.mask is None:
        return bool(c.any()), not bool(c.all())
    return bool((c & f.mask).any()), bool((~c & f.mask).any())


def _run_masked(f: Frame, code: Any, mask: np.ndarray | None, args: list = ()) -> list:
    saved = f.mask
    f.mask = mask
    try:
        return code.run(f, args)
    finally:
        f.mask = saved


@handles("scf.if")
def _if(op: Any, c: Compiler):
    cond_s = c.slot(op.operands[0])
    then_code = c.compile_region(op.regions[0])
    else_code = c.compile_region(op.regions[1]) if len(op.regions[1].blocks) else None
    outs = c.slots(op.results)

    def run(f: Frame) -> None:
        cond = f.vals[cond_s]
        any_t, any_f = _any_active(f, cond)
        if any_t and not any_f:
            res = then_code.run(f)
        elif any_f and not any_t:
            res = else_code.run(f) if else_code else []
        elif not any_t and not any_f:  # no active thread: nothing runs, results unused
            res = [None] * len(outs)
        else:
            cm = and_mask(f.mask, cond, f.T)
            t_res = _run_masked(f, then_code, cm)
            e_res = _run_masked(f, else_code, and_mask(f.mask, ~cond.astype(bool), f.T)) \
                if else_code else []
            c_full = np.broadcast_to(cond.astype(bool), (f.T,))
            res = [where(c_full, a, b) for a, b in zip(t_res, e_res)]
        for s, r in zip(outs, res):
            f.vals[s] = r
    return run


@handles("scf.for")
def _for(op: Any, c: Compiler):
    lb_s, ub_s, st_s, *init_s = c.slots(op.operands)
    body = c.compile_region(op.regions[0])
    outs = c.slots(op.results)
    unsigned = "unsignedCmp" in op.attributes

    def run(f: Frame) -> None:
        v = f.vals
        lb, ub, st = v[lb_s], v[ub_s], v[st_s]
        carried = [v[s] for s in init_s]
        uniform = all(x.shape[0] == 1 for x in (lb, ub, st))
        if not uniform:
            act = f.active()
            uniform = all(bool(np.all(x[act] == x[act][0])) if act.any() else True
                          for x in (lb, ub, st) if x.shape[0] > 1)
            if uniform and act.any():
                i0 = int(np.argmax(act))
                lb, ub, st = (x[i0:i0 + 1] if x.shape[0] > 1 else x for x in (lb, ub, st))
        if uniform:
            lo, hi, step = int(lb[0]), int(ub[0]), int(st[0])
            if unsigned:
                lo, hi = (int(x.view(x.dtype.str.replace("i", "u"))[0]) for x in (lb, ub))
            if step <= 0:
                raise RuntimeError(f"scf.for with non-positive step {step}")
            dt = lb.dtype
            for i in range(lo, hi, step):
                carried = body.run(f, [np.array([i], dt).astype(dt)] + carried)
        else:
            lb, ub, st = (np.broadcast_to(x, (f.T,)).astype(np.int64) for x in (lb, ub, st))
            trips = np.where(ub > lb, -(-(ub - lb) // np.maximum(st, 1)), 0)
            act = f.active()
            n = int(trips[act].max()) if act.any() else 0
            for k in range(n):
                m = act & (k < trips)
                iv = (lb + k * st).astype(v[lb_s].dtype)
                new = _run_masked(f, body, m, [iv] + carried)
                carried = [where(m, a, b) for a, b in zip(new, carried)]
        for s, r in zip(outs, carried):
            v[s] = r
    return run


@handles("scf.while")
def _while(op: Any, c: Compiler):
    init_s = c.slots(op.operands)
    before = c.compile_region(op.regions[0])
    after = c.compile_region(op.regions[1])
    outs = c.slots(op.results)

    def run(f: Frame) -> None:
        vals = [f.vals[s] for s in init_s]
        active = f.mask
        results: list[Any] = [None] * len(outs)
        while True:
            cond, *fwd = _run_masked(f, before, active, vals)
            results = [where(active, a, b) for a, b in zip(fwd, results)]
            any_t, any_f = _any_active_mask(f, active, cond)
            if not any_t:
                break
            active = active if not any_f else and_mask(active, cond, f.T)
            vals = _run_masked(f, after, active, fwd)
        for s, r in zip(outs, results):
            f.vals[s] = r
    return run


def _any_active_mask(f: Frame, mask: np.ndarray | None, cond: np.ndarray) -> tuple[bool, bool]:
    saved = f.mask
    f.mask = mask
    try:
        return _any_active(f, cond)
    finally:
        f.mask = saved


@handles("scf.execute_region")
def _execute_region(op: Any, c: Compiler):
    code = c.compile_region(op.regions[0])
    outs = c.slots(op.results)

    def run(f: Frame) -> None:
        for s, r in zip(outs, code.run(f)):
            f.vals[s] = r
    return run
