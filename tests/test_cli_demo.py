"""`blockscale demo` (the README's main job, `make demo`) runs through the console entry point."""

import subprocess
import sys

import pytest


@pytest.mark.interp
def test_blockscale_demo_command_passes():
    code = "import sys; from blockscale.cli import main; sys.exit(main(['demo']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "byte-exact" in proc.stdout and proc.stdout.rstrip().endswith("PASS")
