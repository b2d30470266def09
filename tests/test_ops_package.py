"""``blockscale.ops`` as a package: lazy attribute lookup and kernel keys without MLIR."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_NO_SCAN = r"""
import sys
import blockscale.ops as ops
before = set(sys.modules)
from blockscale.ops import _core  # the import system asks ops.__getattr__('_core') first
assert not hasattr(ops, "_no_such_private_name")
loaded = sorted(m for m in set(sys.modules) - before
                if m.startswith("blockscale.ops.") or m.split(".")[0] == "mlir")
print(loaded)
assert ops.grouped_matmul_swiglu.__module__ == "blockscale.ops.matmul_swiglu"
"""


def test_private_names_do_not_scan_the_op_modules() -> None:
    out = subprocess.run([sys.executable, "-c", _NO_SCAN], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "['blockscale.ops._core']", out.stdout


_ONE_MODULE = r"""
import sys
import blockscale.ops as ops
before = set(sys.modules)
from blockscale.ops import quantize_grouped  # a public op module: that module, no scan
import blockscale.ops.matmul_swiglu  # the fused SwiGLU host module imports no MLIR
loaded = set(sys.modules) - before
assert "mlir" not in sys.modules, sorted(loaded)
assert "blockscale.ops.interleave" not in loaded, sorted(loaded)
"""


def test_op_module_import_does_not_scan_or_import_mlir() -> None:
    out = subprocess.run([sys.executable, "-c", _ONE_MODULE], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr


def test_private_attribute_error_names_the_attribute() -> None:
    from blockscale import ops

    with pytest.raises(AttributeError, match="'_nope'"):
        ops._nope  # noqa: B018


_KEYS = r"""
import sys
{block}
from blockscale.ops import matmul_grouped, matmul_swiglu, quantize
specs = [quantize.QuantizeSpec("nvfp4", "sm_90a"),
         matmul_grouped.GroupedMatmulSpec("mxfp8", target="sm_90a"),
         matmul_swiglu.SwigluSpec("nvfp4", "sm_90a")]
from blockscale.ops import _core
import json
print(json.dumps([_core.kernel_key(s) for s in specs]))
"""


def test_kernel_keys_without_mlir_match_keys_with_it() -> None:
    """A machine without MLIR (the GPU box with a kernel bundle) computes the same keys:
    the KERNEL_SOURCES (IR modules, which import MLIR) are hashed without being imported."""
    keys = []
    for block in ('sys.modules["mlir"] = None  # no MLIR here', ""):
        out = subprocess.run([sys.executable, "-c", _KEYS.format(block=block)],
                             check=False, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        keys.append(json.loads(out.stdout.splitlines()[-1]))
    assert keys[0] == keys[1]


def test_every_op_module_imports_first_in_a_fresh_process():
    """No circular import whichever op module a program imports first (matmul_sm90 used to fail)."""
    import subprocess
    import sys

    import blockscale.ops

    for name in blockscale.ops.op_module_names():
        proc = subprocess.run([sys.executable, "-c", f"import blockscale.ops.{name}"],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-800:]}"
