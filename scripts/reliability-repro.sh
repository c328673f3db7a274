#!/usr/bin/env bash
# The reproductions of issue 32's defects, each run with two duet binaries side by side:
#   bash scripts/reliability-repro.sh OLD_DUET NEW_DUET OUT_DIR
# For each case it prints (and writes to OUT_DIR/<case>.txt) the command, the exit code and
# what shows the defect or its fix (stderr's last lines, file hashes, sizes). Cases that need
# root (a size-limited tmpfs, a memory cgroup) say SKIP without it. Nothing here decides
# pass/fail: the tests in tests/ do; this is the before/after record.
set -uo pipefail
OLD=$(realpath "$1"); NEW=$(realpath "$2"); OUT=$(realpath -m "$3")
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/duet-repro.XXXXXX)
trap 'umount "$WORK"/*/tmpfs 2>/dev/null; rm -rf "$WORK"' EXIT
export DUET_BACKEND=cpu

corpus() { python3 -c "print('the quick brown fox jumps over the lazy dog. ' * 120)" > "$1"; }
h() { sha256sum "$1" 2>/dev/null | cut -c1-16 || echo missing; }
# run LABEL TIMEOUT CMD...: the exit code and the last lines of stderr.
run() {
  local label=$1 t=$2; shift 2
  timeout -k 2 "$t" "$@" >"$D/out.txt" 2>"$D/err.txt"
  local rc=$?
  echo "[$label] exit $rc$([ $rc = 124 ] && echo ' (timed out)')"
  tail -n 2 "$D/err.txt" | cut -c1-400 | sed 's/^/    /'
}
case_begin() {
  CASE=$1
  exec 3>&1 1> >(tee "$OUT/$CASE.txt" >&3)
  echo "== $CASE: $2"
}
case_end() { exec 1>&3 3>&-; sleep 0.1; }

each() { # each FUNCTION: runs it for OLD and NEW in fresh folders
  for which in OLD NEW; do
    local bin=$OLD; [ $which = NEW ] && bin=$NEW
    D="$WORK/$CASE-$which"; mkdir -p "$D"; cd "$D" || exit 1
    echo "-- $which ($("$bin" --version))"
    "$1" "$bin"
  done
}

c1() {
  corpus corpus.txt; ln corpus.txt m.jsonl; local before; before=$(h corpus.txt)
  run "duet train --preset tiny --steps 3 --data corpus.txt --metrics m.jsonl  (m.jsonl a hard link of corpus.txt)" 60 \
    "$1" train --preset tiny --steps 3 --log-every 0 --data corpus.txt --metrics m.jsonl
  echo "    corpus.txt $before -> $(h corpus.txt)"
}
case_begin 1-hard-links "outputs compared with inputs by file identity"; each c1; case_end

c2() {
  run "duet train --preset tiny --steps 50 --metrics /dev/full --out run" 60 \
    "$1" train --preset tiny --steps 50 --log-every 0 --metrics /dev/full --out run
  echo "    run/: $(ls run 2>/dev/null | tr '\n' ' ')"
  mkdir -p tmpfs
  if mount -t tmpfs -o size=1m tmpfs tmpfs 2>/dev/null; then
    "$1" train --preset tiny --steps 300 --stop-after 10 --log-every 0 --out tmpfs/run >/dev/null 2>&1
    local before; before=$(h tmpfs/run/checkpoint.safetensors)
    head -c 2000000 /dev/zero > tmpfs/filler 2>/dev/null; truncate -s -16K tmpfs/filler
    run "full 1 MiB tmpfs: duet train --resume tmpfs/run --out tmpfs/run" 60 \
      "$1" train --resume tmpfs/run --out tmpfs/run --log-every 0
    echo "    checkpoint $before -> $(h tmpfs/run/checkpoint.safetensors); temporaries: $(ls -a tmpfs/run | grep -c tmp-)"
    umount tmpfs
  else
    echo "    SKIP the tmpfs case: cannot mount a tmpfs (needs root)"
  fi
}
case_begin 2-failed-writes "a failed metrics write saves a checkpoint and names the file"; each c2; case_end

