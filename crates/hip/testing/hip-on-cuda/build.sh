#!/usr/bin/env bash
# Builds the hip-on-cuda stand-in libraries (a TEST DOUBLE: README.md) into a ROCm-shaped root.
#
#   build.sh OUT_ROOT ROCM_VERSION
#     ROCM_VERSION 6.4: lib/libamdhip64.so.6 libhiprtc.so.6 librocblas.so.4 libhipblaslt.so.0 librccl.so.1
#     ROCM_VERSION 7.2: lib/libamdhip64.so.7 libhiprtc.so.7 librocblas.so.5 libhipblaslt.so.1 librccl.so.1
#
# Headers (no library of either vendor is linked; everything is loaded at run time):
#   ROCm:  $HOC_ROCM_INCLUDE, default $DUET_ROCM_CACHE/headers-<v>/usr/include (what
#          scripts/rocm-check.sh unpacks from Debian's packages; /var/cache/duet-rocm-check or
#          target/rocm-check). RCCL's header comes from the 7.2 tree for both (Debian's 6.4 has
#          no RCCL); its API is the same.
#   CUDA:  $HOC_CUDA_INCLUDE, default /usr/local/cuda/include when it exists, else
#          /var/cache/duet-cuda-headers/include (scripts/hip-nvidia.sh standins headers fetches the
#          headers of NVIDIA's CUDA 13.0 wheels from PyPI there).
# The libraries take HIP's NVIDIA-platform headers from OUT_ROOT/include at run time (hiprtc).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out=${1:?usage: build.sh OUT_ROOT 6.4|7.2}
ver=${2:?usage: build.sh OUT_ROOT 6.4|7.2}
case "$ver" in
6.4) hip=6 rocblas=4 lt=0 ;;
7.2) hip=7 rocblas=5 lt=1 ;;
*) echo "build.sh: ROCm version $ver: 6.4 or 7.2" >&2; exit 2 ;;
esac
# Where scripts/rocm-check.sh unpacked the headers ($DUET_ROCM_CACHE, its fallback target/rocm-check).
rocm_cache=${DUET_ROCM_CACHE:-/var/cache/duet-rocm-check}
[ -d "$rocm_cache/headers-$ver" ] || rocm_cache="$here/../../../../target/rocm-check"
rocm_inc=${HOC_ROCM_INCLUDE:-$rocm_cache/headers-$ver/usr/include}
rccl_inc=${HOC_RCCL_INCLUDE:-$rocm_cache/headers-7.2/usr/include}
if [ -z "${HOC_CUDA_INCLUDE:-}" ]; then
  if [ -f /usr/local/cuda/include/cublas_v2.h ]; then HOC_CUDA_INCLUDE=/usr/local/cuda/include
  else HOC_CUDA_INCLUDE=/var/cache/duet-cuda-headers/include; fi
fi
for f in "$rocm_inc/hip/hip_runtime_api.h" "$rocm_inc/hipblaslt/hipblaslt.h" "$rocm_inc/rocblas/rocblas.h" \
         "$rccl_inc/rccl/rccl.h" "$HOC_CUDA_INCLUDE/cuda.h" "$HOC_CUDA_INCLUDE/cublas_v2.h" "$HOC_CUDA_INCLUDE/nvrtc.h"; do
  [ -f "$f" ] || { echo "build.sh: $f not found (see the header notes at the top of $0)" >&2; exit 2; }
done
mkdir -p "$out/lib" "$out/include"
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT
CXX=${CXX:-g++}
flags=(-std=c++17 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Werror -D__HIP_PLATFORM_AMD__
       -I"$rocm_inc" -I"$HOC_CUDA_INCLUDE")
lib() { # name, sources...
  local name=$1; shift
  local objs=()
  local s
  for s in "$@"; do
    local o="$obj/$name-$(basename "$s" .cpp).o"
    local extra=()
    [ "$(basename "$s")" = rccl.cpp ] && extra=(-I"$rccl_inc")
    # cuBLAS's headers clash with HIP's: cublas_side.cpp sees the CUDA headers only.
    if [ "$(basename "$s")" = cublas_side.cpp ]; then
      "$CXX" -std=c++17 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Werror -I"$HOC_CUDA_INCLUDE" -c "$s" -o "$o"
    else
      "$CXX" "${flags[@]}" "${extra[@]}" -c "$s" -o "$o"
    fi
    objs+=("$o")
  done
  "$CXX" -shared -Wl,-soname,"$name" -Wl,--no-undefined -Wl,--exclude-libs,ALL -static-libstdc++ -static-libgcc \
    -o "$out/lib/$name" "${objs[@]}" -ldl -lpthread
}
src="$here/src"
lib "libamdhip64.so.$hip" "$src/hip.cpp" "$src/common.cpp"
lib "libhiprtc.so.$hip" "$src/hiprtc.cpp" "$src/common.cpp"
lib "librocblas.so.$rocblas" "$src/rocblas.cpp" "$src/cublas_side.cpp" "$src/common.cpp"
lib "libhipblaslt.so.$lt" "$src/hipblaslt.cpp" "$src/cublas_side.cpp" "$src/common.cpp"
lib "librccl.so.1" "$src/rccl.cpp" "$src/common.cpp"
printf 'hip-on-cuda stand-in root: ROCm %s headers, built %s\n' "$ver" "$(date -u +%FT%TZ)" >"$out/STAND-IN"
echo "built $out/lib: $(cd "$out/lib" && ls | tr '\n' ' ')"
