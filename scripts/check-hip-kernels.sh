#!/usr/bin/env bash
# Compiles every kernels-hip/*.hip to AMDGPU code objects with hipcc, once per target, and fails
# if any kernel does not compile.
#
#   scripts/check-hip-kernels.sh [OUT_DIR]
#
# Targets: $DUET_HIP_ARCHS (space-separated) or "gfx90a gfx940" (MI250 and the MI300 family's
# first target; Debian 12's ROCm 5.2 toolchain has no gfx942). Each kernel is built with the same
# wavefront size the backend passes at run time (-DDUET_WARP=64 on CDNA).
#
# Installs nothing. On Debian 12 it needs: apt-get install hipcc libamdhip64-dev rocm-device-libs
set -uo pipefail
cd "$(dirname "$0")/.."
archs=${DUET_HIP_ARCHS:-"gfx90a gfx940"}
out=${1:-target/hip-kernels}
hipcc=${HIPCC:-hipcc}
if ! command -v "$hipcc" >/dev/null 2>&1; then
  echo "error: $hipcc not found (Debian 12: apt-get install hipcc libamdhip64-dev rocm-device-libs)" >&2
  exit 2
fi
mkdir -p "$out"
# hipcc (ROCm 5.2) leaves an empty <source>-XXXXXX directory in $TMPDIR for every compile: give it
# a private one and remove it at the end.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp"
shopt -s nullglob
sources=(kernels-hip/*.hip)
if [ ${#sources[@]} -eq 0 ]; then
  echo "error: no kernels-hip/*.hip found" >&2
  exit 2
fi
pass=0
fail=0
for arch in $archs; do
  for src in "${sources[@]}"; do
    name=$(basename "$src" .hip)
    obj="$out/$name.$arch.co"
    log=$(mktemp)
    # rocm_agent_enumerator (run by hipcc) prints a traceback on machines without a GPU; it is
    # harmless with an explicit --offload-arch, so only the compiler's own diagnostics are kept.
    if "$hipcc" --genco --offload-arch="$arch" -O3 -std=c++17 -ffp-contract=off -DDUET_WARP=64 -Wall -Werror \
        -Ikernels-hip -Ikernels-shared "$src" -o "$obj" >"$log" 2>&1 && [ -s "$obj" ]; then
      echo "ok    $arch  $src -> $obj ($(stat -c %s "$obj") bytes)"
      pass=$((pass + 1))
    else
      echo "FAIL  $arch  $src"
      grep -v -E "rocm_agent_enumerator|^Traceback|^  File|^    |FileNotFoundError" "$log" >&2
      fail=$((fail + 1))
    fi
    rm -f "$log"
  done
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
