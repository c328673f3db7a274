#!/usr/bin/env bash
# Compiles every kernels-cuda/*.cu with NVRTC for sm_80, sm_89 and sm_90 (no GPU needed).
#
# NVRTC and the CUDA headers come from the nvidia-cuda-nvrtc / nvidia-cuda-runtime wheels
# (CUDA 13, files under nvidia/cu13/ in site-packages), installed into a virtual environment at
# $NVRTC_VENV (default: .venv-nvrtc in the repository root) when it is missing.
# Needs python3 (with the venv module) and, the first time, access to the Python package index.
#
# Usage: scripts/check-cuda-kernels.sh [sm_XY ...]      (default: sm_80 sm_89 sm_90)
# Exit status: 0 when every file compiles for every architecture, non-zero otherwise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${NVRTC_VENV:-$ROOT/.venv-nvrtc}"
NVRTC_VERSION="${NVRTC_VERSION:-13.0.88}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "check-cuda-kernels: creating $VENV"
    if ! "$PYTHON" -m venv "$VENV"; then
        echo "check-cuda-kernels: '$PYTHON -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
        rm -rf "$VENV"
        exit 2
    fi
fi
if ! "$VENV/bin/python" -m pip show -q nvidia-cuda-nvrtc nvidia-cuda-runtime >/dev/null 2>&1; then
    echo "check-cuda-kernels: installing nvidia-cuda-nvrtc==$NVRTC_VERSION nvidia-cuda-runtime==$NVRTC_VERSION"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "nvidia-cuda-nvrtc==$NVRTC_VERSION" "nvidia-cuda-runtime==$NVRTC_VERSION"
fi

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
CU="$SITE/nvidia/cu13"
if [ ! -d "$CU/lib" ] || [ ! -d "$CU/include" ]; then
    echo "check-cuda-kernels: $CU/{lib,include} not found after installing the wheels" >&2
    exit 2
fi

ARCHS=()
for a in "${@:-sm_80 sm_89 sm_90}"; do
    for x in $a; do ARCHS+=(--arch "$x"); done
done

# A passing result is kept in $DUET_KERNEL_CHECK_CACHE (when set) under the hash of the kernel
# sources, this check's sources, the NVRTC version and the architectures; a hit prints it again
# (marked "cached") instead of compiling.
key=""
if [ -n "${DUET_KERNEL_CHECK_CACHE:-}" ]; then
    mkdir -p "$DUET_KERNEL_CHECK_CACHE"
    key=$(cd "$ROOT" && { git ls-files -co --exclude-standard -z kernels-cuda kernels-shared \
            scripts/check_cuda_kernels.py scripts/check-cuda-kernels.sh | sort -z |
            xargs -0 sha256sum; echo "$NVRTC_VERSION ${ARCHS[*]}"; } | sha256sum | cut -c1-24)
    key="$DUET_KERNEL_CHECK_CACHE/nvrtc-$key.out"
    if [ -f "$key" ]; then
        echo "check-cuda-kernels: cached: these sources compiled before ($(basename "$key")):"
        cat "$key"
        exit 0
    fi
fi

out=$(mktemp)
set +e
"$VENV/bin/python" "$ROOT/scripts/check_cuda_kernels.py" \
    --kernels "$ROOT/kernels-cuda" \
    --nvrtc-lib-dir "$CU/lib" \
    --include-dir "$CU/include" \
    "${ARCHS[@]}" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 0 ] && [ -n "$key" ]; then
    mv "$out" "$key"
else
    rm -f "$out"
fi
exit "$rc"
