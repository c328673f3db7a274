#!/usr/bin/env bash
# HIP on an NVIDIA GPU, three ways: the HIP kernel sources against the CPU backend
# (kernels-vs-cpu), the HIP kernel sources against the CUDA kernels bit for bit
# (kernels-vs-cuda), and the whole HIP backend through the hip-on-cuda stand-in libraries
# (standins). One script with subcommands (formerly scripts/hip-on-nvidia.sh,
# scripts/hip-vs-cuda.sh and scripts/hip-on-cuda.sh); `scripts/hip-nvidia.sh help` prints the
# usage text below.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

usage_intro() {
  cat <<USAGE
usage: $0 kernels-vs-cpu prepare|run
       $0 kernels-vs-cuda prepare|run
       $0 standins headers|check|pack|run A|B
       $0 help
USAGE
}

usage_kernels_vs_cpu() {
  cat <<'USAGE'

kernels-vs-cpu: runs the HIP kernel sources (kernels-hip/*.hip) on an NVIDIA GPU through HIP's
NVIDIA platform headers (hip/nvidia_detail, -D__HIP_PLATFORM_NVIDIA__), compiled with nvcc, and
compares every kernel's output with the CPU backend's on the same seeded random inputs.

  scripts/hip-nvidia.sh kernels-vs-cpu prepare   # here (needs: apt-get install libamdhip64-dev; cargo)
      copies Debian's HIP headers ($HIP_INCLUDE, default /usr/include) and writes the CPU
      fixtures into .carry/hip-on-nvidia/
  scripts/hip-nvidia.sh kernels-vs-cpu run       # on the NVIDIA machine (needs: nvcc, a GPU, python3)
      prunes the copied headers for the local CUDA (scripts/hip/prune_nvidia_headers.py),
      builds scripts/hip/harness.cpp with every kernels-hip/*.hip (-arch=$DUET_NV_ARCH, default
      native), runs it on the fixtures. Exit status 0 only if every case matches; the log also
      goes to $OUT/hip-on-nvidia.log.

  With the device tool: run `prepare` here, then
    run(command="bash scripts/hip-nvidia.sh kernels-vs-cpu run", carry=[".carry/hip-on-nvidia"])
USAGE
}

usage_kernels_vs_cuda() {
  cat <<'USAGE'

kernels-vs-cuda: runs the HIP kernel sources (kernels-hip/*.hip, through HIP's NVIDIA platform
headers, warp 32) and the CUDA kernels (kernels-cuda/*.cu, compiled at run time by NVRTC exactly
as the CUDA backend compiles them) on the same inputs on one NVIDIA GPU, and compares every
output bit for bit (scripts/hip/vs_cuda.cpp). Prints one row per kernel case: identical, or
DIFFERS with the count and the largest distance in ulp; then the kernels not compared, each with
its reason.

  scripts/hip-nvidia.sh kernels-vs-cuda prepare  # here (needs: apt-get install libamdhip64-dev)
      copies Debian's HIP headers ($HIP_INCLUDE, default /usr/include) into .carry/hip-vs-cuda/
  scripts/hip-nvidia.sh kernels-vs-cuda run      # on the NVIDIA machine (needs: nvcc with libnvrtc, a GPU)
      prunes the copied headers for the local CUDA (scripts/hip/prune_nvidia_headers.py),
      builds scripts/hip/vs_cuda.cpp with every kernels-hip/*.hip (-arch=$DUET_NV_ARCH, default
      native), runs it from the repository root. Exit status 0 only if every compared case is
      identical; the log also goes to $OUT/hip-vs-cuda.log.

  With the device tool: run `prepare` here, then
    run(command="bash scripts/hip-nvidia.sh kernels-vs-cuda run", carry=[".carry/hip-vs-cuda"])
USAGE
}

usage_standins() {
  cat <<'USAGE'

standins: the whole HIP backend on an NVIDIA GPU, through the hip-on-cuda stand-in libraries
(crates/hip/testing/hip-on-cuda: a TEST DOUBLE of libamdhip64/hiprtc/rocBLAS/hipBLASLt/RCCL
over CUDA, cuBLAS, NVRTC/nvcc and NCCL; read its README for what it can and cannot show).

  scripts/hip-nvidia.sh standins headers   # here: CUDA 13.0 headers from NVIDIA's PyPI wheels into
                                           #   /var/cache/duet-cuda-headers (what `check` builds with;
                                           #   $HOC_CUDA_HEADERS_CACHE overrides it, target/cuda-headers
                                           #   when it is not writable)
  scripts/hip-nvidia.sh standins check     # here and in CI (no GPU): builds both stand-in roots (ROCm
                                           #   6.4 and 7.2 ABIs, from the headers scripts/rocm-check.sh
                                           #   unpacked), checks each library exports exactly the
                                           #   symbols duet loads, and that duet without a GPU refuses
                                           #   the backend with a clear message and exit 1
  scripts/hip-nvidia.sh standins pack      # here: builds duet, every duet-hip test binary and the CUDA
                                           #   conformance binary, the two roots, a copy of HIP's
                                           #   NVIDIA-platform headers and a CPU trace, into
                                           #   .carry/hip-on-cuda/ (git-ignored)
  scripts/hip-nvidia.sh standins run A|B   # on the GPU machine, after `pack`:
      A: the stand-in roots set up, kernel caches warmed, duet info, every duet-hip test binary
         (the conformance suite among them) on gfx942 (ROCm 6.4 root) and on gfx950 (ROCm 7.2
         root), the CUDA conformance suite, and which checked outputs are bit-identical
         between CUDA and HIP (scripts/hip/compare_digests.py)
      B: duet parity HIP-on-CUDA vs CUDA (seed preset: fp32 and bf16 100 steps, fp8 50 steps on
         gfx942/FNUZ and gfx950/OCP), HIP vs the CPU (default preset), HIP twice byte for byte,
         and duet train --out / --stop-after / --resume, generate and bench on HIP
    Logs go to $OUT/hip-on-cuda-A.log / -B.log (the device tool brings them back). Exit status
    non-zero if a step failed.

  With the device tool (one call per phase, back to back so the machine stays warm):
    run(command="bash scripts/hip-nvidia.sh standins run A", carry=[".carry/hip-on-cuda"])
    run(command="bash scripts/hip-nvidia.sh standins run B", carry=[".carry/hip-on-cuda"])
USAGE
}

usage() { # [GROUP]: the whole text, or the intro and that group's section
  usage_intro
  case "${1:-}" in
  kernels-vs-cpu) usage_kernels_vs_cpu ;;
  kernels-vs-cuda) usage_kernels_vs_cuda ;;
  standins) usage_standins ;;
  *) usage_kernels_vs_cpu; usage_kernels_vs_cuda; usage_standins ;;
  esac
}

# Debian's HIP headers with the NVIDIA platform part: sets hip_inc (exit 2 when missing).
need_hip_headers() {
  hip_inc=${HIP_INCLUDE:-/usr/include}
  if [ ! -f "$hip_inc/hip/nvidia_detail/nvidia_hip_runtime_api.h" ]; then
    echo "error: HIP headers with nvidia_detail not found in $hip_inc (apt-get install libamdhip64-dev)" >&2
    exit 2
  fi
}

# ---- kernels-vs-cpu (formerly scripts/hip-on-nvidia.sh)
kernels_vs_cpu() {
  local dir=.carry/hip-on-nvidia
  case "${1:-}" in
  prepare)
    need_hip_headers
    rm -rf "$dir"
    mkdir -p "$dir/include"
    cp -r "$hip_inc/hip" "$dir/include/"
    cargo run -q -p duet-hip --example hip_fixtures -- "$dir/fixtures.bin"
    du -sh "$dir"
    ;;
  run)
    [ -f "$dir/fixtures.bin" ] || { echo "error: run '$0 kernels-vs-cpu prepare' first (and carry $dir)" >&2; exit 2; }
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
    nvcc -x cu -std=c++17 -O2 -arch="$arch" --fmad=false -D__HIP_PLATFORM_NVIDIA__ -I"$work/include" -Ikernels-hip -Ikernels-shared \
      -diag-suppress 2810,940 -Xcompiler -w \
      scripts/hip/harness.cpp -o "$work/harness"
    log=${OUT:-$work}/hip-on-nvidia.log
    set +e
    "$work/harness" "$dir/fixtures.bin" | tee "$log"
    status=${PIPESTATUS[0]}
    exit "$status"
    ;;
  *)
    usage kernels-vs-cpu >&2
    exit 2
    ;;
  esac
}

# ---- kernels-vs-cuda (formerly scripts/hip-vs-cuda.sh)
kernels_vs_cuda() {
  local dir=.carry/hip-vs-cuda
  case "${1:-}" in
  prepare)
    need_hip_headers
    rm -rf "$dir"
    mkdir -p "$dir/include"
    cp -r "$hip_inc/hip" "$dir/include/"
    du -sh "$dir"
    ;;
  run)
    [ -d "$dir/include/hip" ] || { echo "error: run '$0 kernels-vs-cuda prepare' first (and carry $dir)" >&2; exit 2; }
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
    # shellcheck disable=SC2086 # $libs: several words on purpose
    nvcc -x cu -std=c++17 -O2 -arch="$arch" --fmad=false -D__HIP_PLATFORM_NVIDIA__ \
      -I"$work/include" -Ikernels-hip -Ikernels-shared -diag-suppress 2810,940 -Xcompiler -w \
      scripts/hip/vs_cuda.cpp -o "$work/vs_cuda" $libs -lcuda -lnvrtc
    log=${OUT:-$work}/hip-vs-cuda.log
    set +e
    "$work/vs_cuda" kernels-cuda 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    exit "$status"
    ;;
  *)
    usage kernels-vs-cuda >&2
    exit 2
    ;;
  esac
}

# ---- standins (formerly scripts/hip-on-cuda.sh)
PLATFORM=crates/hip/testing/hip-on-cuda
PACK=.carry/hip-on-cuda

# Where `headers` puts and `check` / `pack` read CUDA 13.0's headers.
standins_headers_dir() {
  HEADERS_DIR=${HOC_CUDA_HEADERS_CACHE:-/var/cache/duet-cuda-headers}
  if ! { mkdir -p "$HEADERS_DIR" && test -w "$HEADERS_DIR"; } 2>/dev/null; then
    HEADERS_DIR="$ROOT/target/cuda-headers"
  fi
}

fetch_headers() {
  if [ -f "$HEADERS_DIR/include/cublas_v2.h" ] && [ -f "$HEADERS_DIR/include/crt/host_defines.h" ]; then
    echo "hip-on-cuda: CUDA headers cached in $HEADERS_DIR/include"
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  # Only the headers are kept (about 22 MB); the wheels (about 520 MB) are deleted.
  python3 -m pip download --quiet --no-deps --dest "$tmp" \
    "nvidia-cuda-runtime==13.0.*" "nvidia-cublas==13.0.*" "nvidia-cuda-nvrtc==13.0.*" \
    "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*"
  mkdir -p "$tmp/x" "$HEADERS_DIR"
  for w in "$tmp"/*.whl; do
    python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.startswith("nvidia/cu13/include/"):
        z.extract(n, sys.argv[2])' "$w" "$tmp/x"
  done
  rm -rf "$HEADERS_DIR/include"
  cp -r "$tmp/x/nvidia/cu13/include" "$HEADERS_DIR/include"
  rm -rf "$tmp"
  echo "hip-on-cuda: CUDA 13.0 headers in $HEADERS_DIR/include"
}

build_roots() { # DEST
  local dest=$1
  HOC_CUDA_INCLUDE=${HOC_CUDA_INCLUDE:-$HEADERS_DIR/include} "$PLATFORM/build.sh" "$dest/root-6.4" 6.4
  HOC_CUDA_INCLUDE=${HOC_CUDA_INCLUDE:-$HEADERS_DIR/include} "$PLATFORM/build.sh" "$dest/root-7.2" 7.2
}

# The symbols each stand-in must export: exactly what duet loads (from rocm_check's tables).
check_exports() { # ROOT VERSION
  local root=$1 ver=$2 out
  out=$(ROCM_PATH="$root" target/release/examples/rocm_check symbols 2>/dev/null)
  echo "$out" | sed 's/^/  /'
  if echo "$out" | grep -q '^MISSING\|^SKIP'; then
    echo "hip-on-cuda check: a library of the $ver root is missing or lacks a symbol duet loads" >&2
    return 1
  fi
  # Nothing beyond what duet loads: a call duet starts making must be added on purpose.
  local expected actual extra
  expected=$(ROCM_PATH="$root" target/release/examples/rocm_check symbol-list | sort -u)
  actual=$(for f in "$root"/lib/*; do nm -D --defined-only "$f" | awk '$2 == "T" {print $3}'; done | sort -u)
  extra=$(comm -13 <(echo "$expected") <(echo "$actual"))
  if [ -n "$extra" ]; then
    echo "hip-on-cuda check: the $ver root exports symbols duet does not load: $extra" >&2
    return 1
  fi
  echo "  exports of the $ver root: exactly the $(echo "$expected" | wc -l) symbols duet loads"
}

standins() {
  standins_headers_dir
  case "${1:-}" in
  headers)
    fetch_headers
    ;;
  check)
    fetch_headers
    cargo build --release -q -p duet-hip --example rocm_check
    cargo build --release -q --bin duet
    dest=target/hip-on-cuda
    rm -rf "$dest"
    build_roots "$dest"
    check_exports "$dest/root-6.4" 6.4
    check_exports "$dest/root-7.2" 7.2
    # No GPU here: the backend must be refused with the stand-in's reason, exit status 1.
    for ver in 6.4 7.2; do
      set +e
      msg=$(ROCM_PATH="$dest/root-$ver" target/release/duet train --backend hip --preset tiny --steps 1 2>&1)
      st=$?
      set -e
      echo "  duet train --backend hip on the $ver root without a GPU: exit $st"
      echo "$msg" | sed 's/^/    /' | tail -3
      if [ $st -ne 1 ] || ! echo "$msg" | grep -q "hipErrorNoDevice" || ! echo "$msg" | grep -q "hip-on-cuda: cuda:"; then
        echo "hip-on-cuda check: expected exit 1 naming hipErrorNoDevice and the missing CUDA driver" >&2
        exit 1
      fi
    done
    echo "hip-on-cuda check: ok"
    ;;
  pack)
    fetch_headers
    hip_inc=${HIP_INCLUDE:-/usr/include}
    if [ ! -f "$hip_inc/hip/nvidia_detail/nvidia_hip_runtime_api.h" ]; then
      echo "error: HIP headers with nvidia_detail not found in $hip_inc (apt-get install libamdhip64-dev)" >&2
      exit 2
    fi
    rm -rf "$PACK"
    mkdir -p "$PACK/bin/hip-tests"
    build_roots "$PACK"
    cp -r "$hip_inc/hip" "$PACK/hip-include"
    cargo build --release -q --bin duet
    cp target/release/duet "$PACK/bin/duet"
    bins() { # cargo test args -> executables
      cargo test --release --no-run --message-format=json "$@" 2>/dev/null | python3 scripts/test-binaries.py
    }
    while read -r b; do
      name=$(basename "$b" | sed -E 's/-[0-9a-f]{16}$//')
      cp "$b" "$PACK/bin/hip-tests/$name"
    done < <(bins -p duet-hip)
    cuda_conf=$(bins -p duet-cuda --test conformance)
    cp "$cuda_conf" "$PACK/bin/cuda-conformance"
    strip "$PACK"/bin/duet "$PACK"/bin/cuda-conformance "$PACK"/bin/hip-tests/* 2>/dev/null || true
    # The CPU side of HIP vs CPU (default preset), made here.
    target/release/duet train --backend cpu --steps 20 --eval-sequences 0 --log-every 0 \
      --trace "$PACK/cpu-default.jsonl" >/dev/null
    target/release/duet train --backend cpu --steps 20 --eval-sequences 0 --log-every 0 \
      --precision bf16 --trace "$PACK/cpu-default-bf16.jsonl" >/dev/null
    target/release/duet train --backend cpu --steps 20 --eval-sequences 0 --log-every 0 \
      --precision fp8 --fp8-fast-accum none --trace "$PACK/cpu-default-fp8.jsonl" >/dev/null
    # Two FP8 steps of the seed model on the CPU (about 20 s here): the CPU's side of the seed
    # model's first FP8 steps.
    target/release/duet train --backend cpu --preset seed --steps 2 --eval-sequences 0 --log-every 0 \
      --precision fp8 --fp8-fast-accum none --trace "$PACK/cpu-seed-fp8-2.jsonl" >/dev/null
    git rev-parse --short HEAD >"$PACK/COMMIT"
    du -sh "$PACK"
    ls "$PACK/bin/hip-tests"
    ;;
  run)
    phase=${2:?usage: $0 standins run A|B}
    [ -x "$PACK/bin/duet" ] || { echo "error: run '$0 standins pack' first (and carry $PACK)" >&2; exit 2; }
    set +e  # every step runs and is summarised; the exit status says whether one failed
    OUT=${OUT:-$(mktemp -d)}
    W=/tmp/hip-on-cuda-work
    mkdir -p "$W"
    exec > >(tee -a "$OUT/hip-on-cuda-$phase.log") 2>&1
    echo "== hip-on-cuda phase $phase at $(cat "$PACK/COMMIT"); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    dirs=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
             /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3*/dist-packages/nvidia/*/lib; do
      [ -d "$d" ] && dirs="$dirs:$d"
    done
    export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="/usr/local/cuda/bin:$PATH" RUST_BACKTRACE=1
    export DUET_HIP_CACHE="$W/hip-cache" DUET_CUDA_CACHE_DIR="$W/cuda-cache"
    D="$ROOT/$PACK/bin/duet"
    summary=()
    status=0
    step() { # name, command...
      local name=$1; shift
      echo; echo "== $name: $*"
      local t0=$SECONDS
      if "$@"; then summary+=("ok   $name ($((SECONDS - t0)) s)")
      else summary+=("FAIL $name (exit $?, $((SECONDS - t0)) s)"); status=1; fi
    }
    on() { # ver arch command...: the command on the stand-in root of ROCm `ver`, reporting `arch`
      local ver=$1 arch=$2; shift 2
      ROCM_PATH="$W/root-$ver" HIP_ON_CUDA_ARCH="$arch" "$@"
    }
    if [ ! -f "$W/ready" ]; then
      # The roots with HIP's NVIDIA-platform headers, pruned for this CUDA (hiprtc's include/).
      rm -rf "$W/root-6.4" "$W/root-7.2" "$W/hip-include"
      cp -r "$PACK/root-6.4" "$PACK/root-7.2" "$W/"
      mkdir -p "$W/hip-include"
      cp -r "$PACK/hip-include" "$W/hip-include/hip"
      python3 scripts/hip/prune_nvidia_headers.py "$W/hip-include" -arch=native >"$W/prune.log" 2>&1 ||
        { cat "$W/prune.log"; echo "error: header pruning failed"; exit 1; }
      tail -2 "$W/prune.log"
      for v in 6.4 7.2; do cp -r "$W/hip-include/." "$W/root-$v/include/"; done
      touch "$W/ready"
    fi
    case "$phase" in
    A)
      # Both kernel caches at once (nvcc compiles every module for each target/toolchain).
      t0=$SECONDS
      on 6.4 gfx942 "$D" info >"$W/info-6.4.txt" 2>&1 &
      p1=$!
      on 7.2 gfx950 "$D" info >"$W/info-7.2.txt" 2>&1 &
      p2=$!
      wait $p1; s1=$?; wait $p2; s2=$?
      echo "== duet info on both roots (cold kernel caches): $((SECONDS - t0)) s"
      sed -n '/^hip:/,$p' "$W/info-6.4.txt"; sed -n '/^hip:/,$p' "$W/info-7.2.txt"
      [ $s1 -eq 0 ] && grep -q '^hip: available' "$W/info-6.4.txt" && summary+=("ok   duet info gfx942 (ROCm 6.4 root)") || { summary+=("FAIL duet info gfx942"); status=1; }
      [ $s2 -eq 0 ] && grep -q '^hip: available' "$W/info-7.2.txt" && summary+=("ok   duet info gfx950 (ROCm 7.2 root)") || { summary+=("FAIL duet info gfx950"); status=1; }
      export DUET_TEST_SEED=${DUET_TEST_SEED:-20261202}
      rm -f "$OUT"/digests-*.tsv
      DUET_CONFORMANCE_DIGESTS="$OUT/digests-cuda.tsv" step "cuda conformance" "$PACK/bin/cuda-conformance"
      for b in "$PACK"/bin/hip-tests/*; do
        n=$(basename "$b")
        extra=()
        [ "$n" = conformance ] && extra=(env DUET_CONFORMANCE_DIGESTS="$OUT/digests-hip-gfx942.tsv")
        step "hip $n gfx942 (6.4)" on 6.4 gfx942 "${extra[@]}" "$b"
      done
      DUET_CONFORMANCE_DIGESTS="$OUT/digests-hip-gfx950.tsv" step "hip conformance gfx950 (7.2)" on 7.2 gfx950 "$PACK/bin/hip-tests/conformance"
      # Every output both backends check must be bit-identical, but for the listed exceptions.
      for a in gfx942 gfx950; do
        echo; echo "== bit-identical outputs: CUDA vs HIP-on-CUDA $a (table: $OUT/identical-$a.txt)"
        python3 scripts/hip/compare_digests.py "$OUT/digests-cuda.tsv" "$OUT/digests-hip-$a.tsv" \
          --exceptions scripts/hip/cuda-hip-exceptions.txt >"$OUT/identical-$a.txt"
        st=$?
        grep -v '^differs:' "$OUT/identical-$a.txt" | tail -4
        if [ $st -eq 0 ]; then summary+=("ok   CUDA vs HIP $a: every checked output bit-identical but the listed exceptions")
        else summary+=("FAIL CUDA vs HIP $a: outputs differ beyond the listed exceptions"); status=1; fi
      done
      gzip -f "$OUT"/digests-*.tsv
      # The MFMA flash attention is opt-in and needs wave64 CDNA: on this platform (warp 32) asking
      # for it must be refused with the reason, not run the portable kernels silently.
      echo; echo "== DUET_HIP_FLASH_MFMA=1 on a wave32 device"
      out=$(on 6.4 gfx942 env DUET_HIP_FLASH_MFMA=1 "$D" train --backend hip --steps 1 2>&1); st=$?
      echo "$out" | tail -3
      if [ $st -ne 0 ] && grep -q "DUET_HIP_FLASH_MFMA needs a wave64" <<<"$out"; then
        summary+=("ok   DUET_HIP_FLASH_MFMA refused on wave32 (exit $st)")
      else summary+=("FAIL DUET_HIP_FLASH_MFMA on wave32: exit $st, no clear refusal"); status=1; fi
      ;;
    B)
      T="$OUT/traces"
      mkdir -p "$T"
      common=(--eval-sequences 0 --log-every 0)
      par() { # name a b: must match
        local name=$1 a=$2 b=$3
        echo; echo "== parity $name"
        "$D" parity "$a" "$b" | tee "$T/parity-$name.txt"
        local st=${PIPESTATUS[0]}
        if [ "$st" -eq 0 ]; then summary+=("ok   parity $name: $(tail -1 "$T/parity-$name.txt")")
        else summary+=("FAIL parity $name (exit $st): $(tail -1 "$T/parity-$name.txt")"); status=1; fi
      }
      measure() { # name a b: FP8 across backends, measured (exit 1 = diverged is a result, 2 a failure)
        local name=$1 a=$2 b=$3
        echo; echo "== parity $name (measured)"
        "$D" parity "$a" "$b" | tee "$T/parity-$name.txt"
        local st=${PIPESTATUS[0]}
        if [ "$st" -le 1 ]; then summary+=("info parity $name: $(tail -1 "$T/parity-$name.txt")")
        else summary+=("FAIL parity $name (exit $st, not comparable)"); status=1; fi
      }
      trace_run() { # name backend ver arch args...
        local name=$1 be=$2 ver=$3 arch=$4; shift 4
        step "trace $name" on "$ver" "$arch" "$D" train --backend "$be" "${common[@]}" --trace "$T/$name.jsonl" "$@"
      }
      trace_run cuda-seed-fp32 cuda 6.4 gfx942 --preset seed --steps 100 --precision fp32
      trace_run hip-seed-fp32 hip 6.4 gfx942 --preset seed --steps 100 --precision fp32
      trace_run hip-seed-fp32-again hip 6.4 gfx942 --preset seed --steps 100 --precision fp32
      trace_run cuda-seed-bf16 cuda 6.4 gfx942 --preset seed --steps 100 --precision bf16
      trace_run hip-seed-bf16 hip 6.4 gfx942 --preset seed --steps 100 --precision bf16
      trace_run cuda-seed-fp8 cuda 6.4 gfx942 --preset seed --steps 50 --precision fp8 --fp8-fast-accum none --strict
      trace_run hip-seed-fp8-gfx942 hip 6.4 gfx942 --preset seed --steps 50 --precision fp8 --fp8-fast-accum none --strict
      trace_run hip-seed-fp8-gfx950 hip 7.2 gfx950 --preset seed --steps 50 --precision fp8 --fp8-fast-accum none --strict
      trace_run hip-default hip 6.4 gfx942 --steps 20
      # FP8 and bf16 on the default preset against the CPU too (its traces made beforehand by
      # `pack`): which side an FP8 difference between CUDA and HIP comes from.
      trace_run cuda-default-fp8 cuda 6.4 gfx942 --steps 20 --precision fp8 --fp8-fast-accum none --strict
      trace_run hip-default-fp8-gfx950 hip 7.2 gfx950 --steps 20 --precision fp8 --fp8-fast-accum none --strict
      trace_run hip-default-fp8-gfx942 hip 6.4 gfx942 --steps 20 --precision fp8 --fp8-fast-accum none --strict
      trace_run hip-default-bf16 hip 6.4 gfx942 --steps 20 --precision bf16
      trace_run cuda-default-bf16 cuda 6.4 gfx942 --steps 20 --precision bf16
      trace_run hip-seed-fp8-gfx950-again hip 7.2 gfx950 --preset seed --steps 50 --precision fp8 --fp8-fast-accum none --strict
      trace_run cuda-seed-fp8-2 cuda 6.4 gfx942 --preset seed --steps 2 --precision fp8 --fp8-fast-accum none --strict
      trace_run hip-seed-fp8-2-gfx950 hip 7.2 gfx950 --preset seed --steps 2 --precision fp8 --fp8-fast-accum none --strict
      par seed-fp32-cuda-vs-hip "$T/cuda-seed-fp32.jsonl" "$T/hip-seed-fp32.jsonl"
      par seed-bf16-cuda-vs-hip "$T/cuda-seed-bf16.jsonl" "$T/hip-seed-bf16.jsonl"
      measure seed-fp8-cuda-vs-hip-gfx942 "$T/cuda-seed-fp8.jsonl" "$T/hip-seed-fp8-gfx942.jsonl"
      measure seed-fp8-cuda-vs-hip-gfx950 "$T/cuda-seed-fp8.jsonl" "$T/hip-seed-fp8-gfx950.jsonl"
      par default-cpu-vs-hip "$PACK/cpu-default.jsonl" "$T/hip-default.jsonl"
      # bf16 against the CPU is measured, not required: at step 1 AdamW turns every gradient into
      # ±lr, so an element whose bf16 gradient is near zero (c_attn.bias, about 1e-6) takes the
      # sign of its rounding, and the CPU reference rounds differently from the GPU kernels (its own
      # exp, softmax and reduction orders). Seen 2026-12-03: CPU vs CUDA and CPU vs HIP flip the same
      # sample the same way; CUDA vs HIP match.
      measure default-bf16-cpu-vs-hip "$PACK/cpu-default-bf16.jsonl" "$T/hip-default-bf16.jsonl"
      measure default-bf16-cpu-vs-cuda "$PACK/cpu-default-bf16.jsonl" "$T/cuda-default-bf16.jsonl"
      # CUDA vs HIP on the default preset in bf16 is measured too, for the same reason: HIP's bias
      # gradients now come from hipBLASLt's BGRADB epilogue (on this platform the stand-in's own
      # column sums), CUDA's from cuBLASLt's, so the ~1e-6 c_attn.bias sample may round the other
      # way (seen 2026-12-03). The 100-step seed bf16 comparison above stays required.
      measure default-bf16-cuda-vs-hip "$T/cuda-default-bf16.jsonl" "$T/hip-default-bf16.jsonl"
      measure default-fp8-cpu-vs-cuda "$PACK/cpu-default-fp8.jsonl" "$T/cuda-default-fp8.jsonl"
      measure default-fp8-cpu-vs-hip-gfx950 "$PACK/cpu-default-fp8.jsonl" "$T/hip-default-fp8-gfx950.jsonl"
      measure default-fp8-cuda-vs-hip-gfx950 "$T/cuda-default-fp8.jsonl" "$T/hip-default-fp8-gfx950.jsonl"
      measure seed-fp8-2-cpu-vs-cuda "$PACK/cpu-seed-fp8-2.jsonl" "$T/cuda-seed-fp8-2.jsonl"
      measure seed-fp8-2-cpu-vs-hip-gfx950 "$PACK/cpu-seed-fp8-2.jsonl" "$T/hip-seed-fp8-2-gfx950.jsonl"
      measure default-fp8-cuda-vs-hip-gfx942 "$T/cuda-default-fp8.jsonl" "$T/hip-default-fp8-gfx942.jsonl"
      par seed-fp8-hip-gfx950-twice "$T/hip-seed-fp8-gfx950.jsonl" "$T/hip-seed-fp8-gfx950-again.jsonl"
      par seed-fp32-hip-twice "$T/hip-seed-fp32.jsonl" "$T/hip-seed-fp32-again.jsonl"
      if cmp <(tail -n +2 "$T/hip-seed-fp32.jsonl") <(tail -n +2 "$T/hip-seed-fp32-again.jsonl"); then
        summary+=("ok   hip run twice: step records byte-identical")
      else summary+=("FAIL hip run twice: step records differ"); status=1; fi
      # A user's session on the backend: train into --out, stop, resume, generate, bench.
      R="$W/run-hip"
      rm -rf "$R" "$W/run-hip-straight"
      step "train --out --stop-after 6" on 6.4 gfx942 "$D" train --backend hip --preset tiny --steps 12 --out "$R" --stop-after 6 --trace "$T/resume-a.jsonl"
      step "train --resume" on 6.4 gfx942 "$D" train --backend hip --resume "$R" --trace "$T/resume-b.jsonl"
      step "train straight 12 steps" on 6.4 gfx942 "$D" train --backend hip --preset tiny --steps 12 --out "$W/run-hip-straight" --trace "$T/straight.jsonl"
      if cmp <(tail -n +2 "$T/straight.jsonl" | tail -n 6) <(tail -n +2 "$T/resume-b.jsonl" | tail -n 6); then
        summary+=("ok   resumed steps 7-12 byte-identical to the uninterrupted run")
      else summary+=("FAIL resumed steps differ from the uninterrupted run"); status=1; fi
      step "generate" on 6.4 gfx942 "$D" generate --backend hip --checkpoint "$R" --tokens 1,2,3 --max-new 16
      step "generate --fp8 (gfx950)" on 7.2 gfx950 "$D" generate --backend hip --checkpoint "$R" --tokens 1,2,3 --max-new 16 --fp8
      step "bench seed fp32,bf16" on 6.4 gfx942 "$D" bench --backend hip --preset seed --precision fp32,bf16 --json "$OUT/bench-hip-seed.json"
      step "bench seed fp8 gfx950" on 7.2 gfx950 "$D" bench --backend hip --preset seed --precision fp8 --json "$OUT/bench-hip-seed-fp8.json"
      # The same steps unrecorded (A/B of the hipGraph path), and whether the recorded runs did
      # replay a recording (every run's "step_recorded").
      step "bench seed bf16 --no-graphs" on 6.4 gfx942 "$D" bench --backend hip --preset seed --precision bf16 --no-graphs --json "$OUT/bench-hip-seed-nographs.json"
      step "bench seed fp8 gfx950 --no-graphs" on 7.2 gfx950 "$D" bench --backend hip --preset seed --precision fp8 --no-graphs --json "$OUT/bench-hip-seed-fp8-nographs.json"
      # Flash attention against the composed attention (T x T buffers), same steps.
      step "bench seed bf16 DUET_HIP_UNFUSED" on 6.4 gfx942 env DUET_HIP_UNFUSED=1 "$D" bench --backend hip --preset seed --precision bf16 --json "$OUT/bench-hip-seed-unfused.json"
      step "bench seed bf16 DUET_HIP_NO_FLASH" on 6.4 gfx942 env DUET_HIP_NO_FLASH=1 "$D" bench --backend hip --preset seed --precision bf16 --json "$OUT/bench-hip-seed-noflash.json"
      recorded_check='import json, sys
def runs(x):
    if isinstance(x, dict):
        if "step_recorded" in x:
            yield x
        for v in x.values():
            yield from runs(v)
    elif isinstance(x, list):
        for v in x:
            yield from runs(v)
rs = [r for f in sys.argv[2:] for r in runs(json.load(open(f)))]
want = sys.argv[1] == "yes"
bad = [r.get("precision") for r in rs if bool(r["step_recorded"]) != want]
print(len(rs), "runs;", "not as expected:", bad)
sys.exit(0 if rs and not bad else 1)'
      if python3 -c "$recorded_check" yes "$OUT/bench-hip-seed.json" "$OUT/bench-hip-seed-fp8.json"; then
        summary+=("ok   hip bench fp32, bf16, fp8: every step replayed a recorded hipGraph")
      else summary+=("FAIL hip bench: steps were not recorded"); status=1; fi
      if python3 -c "$recorded_check" no "$OUT/bench-hip-seed-nographs.json" "$OUT/bench-hip-seed-fp8-nographs.json"; then
        summary+=("ok   hip bench --no-graphs: unrecorded steps")
      else summary+=("FAIL hip bench --no-graphs: recorded anyway"); status=1; fi
      # One file for the traces and parity reports (the device tool brings back a few files only).
      tar -czf "$OUT/traces.tar.gz" -C "$OUT" traces && rm -rf "$T"
      ;;
    *) echo "usage: $0 standins run A|B" >&2; exit 2 ;;
    esac
    echo; echo "== summary (phase $phase)"
    printf '%s\n' "${summary[@]}"
    [ $status -eq 0 ] && echo "== PHASE $phase PASSED" || echo "== PHASE $phase: SOME STEPS FAILED"
    exit $status
    ;;
  *)
    usage standins >&2
    exit 2
    ;;
  esac
}

case "${1:-}" in
kernels-vs-cpu) shift; kernels_vs_cpu "$@" ;;
kernels-vs-cuda) shift; kernels_vs_cuda "$@" ;;
standins) shift; standins "$@" ;;
help | -h | --help) usage ;;
*)
  usage >&2
  exit 2
  ;;
esac
