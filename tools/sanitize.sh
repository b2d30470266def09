#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and initcheck over every GPU kernel at tail shapes.
#
#   BLOCKSCALE_BUNDLE_DIR=build/gpu PYTHONPATH=. bash tools/sanitize.sh [python]
#
# Runs benchmarks/sanitize_driver.py (which also checks every result against the reference)
# under each tool, prints each tool's summary line ("ERROR SUMMARY: N errors", racecheck's
# "RACECHECK SUMMARY") and exits non-zero if any tool reports an error or the driver fails.
set -u
PY=${1:-${PYTHON:-python}}
HERE=$(cd "$(dirname "$0")/.." && pwd)
DRIVER="$HERE/benchmarks/sanitize_driver.py"

find_sanitizer() {
  if [ -n "${COMPUTE_SANITIZER:-}" ]; then echo "$COMPUTE_SANITIZER"; return; fi
  if command -v compute-sanitizer >/dev/null 2>&1; then command -v compute-sanitizer; return; fi
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
    if [ -n "$d" ] && [ -x "$d/bin/compute-sanitizer" ]; then echo "$d/bin/compute-sanitizer"; return; fi
    if [ -n "$d" ] && [ -x "$d/compute-sanitizer/compute-sanitizer" ]; then
      echo "$d/compute-sanitizer/compute-sanitizer"; return; fi
  done
  # the pip wheel nvidia-cuda-sanitizer-api ships the tool inside site-packages
  "$PY" - <<'PYEOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for p in glob.glob(os.path.join(r, "nvidia", "**", "compute-sanitizer"), recursive=True):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            print(p); sys.exit(0)
PYEOF
}

SAN=$(find_sanitizer)
if [ -z "$SAN" ]; then
  echo "sanitize.sh: compute-sanitizer not found (set COMPUTE_SANITIZER, or install the CUDA" \
       "toolkit / pip install nvidia-cuda-sanitizer-api)" >&2
  exit 2
fi
echo "sanitizer: $SAN"
status=0
for tool in memcheck racecheck initcheck; do
  extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check no)
  [ "$tool" = racecheck ] && extra=(--racecheck-report all)
  log=$(mktemp)
  # initcheck does not see the global writes of cp.async.bulk (shared -> global): the staged
  # epilogues' outputs would all read as uninitialized, so it checks the direct stores
  staged=1; [ "$tool" = initcheck ] && staged=0
  BLOCKSCALE_SM90_STAGED_STORE=$staged "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 99 --target-processes all \
      "$PY" "$DRIVER" >"$log" 2>&1
  rc=$?
  echo "=== $tool (exit $rc)"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize_driver:|^WRONG|Traceback|Error:" "$log" | tail -n 25
  if [ $rc -ne 0 ]; then status=1; tail -n 40 "$log"; fi
  rm -f "$log"
done
[ $status -eq 0 ] && echo "sanitize.sh: all tools clean" || echo "sanitize.sh: FAILED"
exit $status
