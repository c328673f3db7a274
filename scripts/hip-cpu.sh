#!/usr/bin/env bash
# The HIP backend on the CPU, at wavefront 64 and 32, through the hip-on-cpu stand-in libraries
# (crates/hip/testing/hip-on-cpu: a TEST DOUBLE of libamdhip64/hiprtc/rocBLAS/hipBLASLt whose
# hiprtc compiles the unchanged kernels-hip/ sources as host C++ and whose runtime runs a block's
# threads as fibers in waves of $HIP_ON_CPU_WAVE lanes; read its README for what it can and cannot
# show). No GPU needed; what it checks is listed below.
#
#   scripts/hip-cpu.sh build   # the stand-in root (ROCm 6.4 ABI, from the headers scripts/rocm-check.sh
#                              #   unpacked) and the fixture test, rebuilt only when their sources change
#   scripts/hip-cpu.sh check   # build, then (what CI runs, .ci/run):
#       1. the stand-ins export exactly the symbols duet loads (rocm_check symbols / symbol-list);
#       2. the backend refuses a device whose wave size it has not been checked at (wave 16);
#       3. the platform's own fixtures at wave 64 and 32 (fixtures/fixture_test.cpp): a deliberately
#          wave-size-dependent kernel CAUGHT at 64 and right at 32, partial barriers, divergent
#          shuffles and an MFMA builtin reported;
#       4. the HIP conformance suite (crates/hip/tests/conformance.rs, against the CPU backend with
#          the suite's tolerances) at wave 64 and at wave 32, both at once, recording every
#          checked output's digest (DUET_CONFORMANCE_DIGESTS);
#       5. every recorded output bit-identical between wave 64 and wave 32, but the listed
#          exceptions (crates/hip/testing/hip-on-cpu/wave-exceptions.txt; scripts/hip/compare_digests.py).
#     --full also runs the cases skipped by default for time ($SLOW_CASES below).
#   scripts/hip-cpu.sh run     # `duet train --backend hip` of the tiny model at wave 64 (and 32) against
#                              #   the CPU backend (--trace), compared with `duet parity`; the two waves'
#                              #   step records byte-identical
#   scripts/hip-cpu.sh table [CASE...]  # the per-kernel table: each conformance case on its own (all)
#                              #   at wave 64 and 32, with the kernels it launched (HIP_ON_CPU_TRACE),
#                              #   its digests and every launch's buffers' digests -> $OUT/kernel-table.md
#
# Caches: $HIP_ON_CPU_CACHE (default target/hip-on-cpu; CI passes $DUET_CI_CACHE/hip-on-cpu): the
# stand-in root, keyed by the hash of the platform's sources and the ROCm headers (an unchanged
# root keeps its file identity, so the HIP backend's own kernel cache, kernels-<wave>/, stays
# valid: it is keyed by the kernel sources, the compile options and the hiprtc file).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PLATFORM=crates/hip/testing/hip-on-cpu
CACHE=${HIP_ON_CPU_CACHE:-$ROOT/target/hip-on-cpu}
STANDIN=$CACHE/root-6.4
OUT=${OUT:-$CACHE/out}
# Cases left out of `check` for time, each with its reason (run them with --full):
#   embedding_backward_bits_follow_position_order: its one-token runs (n = 8192 and 20000 positions,
#   c = 768) make embedding_backward_wte scan O(n^2 c) (one block per position, the first
#   occurrence's block adding every later row): 3.5 minutes per wave here when the machine is
#   otherwise idle (9 when loaded), seconds on a GPU.
SLOW_CASES=(embedding_backward_bits_follow_position_order)
export HIP_ON_CPU_OPT=${HIP_ON_CPU_OPT:--O2}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

