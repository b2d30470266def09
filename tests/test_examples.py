"""Every examples/NN_*.py chapter runs in a subprocess and prints PASS at the end."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[1] / "examples").glob("[0-9][0-9]_*.py"))
NEEDS_INTERP = {"01_quantize_and_inspect_ir.py", "02_interleave.py", "03_matmul.py",
                "04_grouped_moe.py", "05_graph_and_program.py"}


def test_all_chapters_present() -> None:
    names = [p.name for p in EXAMPLES]
    assert names == ["00_formats.py", "01_quantize_and_inspect_ir.py", "02_interleave.py",
                     "03_matmul.py", "04_grouped_moe.py", "05_graph_and_program.py"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_and_passes(path: pathlib.Path) -> None:
    if path.name in NEEDS_INTERP:
        pytest.importorskip("mlir.ir", reason="the example compiles kernels (needs MLIR)")
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=120, cwd=path.parent, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "PASS"
