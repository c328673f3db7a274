#!/usr/bin/env bash
# Session call 1: tests of the new paths, the classifier's caches, the BGRADB fallbacks, gpt2 A/B.
set -uo pipefail
T0=$SECONDS
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv
dirs=""; for d in /usr/local/cuda/lib64 /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib; do [ -d "$d" ] && dirs="$dirs:$d"; done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DUET_CUDA_CACHE_DIR=/tmp/duet-cache
G=.carry/gpu-tests
{
for t in cross_entropy_caches cuda_device conformance; do
  s=$SECONDS; echo "== $t"; timeout 200 $G/$t --show-output 2>&1 | grep -E "^test |test result|SKIP|panicked|refused|FAIL|differs" | head -80; echo "== $t: $((SECONDS-s)) s"
done
echo "== ce_bench"; timeout 60 .carry/t/ce_bench bf16
echo "tests+ce_bench done at $((SECONDS-T0)) s"
} 2>&1 | tee $OUT/tests.txt
{
echo "binaries: new $(cat .carry/version.txt 2>/dev/null) base $(cat .carry/base-version.txt)"
ROUNDS=2 RUN_TIMEOUT=120 bash scripts/bench/ab.sh /tmp/ab 'base-bf16|.carry/duet-base|--preset gpt2 --precision bf16' 'new-bf16|.carry/duet|--preset gpt2 --precision bf16' 'new-bf16-autotune|.carry/duet|--preset gpt2 --precision bf16 --gemm-autotune'
ROUNDS=1 RUN_TIMEOUT=120 bash scripts/bench/ab.sh /tmp/ab 'base-fp8|.carry/duet-base|--preset gpt2 --precision fp8' 'new-fp8|.carry/duet|--preset gpt2 --precision fp8'
grep -h "duet-cuda" /tmp/ab/*.log | sort | uniq -c
echo "benches done at $((SECONDS-T0)) s"
} 2>&1 | tee $OUT/bench.txt
tar czf $OUT/ab.tgz -C /tmp ab
{
if [ $((SECONDS-T0)) -lt 330 ]; then
  ROUNDS=1 RUN_TIMEOUT=90 bash scripts/bench/ab.sh /tmp/ab2 'new-medium-bf16|.carry/duet|--preset gpt2-medium --batch 16 --precision bf16' 'new-medium-fp8|.carry/duet|--preset gpt2-medium --batch 16 --precision fp8'
fi
if [ $((SECONDS-T0)) -lt 380 ]; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > /tmp/mem.txt & smi=$!
  PYTHONUNBUFFERED=1 timeout 140 python3 scripts/bench/torch_ref.py --preset gpt2 --modes compile-bf16-ro --warmup 10 --iters 20 --json $OUT/torch-gpt2.jsonl > /tmp/torch.log 2>&1
  echo "torch rc=$? device memory peak $(sort -n /tmp/mem.txt | tail -1) MiB"; kill $smi
  python3 -c "import json; [print(json.loads(l)['mode'], round(json.loads(l)['ms_per_step_median'],2), 'ms') for l in open('$OUT/torch-gpt2.jsonl')]"
fi
echo "all done at $((SECONDS-T0)) s"
} 2>&1 | tee -a $OUT/bench.txt
tar czf $OUT/ab.tgz -C /tmp ab ab2 2>/dev/null
