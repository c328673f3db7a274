#!/usr/bin/env bash
# Session 46 call 1: the new binary's tests, gpt2 A/B (head 5d18353 vs new),
# PyTorch in the same call (gpt2 and gpt2-medium), ncu profile of the gpt2 step.
set -uo pipefail
T0=$SECONDS
el() { echo $((SECONDS-T0)); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version,memory.total --format=csv | tee $OUT/gpu.txt
dirs=""; for d in /usr/local/cuda/lib64 /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib; do [ -d "$d" ] && dirs="$dirs:$d"; done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DUET_CUDA_CACHE_DIR=/tmp/duet-cache
G=.carry/gpu-tests
echo "binaries: new $(.carry/duet --version) head $(.carry/duet-head --version)" | tee $OUT/versions.txt
{
for t in cross_entropy_caches cuda_device conformance; do
  s=$SECONDS; echo "== $t"; timeout 200 $G/$t --show-output 2>&1 | grep -E "^test |test result|SKIP|panicked|refused|FAIL|differs" | head -80; echo "== $t: $((SECONDS-s)) s"
done
echo "== ce_bench"; timeout 60 $G/ce_bench bf16
echo "tests+ce_bench done at $(el) s"
} 2>&1 | tee $OUT/tests.txt
{
ROUNDS=2 RUN_TIMEOUT=100 bash scripts/bench/ab.sh /tmp/ab 'head-bf16|.carry/duet-head|--preset gpt2 --precision bf16' 'new-bf16|.carry/duet|--preset gpt2 --precision bf16'
ROUNDS=1 RUN_TIMEOUT=100 bash scripts/bench/ab.sh /tmp/ab 'head-fp8|.carry/duet-head|--preset gpt2 --precision fp8' 'new-fp8|.carry/duet|--preset gpt2 --precision fp8'
grep -h "duet-cuda\|warning\|not recorded\|unrecorded" /tmp/ab/*.log | sort | uniq -c | head
python3 -c "
import json,glob
for p in sorted(glob.glob('/tmp/ab/*.json')):
    d=json.load(open(p)); t=d.get('telemetry') or {}
    print(p.split('/')[-1], 'recorded', d.get('step_recorded'), 'mfu', round(d['mfu'],3), 'ceiling', round(d['gemm_ceiling_tflops'],1), 'rev', d['git_rev'], 'clock', t.get('sm_clock_mhz_median'), 'pcap', t.get('power_capped_share'))
"
echo "gpt2 duet done at $(el) s"
} 2>&1 | tee $OUT/bench.txt
tpeak() { sort -n /tmp/mem.txt | tail -1; }
torch_run() { # preset modes batch
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > /tmp/mem.txt & smi=$!
  PYTHONUNBUFFERED=1 timeout $4 python3 scripts/bench/torch_ref.py --preset $1 --modes $2 $3 --warmup 10 --iters 20 --json $OUT/torch-$1.jsonl > /tmp/torch-$1.log 2>&1
  echo "torch $1 $2 rc=$? device memory peak $(tpeak) MiB"; kill $smi
  python3 -c "import json; [print(json.loads(l)['mode'], round(json.loads(l)['ms_per_step_median'],2), 'ms', 'mfu', round(json.loads(l).get('mfu') or 0,3)) for l in open('$OUT/torch-$1.jsonl')]"
  tail -3 /tmp/torch-$1.log
}
{
torch_run gpt2 compile-bf16-ro "" 150
echo "torch gpt2 done at $(el) s"
if [ $(el) -lt 330 ]; then
  ROUNDS=1 RUN_TIMEOUT=80 bash scripts/bench/ab.sh /tmp/ab2 'new-medium-bf16|.carry/duet|--preset gpt2-medium --batch 16 --precision bf16' 'new-medium-fp8|.carry/duet|--preset gpt2-medium --batch 16 --precision fp8'
fi
if [ $(el) -lt 390 ]; then torch_run gpt2-medium compile-bf16-ro "" 120; fi
echo "medium done at $(el) s"
} 2>&1 | tee -a $OUT/bench.txt
tar czf $OUT/ab.tgz -C /tmp ab ab2 2>/dev/null
{
if [ $(el) -lt 420 ]; then PRECISIONS=bf16 timeout $((570-$(el))) bash scripts/bench/profile-gpt2.sh /tmp/prof .carry/duet; fi
echo "all done at $(el) s"
} 2>&1 | tee $OUT/profile.txt
cp /tmp/prof/*kernels.txt $OUT/ 2>/dev/null
cp /tmp/torch-*.log $OUT/ 2>/dev/null
