#!/usr/bin/env bash
# Runs the HIP kernel sources (kernels-hip/*.hip, through HIP's NVIDIA platform headers, warp 32)
# and the CUDA kernels (kernels-cuda/*.cu, compiled at run time by NVRTC exactly as the CUDA
# backend compiles them) on the same inputs on one NVIDIA GPU, and compares every output bit for
# bit (scripts/hip/vs_cuda.cpp). Prints one row per kernel case: identical, or DIFFERS with the
# count and the largest distance in ulp; then the kernels not compared, each with its reason.
#
#   scripts/hip-vs-cuda.sh prepare   # here (needs: apt-get install libamdhip64-dev)
#       copies Debian's HIP headers into .carry/hip-vs-cuda/
#   scripts/hip-vs-cuda.sh run       # on the NVIDIA machine (needs: nvcc with libnvrtc, a GPU)
#       prunes the copied headers for the local CUDA (scripts/hip/prune_nvidia_headers.py),
#       builds scripts/hip/vs_cuda.cpp with every kernels-hip/*.hip, runs it from the repository
#       root. Exit status 0 only if every compared case is identical; the log also goes to
#       $OUT/hip-vs-cuda.log.
#
# With the device tool: run `prepare` here, then
#   run(command="bash scripts/hip-vs-cuda.sh run", carry=[".carry/hip-vs-cuda"])
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.carry/hip-vs-cuda
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
  du -sh "$dir"
  ;;
run)
  [ -d "$dir/include/hip" ] || { echo "error: run '$0 prepare' first (and carry $dir)" >&2; exit 2; }
  for f in kernels-hip/*.hip; do
    grep -q "#include \"$(basename "$f")\"" scripts/hip/vs_cuda.cpp ||
      { echo "error: $f is not included by scripts/hip/vs_cuda.cpp" >&2; exit 2; }
  done
  work=$(mktemp -d)
  cp -r "$dir/include" "$work/include"
  nvcc --version | tail -2
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  arch=${DUET_NV_ARCH:-native}
  python3 scripts/hip/prune_nvidia_headers.py "$work/include" -arch="$arch"
  # libcuda from the driver (the toolkit's stub to link against), libnvrtc from the toolkit.
  cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
  libs=""
  for d in "$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib" "$cuda_root/lib64/stubs" \
      "$cuda_root/targets/x86_64-linux/lib/stubs"; do
    [ -d "$d" ] && libs="$libs -L$d"
  done
  for d in "$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib"; do
    [ -d "$d" ] && libs="$libs -Xlinker -rpath=$d"
  done
  # --fmad=false: the HIP kernels are built as on AMD, where the backend passes
  # -ffp-contract=off (every FMA is an explicit duet_fma).
  nvcc -x cu -std=c++17 -O2 -arch="$arch" --fmad=false -D__HIP_PLATFORM_NVIDIA__ \
    -I"$work/include" -Ikernels-hip -diag-suppress 2810,940 -Xcompiler -w \
    scripts/hip/vs_cuda.cpp -o "$work/vs_cuda" $libs -lcuda -lnvrtc
  log=${OUT:-$work}/hip-vs-cuda.log
  set +e
  "$work/vs_cuda" kernels-cuda 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  exit "$status"
  ;;
*)
  sed -n '2,18p' "$0" >&2
  exit 2
  ;;
esac
