"""Precompiles a gpu.func body into Python closures (one per op) over a :class:`Frame`.

Each SSA value gets a slot index into ``Frame.vals``; an op handler (registered with
:func:`handles` in the ``ops_*`` modules) turns one MLIR op into a closure ``run(frame)``
that reads its operand slots and writes its result slots. Regions become :class:`RegionCode`.
Ops nobody handles raise NotImplementedError naming the op, at compile time.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from .frame import Frame

Closure = Callable[[Frame], None]
Factory = Callable[[Any, "Compiler"], Closure]

#: op name -> factory(op, compiler) -> closure
HANDLERS: dict[str, Factory] = {}
TERMINATORS = ("scf.yield", "scf.condition", "gpu.return", "gpu.yield", "func.return")


def handles(*names: str) -> Callable[[Factory], Factory]:
    """Register a handler factory for the ops ``names``."""
    def deco(fn: Factory) -> Factory:
        for n in names:
            HANDLERS[n] = fn
        return fn
    return deco


class RegionCode:
    """A compiled single-block region: argument slots, op closures, terminator operands."""

    def __init__(self, arg_slots: list[int], body: list[Closure], term_slots: list[int],
                 term_name: str | None) -> None:
        self.arg_slots = arg_slots
        self.body = body
        self.term_slots = term_slots
        self.term_name = term_name

    def run(self, f: Frame, args: list[Any] = ()) -> list[Any]:
        """Bind ``args`` to the block arguments, run the ops, return the terminator operands."""
        vals = f.vals
        for s, a in zip(self.arg_slots, args):
            vals[s] = a
        for op in self.body:
            op(f)
        return [vals[s] for s in self.term_slots]


class Compiler:
    """Assigns slots to SSA values and compiles regions of one kernel."""

    def __init__(self, symbols: dict[str, Any]) -> None:
        self._slots: dict[Any, int] = {}
        #: symbol name -> op (memref.global, func.func) of the enclosing gpu.module
        self.symbols = symbols
        #: whether the kernel uses shared memory or barriers (for batching decisions)
        self.uses_shared = False
        self.uses_barrier = False

    @property
    def nslots(self) -> int:
        return len(self._slots)

    def slot(self, value: Any) -> int:
        """The slot index of an SSA value (created on first use)."""
        s = self._slots.get(value)
        if s is None:
            s = self._slots[value] = len(self._slots)
        return s

    def slots(self, values: Any) -> list[int]:
        return [self.slot(v) for v in values]

    def compile_region(self, region: Any) -> RegionCode:
        """Compile a single-block region (multi-block CFG regions are not modeled)."""
        blocks = list(region.blocks)
        if len(blocks) != 1:
            raise NotImplementedError(
                f"interpreter: regions with {len(blocks)} blocks (unstructured control flow) "
                "are not modeled; use scf ops")
        block = blocks[0]
        arg_slots = self.slots(block.arguments)
        body: list[Closure] = []
        term_slots: list[int] = []
        term_name = None
        for op in block.operations:
            name = op.operation.name
            if name in TERMINATORS:
                term_slots = self.slots(op.operands)
                term_name = name
                continue
            factory = HANDLERS.get(name)
            if factory is None:
                raise NotImplementedError(f"interpreter: op '{name}' is not modeled")
            body.append(_with_context(factory(op, self), name, str(op.location)))
        return RegionCode(arg_slots, body, term_slots, term_name)


def _with_context(fn: Closure, name: str, loc: str) -> Closure:
    """Append the op name and its source location to any error raised while running it
    (once: the innermost op wins)."""
    m = re.fullmatch(r'loc\("-":(\d+):(\d+)\)', loc)
    if m:
        loc = f"line {m.group(1)} of the kernel text"
    where = f" [in op '{name}'{'' if loc in ('loc(unknown)', '') else ' at ' + loc}]"

    def run(f: Frame) -> None:
        try:
            fn(f)
        except Exception as e:
            if not getattr(e, "_interp_located", False) and e.args \
                    and isinstance(e.args[0], str):
                e.args = (e.args[0] + where,) + e.args[1:]
                e._interp_located = True  # type: ignore[attr-defined]
            raise
    return run


def type_str(value: Any) -> str:
    """The MLIR spelling of a value's type."""
    return str(value.type)


def uniform(x: np.ndarray) -> np.ndarray:
    """A length-1 thread axis for a value known to be the same on all threads."""
    return np.asarray(x).reshape((1,) + np.shape(x))
