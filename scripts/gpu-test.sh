#!/usr/bin/env bash
# The CUDA backend's GPU tests: built and packed here, run on the GPU machine.
#
#   scripts/gpu-test.sh pack [extra cargo args...]   # here: builds and packs into .carry/ (git-ignored)
#       .carry/gpu-tests/<name>   stripped test binaries of duet-cuda (unit + integration tests)
#                                 and the op_timing example
#   scripts/gpu-test.sh run                          # on the GPU machine, in the repository copy
#                                                    #   with .carry/ carried
#
# Then run on the GPU machine with the device tool:
#   run(command="bash scripts/gpu-test.sh run", carry=[".carry"])
# The runner finds the CUDA libraries there, prints the GPU, runs the conformance suite first on
# a cold kernel cache (logged on its own to $OUT/conformance-first-run.log), then every other
# test binary, then the suite again CONFORMANCE_REPEATS times (default 3) from the warm cache, and
# copies the full log to $OUT/gpu-tests.log when $OUT is set. Exit status: non-zero if any test
# binary fails or no GPU is visible. KERNELS_COMPILE_SKIP_ARCHS=1 skips the sm_80/89/90 compile
# of every module (CI does it without a GPU); DUET_CUDA_CACHE_DIR names the kernel cache (default:
# a fresh folder, so the first binaries start cold).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.carry"
cd "$ROOT"

usage() {
    sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

cmd_pack() { # [extra cargo args...]
    echo "gpu-test: building duet-cuda tests (release)"
    mapfile -t BINS < <(
        cargo test -p duet-cuda --release --no-run --message-format=json "$@" 2>/dev/null |
            python3 scripts/test-binaries.py
    )
    if [ "${#BINS[@]}" -eq 0 ]; then
        echo "gpu-test: no test binaries were built; rerun 'cargo test -p duet-cuda --release --no-run' to see why" >&2
        exit 1
    fi

    echo "gpu-test: building the op_timing example (release)"
    cargo build -p duet-cuda --release --example op_timing "$@" >/dev/null 2>&1 ||
        cargo build -p duet-cuda --release --example op_timing "$@"
    BINS+=("$ROOT/target/release/examples/op_timing")

    rm -rf "$CARRY/gpu-tests"
    mkdir -p "$CARRY/gpu-tests"
    for b in "${BINS[@]}"; do
        # target/release/deps/conformance-0123abcd → conformance
        name="$(basename "$b" | sed -E 's/-[0-9a-f]{16}$//')"
        cp "$b" "$CARRY/gpu-tests/$name"
        strip "$CARRY/gpu-tests/$name" 2>/dev/null || true
        echo "gpu-test: packed $name ($(du -h "$CARRY/gpu-tests/$name" | cut -f1))"
    done

    size="$(du -sm "$CARRY" | cut -f1)"
    echo "gpu-test: .carry is ${size} MiB (the device tool carries at most 64 MiB)"
    if [ "$size" -ge 64 ]; then
        echo "gpu-test: .carry is too large to carry" >&2
        exit 1
    fi
    cat <<PACKED

Run on the GPU machine with the device tool:
  run(command="bash scripts/gpu-test.sh run", carry=[".carry"])
PACKED
}

# Runs duet-cuda's test binaries on a GPU machine (packed by `pack`).
cmd_run() {
    set +e
    [ -d "$CARRY/gpu-tests" ] || { echo "error: run '$0 pack' first (and carry .carry)" >&2; exit 2; }
    LOG="$(mktemp)"
    exec > >(tee "$LOG") 2>&1

    echo "== GPU"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader || {
        echo "no NVIDIA GPU visible"; exit 2; }

    # Where the CUDA 13 libraries live on this machine (the backend also searches these itself).
    dirs=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
             /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib; do
        [ -d "$d" ] && dirs="$dirs:$d"
    done
    export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    # Start cold (NVRTC compiles everything) in a fresh folder, unless the caller names one.
    DUET_CUDA_CACHE_DIR="${DUET_CUDA_CACHE_DIR:-$(mktemp -d)/duet-cuda-cache}"
    export DUET_CUDA_CACHE_DIR
    export RUST_BACKTRACE=1

    status=0
    run() {
        local name="$1"; shift
        echo
        echo "== $name $*"
        local t0
        t0=$(date +%s%N)
        "$CARRY/gpu-tests/$name" "$@" || status=1
        echo "== $name: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    }
    # The conformance suite first, on the cold kernel cache (NVRTC compiles every module while the
    # suite's cases run in parallel threads: the first full run after the machine started is where
    # issue 49's failures showed), logged on its own as well.
    if [ -x "$CARRY/gpu-tests/conformance" ]; then
        echo; echo "== conformance, first run (cold kernel cache)"
        "$CARRY/gpu-tests/conformance" 2>&1 | tee "${OUT:-/tmp}/conformance-first-run.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    fi
    # Kernel compilation (the cache is warm now), then everything else.
    # KERNELS_COMPILE_SKIP_ARCHS=1 skips the sm_80/89/90 compile of every module (CI does it without
    # a GPU; it takes minutes of GPU-machine time) and keeps the load-on-this-GPU checks.
    kc_args=()
    [ -n "${KERNELS_COMPILE_SKIP_ARCHS:-}" ] && kc_args=(--skip every_module_compiles_for_ampere_ada_hopper)
    [ -x "$CARRY/gpu-tests/kernels_compile" ] && run kernels_compile --test-threads=1 --show-output "${kc_args[@]}"
    for b in "$CARRY"/gpu-tests/*; do
        name="$(basename "$b")"
        case "$name" in kernels_compile | op_timing | conformance) continue ;; esac
        run "$name" --show-output
    done
    # The conformance suite again with fresh random inputs and the warm kernel cache, timed
    # (CONFORMANCE_REPEATS times, default 3).
    for _ in $(seq "${CONFORMANCE_REPEATS:-3}"); do
        [ -x "$CARRY/gpu-tests/conformance" ] && run conformance
    done
    # Op timings at the seed model's shapes (informational).
    if [ -x "$CARRY/gpu-tests/op_timing" ]; then
        echo; echo "== op_timing f32"; "$CARRY/gpu-tests/op_timing" f32 || status=1
        echo; echo "== op_timing bf16"; "$CARRY/gpu-tests/op_timing" bf16 || status=1
    fi
    # shellcheck disable=SC2012 # a listing for the log
    ls -la "$DUET_CUDA_CACHE_DIR" | head -20

    echo
    if [ $status -eq 0 ]; then echo "== ALL GPU TESTS PASSED"; else echo "== SOME GPU TESTS FAILED"; fi
    [ -n "${OUT:-}" ] && cp "$LOG" "$OUT/gpu-tests.log"
    exit $status
}

case "${1:-}" in
pack) shift; cmd_pack "$@" ;;
run) shift; cmd_run ;;
help | -h | --help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac
