"""Check that a kernel bundle holds every kernel a fuzz_gpu run asks for.

Usage (on a machine with the compiler, after ``make gpu-bundle``)::

    PYTHONPATH=. python benchmarks/fuzz_bundle_coverage.py --bundle build/gpu \\
        [--cases 1000] [--ops dense_matmul,grouped_matmul,grouped_swiglu] [--launch]

Runs ``benchmarks/fuzz_gpu.py --device interp --target sm_90a`` in this process with
``_core.get_kernel`` recording every kernel key; by default the interpreter's launches are
skipped (outputs unchecked, so the run counts as failed; only the keys matter), which makes
the full 1000-case stream of the GPU run cheap; ``--launch`` runs the kernels for real.
Prints the keys missing from the bundle's ``manifest.json`` and exits 1 when any is.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", default="build/gpu", help="bundle directory (manifest.json)")
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ops", default="dense_matmul,grouped_matmul,grouped_swiglu")
    p.add_argument("--launch", action="store_true", help="run the kernels (slow)")
    ns = p.parse_args(argv)
    path = os.path.join(ns.bundle, "manifest.json")
    with open(path) as f:
        entries = [e for e in json.load(f)["kernels"] if not str(e["status"]).startswith("failed")]
    bundled = {e["key"] for e in entries}
    bundled_specs = {e["spec"] for e in entries}

    from benchmarks import fuzz_gpu
    from blockscale import runtime
    from blockscale.ops import _core

    seen: dict[str, Any] = {}
    original = _core.get_kernel

    def recording(spec: Any, build: Any = None) -> Any:
        seen.setdefault(_core.kernel_key(spec), spec)
        return original(spec, build)

    dev = runtime.get_device("interp")  # the shared instance fuzz_gpu.main gets
    if not ns.launch:
        dev.launch = lambda kernel, grid, args, stream=None: None
    fuzz_gpu.check_bundle = lambda target: []  # this script is the bundle check
    _core.get_kernel = recording
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = fuzz_gpu.main(["--device", "interp", "--target", "sm_90a", "--cases",
                                str(ns.cases), "--seed", str(ns.seed), "--ops", ns.ops])
    finally:
        _core.get_kernel = original
        vars(dev).pop("launch", None)
    if ns.launch:
        print(out.getvalue().strip().splitlines()[-1], f"(fuzz_gpu exit {rc})")
    missing = {k: s for k, s in seen.items() if k not in bundled}
    print(f"{len(seen)} kernels asked for by {ns.cases} cases of {ns.ops}; "
          f"{len(seen) - len(missing)} in {path}, {len(missing)} missing")
    from blockscale.tools.bundle import _spec_text

    for k, s in missing.items():
        stale = " (this spec is in the bundle under another key: its generator's sources " \
            "changed since the bundle was built; rebuild it)" if _spec_text(s) in bundled_specs \
            else ""
        print(f"  MISSING {k}: {s!r}{stale}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
