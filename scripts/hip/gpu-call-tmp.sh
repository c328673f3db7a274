#!/usr/bin/env bash
# temporary: phase A and B in one call
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/a" "$OUT/b"
OUTB=$OUT
OUT=$OUTB/a bash scripts/hip-on-cuda.sh run A > $OUTB/phaseA.log 2>&1; echo "A rc=$?"
sed -n '/== summary/,$p' $OUTB/phaseA.log
OUT=$OUTB/b bash scripts/hip-on-cuda.sh run B > $OUTB/phaseB.log 2>&1; echo "B rc=$?"
sed -n '/== summary/,$p' $OUTB/phaseB.log
grep -h "ms/step\|step_ms" $OUTB/phaseB.log | head -20
cd $OUTB && tar czf all.tgz a b phaseA.log phaseB.log && rm -rf a b
