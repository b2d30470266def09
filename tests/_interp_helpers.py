"""Shared helpers of the interpreter tests (not a test module)."""

from __future__ import annotations

#: the prologue of :func:`gpu_module` kernels: %tid, %bid, %bd and the global index %i
GLOBAL_ID = """
    %tid = gpu.thread_id x
    %bid = gpu.block_id x
    %bd = gpu.block_dim x
    %base = arith.muli %bid, %bd : index
    %i = arith.addi %base, %tid : index"""


def gpu_module(sig: str, body: str, attrs: str = "") -> str:
    """MLIR text of ``gpu.module @m`` with one kernel ``@k(sig)`` (optional function
    ``attrs``) whose body is :data:`GLOBAL_ID` then ``body``."""
    attrs = f"{attrs} " if attrs else ""
    return f"""
gpu.module @m {{
  gpu.func @k({sig}) {attrs}kernel {{
{GLOBAL_ID}
{body}
    gpu.return
  }}
}}"""
