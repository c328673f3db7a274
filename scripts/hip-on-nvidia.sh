#!/usr/bin/env bash
# Runs the HIP kernel sources (kernels-hip/*.hip) on an NVIDIA GPU through HIP's NVIDIA platform
# headers (hip/nvidia_detail, -D__HIP_PLATFORM_NVIDIA__), compiled with nvcc, and compares every
# kernel's output with the CPU backend's on the same seeded random inputs.
#
#   scripts/hip-on-nvidia.sh prepare   # here (needs: apt-get install libamdhip64-dev; cargo)
#       copies Debian's HIP headers and writes the CPU fixtures into .carry/hip-on-nvidia/
#   scripts/hip-on-nvidia.sh run       # on the NVIDIA machine (needs: nvcc, a GPU, python3)
#       prunes the copied headers for the local CUDA (scripts/hip/prune_nvidia_headers.py),
#       builds scripts/hip/harness.cpp with every kernels-hip/*.hip, runs it on the fixtures.
#       Exit status 0 only if every case matches; the log also goes to $OUT/hip-on-nvidia.log.
#
# With the device tool: run `prepare` here, then
#   run(command="bash scripts/hip-on-nvidia.sh run", carry=[".carry/hip-on-nvidia"])
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.carry/hip-on-nvidia
case "${1:-}" in
prepare)
  hip_inc=${HIP_INCLUDE:-/usr/include}
  if [ ! -f "$hip_inc/hip/nvidia_detail/nvidia_hip_runtime_api.h" ]; then
    echo "error: HIP headers with nvidia_detail not found in $hip_inc (apt-get install libamdhip64-dev)" >&2
    exit 2
  fi
  rm -rf "$dir"
  mkdir -p "$dir/include"
  cp -r "$hip_inc/hip" "$dir/include/"
  cargo run -q -p duet-hip --example hip_fixtures -- "$dir/fixtures.bin"
  du -sh "$dir"
  ;;
run)
  [ -f "$dir/fixtures.bin" ] || { echo "error: run '$0 prepare' first (and carry $dir)" >&2; exit 2; }
  # Every kernel file must be part of the harness.
  for f in kernels-hip/*.hip; do
    grep -q "#include \"$(basename "$f")\"" scripts/hip/harness.cpp ||
      { echo "error: $f is not included by scripts/hip/harness.cpp" >&2; exit 2; }
  done
  work=$(mktemp -d)
  cp -r "$dir/include" "$work/include"
  nvcc --version | tail -2
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  arch=${DUET_NV_ARCH:-native}
  python3 scripts/hip/prune_nvidia_headers.py "$work/include" -arch="$arch"
  # --fmad=false: built as on AMD, where the backend passes -ffp-contract=off.
  nvcc -x cu -std=c++17 -O2 -arch="$arch" --fmad=false -D__HIP_PLATFORM_NVIDIA__ -I"$work/include" -Ikernels-hip \
    -diag-suppress 2810,940 -Xcompiler -w \
    scripts/hip/harness.cpp -o "$work/harness"
  log=${OUT:-$work}/hip-on-nvidia.log
  set +e
  "$work/harness" "$dir/fixtures.bin" | tee "$log"
  status=${PIPESTATUS[0]}
  exit "$status"
  ;;
*)
  sed -n '2,16p' "$0" >&2
  exit 2
  ;;
esac
