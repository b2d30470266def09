#!/usr/bin/env bash
# Make sure an AMDGPU-capable llc / ld.lld / llvm-objdump exists (for gfx942 / gfx950 hsaco).
# As root on Debian/Ubuntu, installs llvm-22 and lld-22 through apt when none is found;
# otherwise prints how to enable the AMD lowering tests (they skip with that message).
set -u
has_amdgpu_llc() {
  for d in "${BLOCKSCALE_LLVM_BIN:-}" "${ROCM_PATH:-/opt/rocm}/llvm/bin" /usr/lib/llvm-2*/bin; do
    [ -n "$d" ] && [ -x "$d/llc" ] && [ -x "$d/ld.lld" ] || continue
    "$d/llc" --version 2>/dev/null | grep -q amdgcn && return 0
  done
  return 1
}
if has_amdgpu_llc; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "blockscale: installing llvm-22 lld-22 (AMDGPU llc / ld.lld) through apt"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q llvm-22 lld-22 >/dev/null \
    || echo "blockscale: apt install of llvm-22 lld-22 failed; AMD lowering tests will skip"
else
  echo "blockscale: no AMDGPU-capable llc/ld.lld found; AMD lowering tests will skip." \
       "Install llvm-22 and lld-22 (apt) or set BLOCKSCALE_LLVM_BIN / ROCM_PATH to enable them."
fi
exit 0
