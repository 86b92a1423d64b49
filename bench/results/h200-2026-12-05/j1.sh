#!/bin/bash
# H200 host: full blocks riding on their write (eeb4169) against a gather task per Save (78c7ece).
# omni-dold = 78c7ece + ../h200-2026-12-04h/dh2.patch + dh3.patch + ../h200-2026-12-04i/di.patch;
# omni-dnew = eeb4169 + dj.patch (the same patches' bench/ part: DIAG_NOLOOKUP, DIAG_LOOKUPZERO).
# Each round: off (dnew); embedded old and new; old and new on the tier-off run's steps
# (DIAG_NOLOOKUP: published, never looked up). CPU time of the process (user sys real) per run.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; uname -r) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name binary tier env...
 local n=$1 b=$2 t=$3; shift 3
 c=$( { time env "$@" $B/$b replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7 8 9 10; do
 [ $(( $(date +%s) - T0 )) -gt 470 ] && break
 rep off omni-dnew off X=1
 rep emb-old omni-dold embedded X=1
 rep emb-new omni-dnew embedded X=1
 rep pub-old omni-dold embedded DIAG_NOLOOKUP=1
 rep pub-new omni-dnew embedded DIAG_NOLOOKUP=1
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