c3() {
  # timeout signals duet itself (SIGTERM, then SIGKILL 2 s later), not a shell around it.
  timeout -k 2 30 "$1" train --preset tiny --steps 20 --log-every 0 --metrics /dev/stdout --out o \
    2>err.txt | cat > piped.txt
  local rc=${PIPESTATUS[0]}
  echo "[duet train --preset tiny --steps 20 --metrics /dev/stdout --out o | cat] exit $rc$([ $rc = 124 ] || [ $rc = 137 ] && echo ' (timed out; killed)')"
  tail -n 1 err.txt | cut -c1-300 | sed 's/^/    /'
  timeout -k 2 30 "$1" train --preset tiny --steps 20 --log-every 0 --metrics /dev/stdout --out o2 \
    > redirected.txt 2>err.txt
  rc=$?
  echo "[duet train ... --metrics /dev/stdout --out o2 > file] exit $rc"
  tail -n 1 err.txt | cut -c1-300 | sed 's/^/    /'
  echo "    redirected.txt: $(grep -c '"step"' redirected.txt) metrics lines, $(grep -c 'trained' redirected.txt) summary line"
}
case_begin 3-metrics-stdout "--metrics /dev/stdout with --out"; each c3; case_end

c4() {
  "$1" train --preset tiny --steps 10 --stop-after 5 --log-every 0 --out run >/dev/null 2>&1
  head -c 300000 /dev/urandom > run/.checkpoint.safetensors.tmp-999999   # a save SIGKILLed mid-write
  run "duet train --resume run --out run  (run/ holds a killed save's .tmp-999999)" 60 \
    "$1" train --resume run --out run --log-every 0
  echo "    left in run/: $(ls -a run | grep tmp- || echo none)"
}
case_begin 4-stale-temporaries "stale temporaries of killed saves"; each c4; case_end

c5() {
  mkdir -p a b; corpus a/data.txt; python3 -c "print('other text entirely, ' * 300)" > b/data.txt
  printf '[train]\ndata = "data.txt"\nsteps = 6\nbatch = 2\nseq = 16\n' > a/run.toml
  run "(cd a && duet train --preset tiny --config run.toml --out ../r0)  (run.toml: data = \"data.txt\")" 60 \
    sh -c "cd a && '$1' train --preset tiny --config run.toml --stop-after 2 --log-every 0 --out ../r0"
  (cd a && "$1" train --preset tiny --vocab 256 --config run.toml --stop-after 2 --log-every 0 --out ../run >/dev/null 2>&1)
  echo "    with --vocab 256: the checkpoint's config has $(grep '^data' run/config.toml)"
  run "(cd b && duet train --resume ../run --out ../run)  (b/data.txt is another file)" 60 \
    sh -c "cd b && '$1' train --resume ../run --out ../run --log-every 0 --stop-after 2"
  grep -o '| data [^ ]*' err.txt | head -1 | sed 's/^/    trained on: /'
  corpus c.txt; "$1" train --preset tiny --steps 6 --stop-after 2 --log-every 0 --data "$PWD/c.txt" --out r2 >/dev/null 2>&1
  sed -i 's/fox/cat/' c.txt
  run "edit the data file (same size), then duet train --resume r2 --out r2" 60 "$1" train --resume r2 --out r2 --log-every 0
}
case_begin 5-data-paths "a config's relative data path; a data file changed before a resume"; each c5; case_end

c6() {
  "$1" train --preset tiny --steps 3 --log-every 0 --trace a.jsonl >/dev/null 2>&1
  python3 - <<'EOF'
import json
lines = [json.loads(l) for l in open("a.jsonl")]
for s in lines[1:]:
    s["params"] = {}
open("noparams.jsonl", "w").write("".join(json.dumps(l) + "\n" for l in lines))
EOF
  run "duet parity noparams.jsonl a.jsonl" 30 "$1" parity noparams.jsonl a.jsonl
  tail -n 1 out.txt | cut -c1-200 | sed 's/^/    stdout: /'
  run "duet parity a.jsonl noparams.jsonl" 30 "$1" parity a.jsonl noparams.jsonl
  tail -n 1 out.txt | cut -c1-200 | sed 's/^/    stdout: /'
}
case_begin 6-parity "duet parity compares both ways"; each c6; case_end

