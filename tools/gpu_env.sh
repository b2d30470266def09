#!/usr/bin/env bash
# Source on a GPU machine before running the GPU tier or the benchmarks from a bundle:
# installs carried wheels (.whl/) for whatever python3 lacks, and points blockscale at build/gpu.
# Usage: source tools/gpu_env.sh
need=()
python3 -c "import pytest" 2>/dev/null || need+=(pytest pluggy iniconfig packaging pygments)
python3 -c "import ml_dtypes" 2>/dev/null || need+=(ml_dtypes)
python3 -c "from cuda.bindings import driver" 2>/dev/null || need+=(cuda_bindings cuda_pathfinder)
if [ ${#need[@]} -gt 0 ]; then
  echo "gpu_env: installing carried wheels for: ${need[*]}"
  files=()
  for n in "${need[@]}"; do files+=($(ls .whl/${n}-*.whl .whl/opt/${n}-*.whl 2>/dev/null)); done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "${files[@]}" \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-}
export BLOCKSCALE_BUNDLE_DIR=${BLOCKSCALE_BUNDLE_DIR:-build/gpu}
export BLOCKSCALE_DEVICE=cuda
export PYTHONUNBUFFERED=1
