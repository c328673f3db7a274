#!/usr/bin/env bash
# Session 11: FP8 data parallelism on 2 H200s after the replay fix (26d7426): 1 GPU x 32 with
# CUDA graphs (default), 1 GPU x 32 without graphs, 2 GPUs x 16 (graphs), 2 GPUs x 16 --zero 1;
# traces compared with duet parity.
set -u
H="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"; D=$H/duet
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 DUET_CUDA_CACHE_DIR=/tmp/dc
t0=$(date +%s)
nvidia-smi -L
tr() { name=$1; shift; timeout 150 $D train --backend cuda "$@" >"$OUT/$name.log" 2>&1; rc=$?; echo "== $name rc=$rc [$(( $(date +%s) - t0 )) s] $(grep -E 'trained' "$OUT/$name.log" | tail -1)"; grep -iE "error|exact" "$OUT/$name.log" | head -3; }
P="--preset seed --precision fp8 --batch 32 --loss-every 1 --log-every 10 --weight-grad-dtype f32"
tr f1 $P --steps 30 --trace $OUT/f1.jsonl
tr f1n $P --steps 30 --no-graphs --trace $OUT/f1n.jsonl
tr f2 $P --steps 30 --gpus 2 --trace $OUT/f2.jsonl
tr f2z $P --steps 30 --gpus 2 --zero 1 --trace $OUT/f2z.jsonl
for pair in "f1 f1n" "f1n f2" "f1 f2" "f1 f2z"; do
  set -- $pair; echo "== parity $1 vs $2"; $D parity $OUT/$1.jsonl $OUT/$2.jsonl 2>&1 | tail -4
done
python3 - "$OUT" <<'PY'
import json, sys
for name in ["f1", "f1n", "f2"]:
    out = []
    for l in open(f"{sys.argv[1]}/{name}.jsonl"):
        s = json.loads(l)
        if s.get("kind") != "step": continue
        f = s.get("fp8") or {}
        k = next((k for k in f if "h.0.attn.c_attn.grad_output" in k), None)
        v = f.get(k) if k else None
        out.append((s["step"], round(s["loss"], 5), v and {kk: (round(vv, 6) if isinstance(vv, float) else vv) for kk, vv in v.items()}))
    print(name, out[:4], out[-1:])
PY
echo "== total $(( $(date +%s) - t0 )) s"