c7() {
  "$1" train --preset tiny --precision fp16 --steps 10 --stop-after 3 --log-every 0 --out run >/dev/null 2>&1
  python3 - <<'EOF'
import json, struct
b = open("run/checkpoint.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["__metadata__"]["loss_scale"] = "inf"
hb = json.dumps(h, separators=(",", ":")).encode()
open("run/checkpoint.safetensors", "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
EOF
  run "loss scale inf in the checkpoint: duet train --resume run --out run --log-every 1" 60 \
    "$1" train --resume run --out run --log-every 1
  grep -c "step skipped" err.txt | sed 's/^/    steps skipped: /'
}
case_begin 7-loaded-state "loaded state checked for sense"; each c7; case_end

c8() {
  run "ulimit -v 2000000; duet train --preset tiny --vocab 20000000 --steps 1  (initial weights 2.4 GiB)" 60 \
    sh -c "ulimit -v 2000000; exec '$1' train --preset tiny --vocab 20000000 --steps 1 --log-every 0"
  run "ulimit -v 1048576; duet train --preset tiny --vocab 2000000 --steps 1  (plan 1.9 GiB)" 60 \
    sh -c "ulimit -v 1048576; exec '$1' train --preset tiny --vocab 2000000 --steps 1 --log-every 0"
  run "ulimit -v 4194304; duet parity /dev/zero /dev/zero" 60 \
    sh -c "ulimit -v 4194304; exec '$1' parity /dev/zero /dev/zero"
  local cgroot; cgroot=/sys/fs/cgroup/memory$(grep -E '^[0-9]+:([^:]*,)?memory(,[^:]*)?:' /proc/self/cgroup | cut -d: -f3)
  if mkdir "$cgroot/duet-repro-$$" 2>/dev/null && echo $((400 << 20)) > "$cgroot/duet-repro-$$/memory.limit_in_bytes"; then
    run "in a memory cgroup limited to 400 MiB: duet train --preset tiny --vocab 2000000 --steps 1" 120 \
      sh -c "echo \$\$ > $cgroot/duet-repro-$$/cgroup.procs; exec '$1' train --preset tiny --vocab 2000000 --steps 1 --log-every 0"
    rmdir "$cgroot/duet-repro-$$" 2>/dev/null
  else
    echo "    SKIP the cgroup case: no writable v1 memory cgroup"
  fi
}
case_begin 8-memory-limits "memory checks honour rlimits and cgroups; trace lines bounded"; each c8; case_end

c9() {
  mkfifo fifo.txt
  run "duet train --preset tiny --steps 2 --data fifo.txt  (a FIFO nobody writes)" 10 \
    "$1" train --preset tiny --steps 2 --log-every 0 --data fifo.txt
}
case_begin 9-fifo "a FIFO as --data"; each c9; case_end

c10() {
  "$1" train --preset tiny --steps 2 --log-every 0 --out prev >/dev/null 2>&1
  local before; before=$(h prev/checkpoint.safetensors)
  run "duet train --preset tiny --steps 2 --metrics prev/checkpoint.safetensors" 60 \
    "$1" train --preset tiny --steps 2 --log-every 0 --metrics prev/checkpoint.safetensors
  echo "    prev/checkpoint.safetensors $before -> $(h prev/checkpoint.safetensors)"
}
case_begin 10-truncation "--metrics/--trace never truncate a file that is not duet's log"; each c10; case_end

c11() {
  "$1" train --preset tiny --steps 5 --log-every 0 --out r1 >/dev/null 2>&1
  "$1" train --preset tiny --steps 5 --log-every 0 --out r2 >/dev/null 2>&1
  echo "    two identical runs: $(h r1/checkpoint.safetensors) vs $(h r2/checkpoint.safetensors)"
}
case_begin 11-reproducible "byte-identical checkpoints"; each c11; case_end

c12() {
  "$1" train --preset tiny --steps 6 --stop-after 2 --log-every 0 --out run >/dev/null 2>&1
  run "duet train --resume run --out run --preset tiny" 60 "$1" train --resume run --out run --preset tiny --log-every 0
  run "duet generate --checkpoint run --tokens 1,2,3 --top-k 5" 60 "$1" generate --checkpoint run --tokens 1,2,3 --top-k 5 --max-new 4
  run "duet train --preset tiny --steps 3 --warmup 10" 60 "$1" train --preset tiny --steps 3 --warmup 10 --log-every 0
  grep -c "warmup" err.txt | sed 's/^/    warmup warnings: /'
}
case_begin 12-smaller "--resume with the same --preset, --top-k alone, warmup > steps"; each c12; case_end
echo "records in $OUT"
