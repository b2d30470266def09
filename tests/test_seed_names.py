"""Every function of MAX's ``fp4_quantization`` module (the seed page) exists in blockscale.ops.

The list of names is copied from the seed documentation page
``../shared/seeds/000_ef73361629aebe93.txt`` (MAX ``fp4_quantization`` function list); it is
data here so that this test does not read files outside the repository. docs/seed_map.md maps
each name to ours with the targets it compiles and runs for.
"""

from __future__ import annotations

import pytest

from blockscale import ops

#: the 21 functions of the seed page, in its order
SEED_FUNCTIONS = (
    "block_scaled_matmul",
    "block_scaled_matmul_with_epilogue",
    "block_scales_interleave",
    "block_scales_interleave_fp4",
    "block_scales_interleave_fp4_kernel",
    "grouped_matmul_block_scaled_mxfp4",
    "grouped_matmul_block_scaled_mxfp4_kernel",
    "grouped_quantize_dynamic_scaled_fp4_async",
    "grouped_quantize_dynamic_scaled_fp4_async_kernel",
    "matmul_dynamic_block_scaled_mxfp4",
    "matmul_dynamic_block_scaled_mxfp4_kernel",
    "naive_block_scaled_matmul",
    "naive_block_scaled_matmul_kernel",
    "quantize_dynamic_block_scaled",
    "quantize_dynamic_block_scaled_mxfp4",
    "quantize_dynamic_block_scaled_mxfp4_kernel",
    "quantize_dynamic_scaled_async_fp4_kernel",
    "quantize_dynamic_scaled_fp4_async",
    "quantize_dynamic_scaled_fp4fp8",
    "quantize_dynamic_scaled_fp4fp8_kernel",
    "quantize_mxfp4_amd",
)

#: how to call each ``*_kernel`` name: positional arguments (a spec's format or dtype)
KERNEL_ARGS = {
    "block_scales_interleave_fp4_kernel": ("float8_e4m3fn",),
    "quantize_dynamic_scaled_fp4fp8_kernel": ("nvfp4",),
    "grouped_quantize_dynamic_scaled_fp4_async_kernel": ("nvfp4",),
    "naive_block_scaled_matmul_kernel": ("nvfp4",),
    "grouped_matmul_block_scaled_mxfp4_kernel": (),
    "matmul_dynamic_block_scaled_mxfp4_kernel": (),
    "quantize_dynamic_block_scaled_mxfp4_kernel": (),
    "quantize_dynamic_scaled_async_fp4_kernel": (),
}


def _param(name: str) -> object:
    return pytest.param(name, id=name)


def test_seed_list_is_complete() -> None:
    assert len(SEED_FUNCTIONS) == 21 == len(set(SEED_FUNCTIONS))
    assert set(KERNEL_ARGS) == {n for n in SEED_FUNCTIONS if n.endswith("_kernel")}


@pytest.mark.parametrize("name", [_param(n) for n in SEED_FUNCTIONS if not n.endswith("_kernel")])
def test_launcher_exists_and_is_callable(name: str) -> None:
    fn = getattr(ops, name)
    assert callable(fn), name
    assert fn.__doc__, f"{name} has no docstring"


@pytest.mark.lower
@pytest.mark.parametrize("name", [_param(n) for n in SEED_FUNCTIONS if n.endswith("_kernel")])
def test_kernel_name_returns_a_compiled_kernel(name: str) -> None:
    fn = getattr(ops, name)
    kernel = fn(*KERNEL_ARGS[name], target="sm_90a")
    assert {"mlir", "ptx"} <= set(kernel.asm), (name, sorted(kernel.asm))
    assert ".entry" in kernel.asm["ptx"]
    assert fn.__doc__, f"{name} has no docstring"


#: the kernel symbol behind each seed ``*_kernel`` name (the launcher's kernel)
KERNEL_SYMBOLS = {
    "grouped_matmul_block_scaled_mxfp4_kernel": "bs_grouped_matmul_mxfp4_rm_bf16",
    "grouped_quantize_dynamic_scaled_fp4_async_kernel": "grouped_quantize_dynamic_scaled_nvfp4",
    "matmul_dynamic_block_scaled_mxfp4_kernel": "bs_matmul_mxfp4_rm_bf16",
    "naive_block_scaled_matmul_kernel": "bs_matmul_nvfp4_5d_bf16",
    "quantize_dynamic_block_scaled_mxfp4_kernel": "quantize_dynamic_block_scaled_mxfp4_mxfp4_up",
}


@pytest.mark.lower
@pytest.mark.parametrize("name", sorted(KERNEL_SYMBOLS))
def test_kernel_name_builds_its_launchers_kernel_for_another_target(name: str) -> None:
    kernel = getattr(ops, name)(*KERNEL_ARGS[name], target="gfx950")
    assert kernel.meta["kernel"].startswith(KERNEL_SYMBOLS[name]), kernel.meta["kernel"]
    assert "hsaco" in kernel.asm


@pytest.mark.lower
def test_grouped_matmul_kernel_takes_target_like_the_other_modules() -> None:
    from blockscale.ops import matmul_grouped

    kernel = matmul_grouped.kernel("mxfp8", target="sm_100a", row_scales=False)
    assert kernel.meta["kernel"] == "bs_grouped_matmul_mxfp8_5d_bf16"
    assert ".target sm_100a" in kernel.asm["ptx"]
