#!/usr/bin/env bash
# One GPU-machine session: the GPU test tier, the GPU fuzzer, the sanitizers and the benchmarks,
# each under its own time limit, logs under $OUT (default /tmp/gpu_check). Run from the repo root
# on the GPU machine after `make gpu-bundle` here and carrying build/gpu and .whl:
#   bash tools/gpu_check.sh [parts...]   parts: tests fuzz sanitize quantize quantize_torch moe_quantize decode matmul
#                                        grouped_wgmma host moe
# GPU_TESTS="tests/a.py tests/b.py" limits the test part to those files; TESTS_S its seconds.
set -u
source tools/gpu_env.sh
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
parts=${*:-tests fuzz sanitize quantize moe_quantize matmul}
summary=()
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$(date +%s)
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  summary+=("$(printf '%-14s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$(tail -n 1 "$OUT/$name.log" | cut -c1-90)")")
}
for p in $parts; do case $p in
  tests)        step tests ${TESTS_S:-200} python3 -m pytest -m gpu -q -p no:cacheprovider ${GPU_TESTS:-} ;;
  fuzz)         step fuzz ${FUZZ_S:-300} python3 benchmarks/fuzz_gpu.py --cases ${FUZZ_CASES:-1000} ;;
  sanitize)     step sanitize 200 bash tools/sanitize.sh python3 ;;
  quantize)     step quantize 150 python3 benchmarks/bench_quantize.py ;;
  quantize_torch) step quantize_torch 120 python3 benchmarks/bench_quantize.py --torch --formats nvfp4,mxfp4,mxfp8 ;;
  moe_quantize) step moe_quantize 120 python3 benchmarks/bench_quantize_moe.py ;;
  decode)       step decode 120 python3 benchmarks/bench_decode.py --budget-s 100 ;;
  grouped_wgmma) step grouped_wgmma 150 python3 benchmarks/bench_grouped_wgmma.py --t 1024,4096 ;;
  matmul)       step matmul 120 python3 benchmarks/bench_matmul.py --fmt nvfp4,mxfp4,mxfp8 --m 1024,8192 --iters 10 ;;
  host)         step host 60 python3 benchmarks/bench_host_overhead.py ;;
  moe)          step moe ${MOE_S:-170} python3 benchmarks/run.py --only moe --out "$OUT/bench" --budget-s $(( ${MOE_S:-170} - 20 )) --results-md "$OUT/RESULTS_moe.md" ;;
esac; done
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
