"""Re-run an MLIR pass pipeline on a file: ``python -m blockscale.compiler.repro FILE PIPELINE``.

The command a :class:`~blockscale.compiler.errors.CompilationError` prints. It needs only the
MLIR Python bindings (no ``mlir-opt``). Prints the resulting module and exits 0, or prints the
diagnostics and exits 1.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m blockscale.compiler.repro",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("file", help="MLIR file (the pre-pipeline module)")
    parser.add_argument("pipeline", help="pass pipeline, e.g. 'builtin.module(...)'")
    parser.add_argument("--quiet", action="store_true", help="do not print the result IR")
    ns = parser.parse_args(argv)
    from blockscale.compiler.errors import CompilationError
    from blockscale.compiler.pipeline import _run_passes

    with open(ns.file, encoding="utf-8") as f:
        text = f.read()
    try:
        module = _run_passes(text, ns.pipeline, kernel_name="repro", stage="repro")
    except CompilationError as e:
        print("\n".join(e.diagnostics) or str(e), file=sys.stderr)
        return 1
    if not ns.quiet:
        print(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
