# blockscale developer commands. `make test` and `make demo` install everything themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BUNDLE ?= build/gpu

.PHONY: all test demo lint gpu-bundle gpu-test clean amdgpu-tools

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@bash tools/ensure_amdgpu_tools.sh
	@touch $(STAMP)

amdgpu-tools:
	@bash tools/ensure_amdgpu_tools.sh

test: $(STAMP)
	$(PY) -m pytest -q -m "not gpu"

demo: $(STAMP)
	$(VENV)/bin/blockscale demo

lint: $(STAMP)
	$(VENV)/bin/ruff check blockscale tests benchmarks examples

# Precompile every kernel the GPU tests and benchmarks need into $(BUNDLE) (no GPU needed).
gpu-bundle: $(STAMP)
	$(PY) -m blockscale.tools.bundle --out $(BUNDLE) --strip-mlir --prune --extra benchmarks.fuzz_gpu:fuzz_specs \
		--extra benchmarks.run:extra_specs --extra benchmarks.sanitize_matmuls:specs \
		--extra benchmarks.bench_pdq:extra_specs

clean:
	rm -rf $(VENV) build .pytest_cache
