#!/bin/bash
# H200 host: which background work carries the publishing's cost on the tier-off run's steps
# (DIAG_NOLOOKUP)? omni-dF = the working tree of i3's omni-thp + dh2.patch + dh3.patch + di.patch
# (DIAG_LOOKUPZERO, and DIAG_NOSTORE: the publishers take the gathered batches and recycle them
# unstored). Each round: off; pub (gathered and stored); nostore (gathered, not stored); rows0
# (gathers queued, nothing copied).
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name tier env...
 local n=$1 t=$2; shift 2
 c=$( { time env "$@" $B/omni-dF replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 140 ] && break
 rep off off X=1
 rep pub embedded DIAG_NOLOOKUP=1
 rep nostore embedded DIAG_NOLOOKUP=1 DIAG_NOSTORE=1
 rep rows0 embedded DIAG_NOLOOKUP=1 DIAG_NOROWS=1
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
