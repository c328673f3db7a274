#!/usr/bin/env bash
# Builds the hip-on-cpu stand-in libraries (a TEST DOUBLE: README.md) into a ROCm-shaped root.
#
#   build.sh OUT_ROOT ROCM_VERSION
#     ROCM_VERSION 6.4: lib/libamdhip64.so.6 libhiprtc.so.6 librocblas.so.4 libhipblaslt.so.0
#     ROCM_VERSION 7.2: lib/libamdhip64.so.7 libhiprtc.so.7 librocblas.so.5 libhipblaslt.so.1
#   plus lib/libhip-on-cpu-core.so (the platform they share) and include/hip-on-cpu/ (the kernel
#   language the hiprtc stand-in compiles kernels against).
#
# Headers: ROCm's, $HOC_ROCM_INCLUDE, default $DUET_ROCM_CACHE/headers-<v>/usr/include (what
# scripts/rocm-check.sh unpacks from Debian's packages; /var/cache/duet-rocm-check or
# target/rocm-check). No library of ROCm is linked; the stand-ins' signatures are checked by the
# compiler against these headers.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out=${1:?usage: build.sh OUT_ROOT 6.4|7.2}
ver=${2:?usage: build.sh OUT_ROOT 6.4|7.2}
case "$ver" in
6.4) hip=6 rocblas=4 lt=0 ;;
7.2) hip=7 rocblas=5 lt=1 ;;
*) echo "build.sh: ROCm version $ver: 6.4 or 7.2" >&2; exit 2 ;;
esac
rocm_cache=${DUET_ROCM_CACHE:-/var/cache/duet-rocm-check}
[ -d "$rocm_cache/headers-$ver" ] || rocm_cache="$here/../../../../target/rocm-check"
rocm_inc=${HOC_ROCM_INCLUDE:-$rocm_cache/headers-$ver/usr/include}
for f in "$rocm_inc/hip/hip_runtime_api.h" "$rocm_inc/hipblaslt/hipblaslt.h" "$rocm_inc/rocblas/rocblas.h"; do
  [ -f "$f" ] || { echo "build.sh: $f not found (run scripts/rocm-check.sh, or set HOC_ROCM_INCLUDE)" >&2; exit 2; }
done
mkdir -p "$out/lib" "$out/include/hip-on-cpu"
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT
CXX=${CXX:-g++}
flags=(-std=c++17 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Werror -D__HIP_PLATFORM_AMD__ -I"$rocm_inc")
src="$here/src"
core=libhip-on-cpu-core.so
"$CXX" "${flags[@]}" -shared -Wl,-soname,$core -Wl,--no-undefined -o "$out/lib/$core" "$src/core.cpp" -ldl -lpthread
lib() { # name, sources...
  local name=$1; shift
  "$CXX" "${flags[@]}" -shared -Wl,-soname,"$name" -Wl,--no-undefined -Wl,-rpath,'$ORIGIN' \
    -o "$out/lib/$name" "$@" -L"$out/lib" -l:$core -ldl -lpthread
}
lib "libamdhip64.so.$hip" "$src/hip.cpp" &
lib "libhiprtc.so.$hip" "$src/hiprtc.cpp" &
lib "librocblas.so.$rocblas" "$src/rocblas.cpp" &
lib "libhipblaslt.so.$lt" "$src/hipblaslt.cpp" &
for j in $(jobs -p); do wait "$j"; done
cp "$here/include/kernel_lang.h" "$here/include/hoc_abi.h" "$out/include/hip-on-cpu/"
printf 'hip-on-cpu stand-in root: ROCm %s headers\n' "$ver" >"$out/STAND-IN"
echo "built $out/lib: $(cd "$out/lib" && ls | tr '\n' ' ')"
