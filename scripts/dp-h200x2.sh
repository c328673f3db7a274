#!/usr/bin/env bash
# Data parallelism on a 2-GPU machine (issue #10), in one device call: 1 GPU × batch 32 against
# 2 GPUs × 16 on the seed model for 50 steps (traces compared with `duet parity`, with and
# without --zero 1), then tokens/s on 1 and 2 GPUs for the seed and large models, with and
# without overlapping the gradient reductions (--no-overlap). NVLink multicast stays off.
#
#   scripts/dp-h200x2.sh pack   # here, after `cargo build --release --bin duet`: copies the
#                               #   stripped target/release/duet into .carry-dp/
#   scripts/dp-h200x2.sh run    # on the 2-GPU machine, in the repository copy with .carry-dp/
#                               #   carried; needs $OUT (one log per run, the traces)
# Run: run(command="OUT=$OUT bash scripts/dp-h200x2.sh run", carry=[".carry-dp"], kind="nvidia-h200-x2")
# Results of 2026-11-29: results/2026-11-29-h200x2-dp/.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

cmd_pack() {
  set -eo pipefail
  cd "$ROOT"
  [ -f target/release/duet ] || { echo "error: no target/release/duet: cargo build --release --bin duet first" >&2; exit 2; }
  mkdir -p .carry-dp && cp target/release/duet .carry-dp/ && strip .carry-dp/duet
}

# shellcheck disable=SC2086 # $D, $P, $L and the paths: split on purpose (P, L hold several flags)
cmd_run() {
  H="$ROOT/.carry-dp"; D=$H/duet
  [ -x "$D" ] || { echo "error: run '$0 pack' first (and carry .carry-dp)" >&2; exit 2; }
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 DUET_CUDA_CACHE_DIR=/tmp/dc
  t0=$(date +%s)
  nvidia-smi -L
  tr() { name=$1; shift; timeout 150 $D train --backend cuda "$@" >"$OUT/$name.log" 2>&1; rc=$?; echo "== $name rc=$rc [$(( $(date +%s) - t0 )) s] $(grep -E 'trained' "$OUT/$name.log" | tail -1)"; grep -iE "error|exact" "$OUT/$name.log" | head -3; }
  P="--preset seed --precision bf16 --batch 32 --loss-every 1 --log-every 10"
  tr g1 $P --steps 50 --trace $OUT/g1.jsonl
  tr g2 $P --steps 50 --gpus 2 --trace $OUT/g2.jsonl
  tr g2z $P --steps 50 --gpus 2 --zero 1 --trace $OUT/g2z.jsonl
  echo "== parity 1x32 vs 2x16"; $D parity $OUT/g1.jsonl $OUT/g2.jsonl 2>&1 | tail -3
  echo "== parity 1x32 vs 2x16 zero1"; $D parity $OUT/g1.jsonl $OUT/g2z.jsonl 2>&1 | tail -3
  tr s1 $P --steps 300
  tr s2 $P --steps 300 --gpus 2
  tr s2n $P --steps 300 --gpus 2 --no-overlap
  L="--preset large --precision bf16 --batch 32 --loss-every 1 --log-every 5"
  tr l1 $L --steps 15
  tr l2 $L --steps 15 --gpus 2
  tr l2n $L --steps 15 --gpus 2 --no-overlap
  grep -E "step (10|15)/" $OUT/l1.log $OUT/l2.log $OUT/l2n.log | tail -6
  grep -E "step (200|300)/" $OUT/s1.log $OUT/s2.log $OUT/s2n.log | tail -6
  echo "== total $(( $(date +%s) - t0 )) s"
}

case "${1:-}" in
pack) cmd_pack ;;
run) cmd_run ;;
help | -h | --help) usage ;;
*)
  usage >&2
  exit 2
  ;;
esac
