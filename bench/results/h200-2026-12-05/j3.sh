#!/bin/bash
# H200 host (not run yet: no device was lent after j1): the head against 78c7ece, side by side.
# omni-old = 78c7ece, omni-new = a855be8 (or later), both `go build ./cmd/omnicache`. Each round: off
# (new), embedded old, embedded new. CPU time of the process (user sys real) per run.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; uname -r) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name binary tier
 local n=$1 b=$2 t=$3
 c=$( { time $B/$b replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7 8 9 10; do
 [ $(( $(date +%s) - T0 )) -gt 450 ] && break
 rep off omni-new off
 rep emb-old omni-old embedded
 rep emb-new omni-new embedded
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