source_hash() {
  local rocm_cache=${DUET_ROCM_CACHE:-/var/cache/duet-rocm-check}
  [ -d "$rocm_cache/headers-6.4" ] || rocm_cache="$ROOT/target/rocm-check"
  # The hipBLASLt part shared with hip-on-cuda (crates/hip/testing/*.inc) is a source too.
  { find "$PLATFORM/src" "$PLATFORM/include" "$PLATFORM/fixtures" "$PLATFORM/build.sh" "$PLATFORM"/../*.inc -type f -print0 |
      sort -z | xargs -0 sha256sum
    sha256sum "$rocm_cache/headers-6.4/usr/include/hip/hip_version.h" 2>/dev/null || echo "no headers"
    g++ --version | head -1; } | sha256sum | cut -c1-16
}

build() {
  local h
  h=$(source_hash)
  if [ -f "$STANDIN/SOURCE-HASH" ] && [ "$(cat "$STANDIN/SOURCE-HASH")" = "$h" ] && [ -x "$CACHE/fixture_test" ]; then
    echo "hip-on-cpu: stand-in root $STANDIN up to date ($h)"
    return
  fi
  rm -rf "$STANDIN" "$CACHE"/kernels-*
  "$PLATFORM/build.sh" "$STANDIN" 6.4
  local rocm_cache=${DUET_ROCM_CACHE:-/var/cache/duet-rocm-check}
  [ -d "$rocm_cache/headers-6.4" ] || rocm_cache="$ROOT/target/rocm-check"
  g++ -std=c++17 -O1 -Wall -Wextra -Werror -D__HIP_PLATFORM_AMD__ -I"$rocm_cache/headers-6.4/usr/include" \
    -o "$CACHE/fixture_test" "$PLATFORM/fixtures/fixture_test.cpp" -ldl
  echo "$h" >"$STANDIN/SOURCE-HASH"
}

# The test binary of the HIP conformance suite (built by cargo if needed).
conformance_bin() {
  cargo test --release -q -p duet-hip --test conformance --no-run --message-format=json 2>/dev/null |
    python3 scripts/test-binaries.py | head -1
}

# on WAVE COMMAND...: the command on the stand-in root at wave WAVE, with that wave's kernel cache.
on() {
  local w=$1; shift
  ROCM_PATH="$STANDIN" HIP_ON_CPU_WAVE="$w" DUET_HIP_CACHE="$CACHE/kernels-$w" "$@"
}

summary=()
status=0
note() { # ok|FAIL text
  summary+=("$1 $2")
  [ "$1" = ok ] || [ "$1" = info ] || status=1
}

check() {
  local full=0
  [ "${1:-}" = --full ] && full=1
  build
  mkdir -p "$OUT"
  cargo build --release -q --bin duet
  cargo build --release -q -p duet-hip --example rocm_check
  local bin
  bin=$(conformance_bin)
  [ -x "$bin" ] || { echo "hip-cpu: the conformance test binary was not built" >&2; exit 2; }

  echo "== 1. exports: exactly the symbols duet loads"
  local syms expected actual extra
  syms=$(ROCM_PATH="$STANDIN" target/release/examples/rocm_check symbols 2>/dev/null || true)
  echo "$syms" | sed 's/^/  /'
  expected=$(ROCM_PATH="$STANDIN" target/release/examples/rocm_check symbol-list | sort -u)
  actual=$(for f in "$STANDIN"/lib/lib{amdhip64,hiprtc,rocblas,hipblaslt}.so.*; do
    nm -D --defined-only "$f" | awk '$2 == "T" {print $3}'; done | sort -u)
  extra=$(comm -13 <(echo "$expected") <(echo "$actual"))
  # RCCL is not part of this platform (one CPU device): its library is absent, a SKIP line.
  if echo "$syms" | grep -q '^MISSING' || echo "$syms" | grep '^SKIP' | grep -vq librccl || [ -n "$extra" ]; then
    note FAIL "exports: missing or extra symbols: ${extra:-see above}"
  else
    note ok "exports: the four stand-ins export only symbols duet loads, and every one it loads from them"
  fi

  echo "== 2. a wave size the backend has not been checked at is refused at device open"
  local msg
  msg=$(on 16 target/release/duet info 2>&1 | sed -n '/^hip:/,$p' | head -3)
  echo "$msg" | sed 's/^/  /'
  if grep -q "wavefront of 16 lanes" <<<"$msg" && grep -q "not available" <<<"$msg"; then
    note ok "wave 16: the HIP backend refuses the device at open"
  else
    note FAIL "wave 16: the HIP backend did not refuse the device"
  fi

  echo "== 3. the platform's fixtures"
  for w in 64 32; do
    if on "$w" "$CACHE/fixture_test" "$STANDIN" "$PLATFORM/fixtures" 2>&1 | tee "$OUT/fixtures-$w.log" | grep -v '^hip-on-cpu:'; then
      note ok "fixtures at wave $w: $(tail -1 "$OUT/fixtures-$w.log")"
    else
      note FAIL "fixtures at wave $w: $(tail -1 "$OUT/fixtures-$w.log")"
    fi
  done

  echo "== 4. the HIP conformance suite at wave 64 and at wave 32 (both at once)"
  local skip=()
  if [ $full -eq 0 ]; then for c in "${SLOW_CASES[@]}"; do skip+=(--skip "$c"); done; fi
  export DUET_TEST_SEED=${DUET_TEST_SEED:-20261202}
  # The kernel caches first, both waves at once (each compiles the ten modules).
  local t0=$SECONDS
  on 64 target/release/duet info >/dev/null 2>&1 &
  local p64=$!
  on 32 target/release/duet info >/dev/null 2>&1 &
  wait $p64 $! || true
  echo "  kernel caches ready: $((SECONDS - t0)) s"
  local pids=() w
  for w in 64 32; do
    rm -f "$OUT/digests-$w.tsv" "$OUT/trace-$w.tsv"
    on "$w" env DUET_CONFORMANCE_DIGESTS="$OUT/digests-$w.tsv" HIP_ON_CPU_TRACE="$OUT/trace-$w.tsv" \
      "$bin" --test-threads=1 "${skip[@]}" >"$OUT/conformance-$w.log" 2>&1 &
    pids+=($!)
  done
  local st64=0 st32=0
  wait "${pids[0]}" || st64=$?
  wait "${pids[1]}" || st32=$?
  for w in 64 32; do
    local st=$st64
    [ "$w" = 32 ] && st=$st32
    local res
    res=$(grep '^test result' "$OUT/conformance-$w.log" | tail -1)
    echo "  wave $w: $res"
    grep -E '^test .* FAILED$|^SKIP' "$OUT/conformance-$w.log" | sed 's/^/    /' || true
    if [ "$st" -eq 0 ]; then note ok "conformance at wave $w vs the CPU: $res"
    else note FAIL "conformance at wave $w vs the CPU (exit $st): $res"; fi
  done
  echo "  both waves: $((SECONDS - t0)) s"

  echo "== 5. every recorded output bit-identical between wave 64 and wave 32"
  if python3 scripts/hip/compare_digests.py "$OUT/digests-64.tsv" "$OUT/digests-32.tsv" \
      --exceptions "$PLATFORM/wave-exceptions.txt" >"$OUT/wave64-vs-wave32.txt"; then
    note ok "wave 64 vs wave 32: $(grep '^cases with every' "$OUT/wave64-vs-wave32.txt"); $(grep '^differing outputs' "$OUT/wave64-vs-wave32.txt")"
  else
    note FAIL "wave 64 vs wave 32: $(grep '^differing outputs' "$OUT/wave64-vs-wave32.txt" || echo 'no comparison')"
  fi
  grep -E '^total|^cases with|^differs|^FAIL|^differing' "$OUT/wave64-vs-wave32.txt" | sed 's/^/  /' || true
}

run_train() {
  build
  mkdir -p "$OUT"
  cargo build --release -q --bin duet
  local common=(--preset tiny --steps 10 --eval-sequences 0 --log-every 0)
  local t0=$SECONDS w
  target/release/duet train --backend cpu "${common[@]}" --trace "$OUT/train-cpu.jsonl"
  for w in 64 32; do
    on "$w" target/release/duet train --backend hip "${common[@]}" --trace "$OUT/train-hip-wave$w.jsonl"
  done
  par() { # name a b
    echo "== duet parity: $1"
    if target/release/duet parity "$2" "$3" | tee "$OUT/parity.txt"; then
      note ok "duet parity $1: $(tail -1 "$OUT/parity.txt")"
    else
      note FAIL "duet parity $1: $(tail -1 "$OUT/parity.txt")"
    fi
  }
  par "CPU vs HIP wave 64 (tiny, 10 steps)" "$OUT/train-cpu.jsonl" "$OUT/train-hip-wave64.jsonl"
  par "CPU vs HIP wave 32 (tiny, 10 steps)" "$OUT/train-cpu.jsonl" "$OUT/train-hip-wave32.jsonl"
  par "HIP wave 64 vs wave 32" "$OUT/train-hip-wave64.jsonl" "$OUT/train-hip-wave32.jsonl"
  # bf16 and FP8 (gfx942: FNUZ; the CPU computes the same family): against the CPU measured
  # (exit 1 = diverged is a result, as in hip-nvidia.sh), wave 64 against wave 32 byte-identical.
  local p
  for p in bf16 fp8; do
    local extra=(--precision "$p")
    [ "$p" = fp8 ] && extra+=(--fp8-fast-accum none --strict --fp8-family fnuz)
    target/release/duet train --backend cpu "${common[@]}" "${extra[@]}" --trace "$OUT/train-cpu-$p.jsonl" >/dev/null
    for w in 64 32; do
      on "$w" target/release/duet train --backend hip "${common[@]}" "${extra[@]}" \
        --trace "$OUT/train-hip-wave$w-$p.jsonl" >/dev/null
    done
    local st=0
    target/release/duet parity "$OUT/train-cpu-$p.jsonl" "$OUT/train-hip-wave64-$p.jsonl" >"$OUT/parity-$p.txt" || st=$?
    if [ $st -le 1 ]; then note info "duet parity CPU vs HIP wave 64, $p (measured): $(tail -1 "$OUT/parity-$p.txt")"
    else note FAIL "duet parity CPU vs HIP wave 64, $p: not comparable (exit $st)"; fi
  done
  for p in "" -bf16 -fp8; do
    if cmp -s <(tail -n +2 "$OUT/train-hip-wave64$p.jsonl") <(tail -n +2 "$OUT/train-hip-wave32$p.jsonl"); then
      note ok "HIP wave 64 vs wave 32${p:+ (${p#-})}: step records byte-identical"
    else
      note FAIL "HIP wave 64 vs wave 32${p:+ (${p#-})}: step records differ"
    fi
  done
  echo "  train + parity: $((SECONDS - t0)) s"
}

# The per-kernel table: each case alone at both waves (the two at once) with HIP_ON_CPU_TRACE, its
# own conformance digests (cases/digests-<wave>.tsv) and the digest of every buffer every launch was
# passed (HIP_ON_CPU_KERNEL_DIGESTS, cases/<case>-<wave>.kdig: every kernel's outputs, the ones the
# suite does not record too), then crates/hip/testing/hip-on-cpu/kernel_table.py. Every case, the
# slow ones included.
table() {
  build
  rm -rf "$OUT/cases"
  mkdir -p "$OUT/cases"
  cargo build --release -q --bin duet
  local bin
  bin=$(conformance_bin)
  export DUET_TEST_SEED=${DUET_TEST_SEED:-20261202}
  on 64 target/release/duet info >/dev/null 2>&1 &
  local p64=$!
  on 32 target/release/duet info >/dev/null 2>&1 &
  wait $p64 $! || true
  local cases c w
  cases=$("$bin" --list 2>/dev/null | sed -n 's/: test$//p')
  [ $# -gt 0 ] && cases="$*"  # a subset, by name
  for c in $cases; do
    local t0=$SECONDS
    for w in 64 32; do
      ( if on "$w" env HIP_ON_CPU_TRACE="$OUT/cases/$c-$w.trace" \
            HIP_ON_CPU_KERNEL_DIGESTS="$OUT/cases/$c-$w.kdig" \
            DUET_CONFORMANCE_DIGESTS="$OUT/cases/digests-$w.tsv" \
            "$bin" --exact "$c" >"$OUT/cases/$c-$w.log" 2>&1; then
          echo ok >"$OUT/cases/$c-$w.status"
        else
          echo FAILED >"$OUT/cases/$c-$w.status"
        fi ) &
    done
    wait
    echo "  $c: wave 64 $(cat "$OUT/cases/$c-64.status"), wave 32 $(cat "$OUT/cases/$c-32.status") ($((SECONDS - t0)) s)"
  done
  python3 "$PLATFORM/kernel_table.py" "$OUT/cases" >"$OUT/kernel-table.md"
  python3 scripts/hip/compare_digests.py "$OUT/cases/digests-64.tsv" "$OUT/cases/digests-32.tsv" \
    --exceptions "$PLATFORM/wave-exceptions.txt" | tail -3
  echo "hip-cpu: $OUT/kernel-table.md"
}

finish() {
  echo
  echo "== hip-cpu summary"
  printf '%s\n' "${summary[@]}"
  exit $status
}

case "${1:-}" in
build) build ;;
check) shift; check "$@"; finish ;;
run) run_train; finish ;;
table) shift; table "$@" ;;
help | -h | --help) usage ;;
*) usage >&2; exit 2 ;;
esac
