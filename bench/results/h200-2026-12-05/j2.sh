#!/bin/bash
# H200 host (not run yet: no device was lent after j1): where the tier's cost on the engine goroutine
# lies with full blocks riding on their write and the allocation-free Lookup (a855be8).
# omni-dj = a855be8 + dj.patch. On the tier-off run's steps (DIAG_NOLOOKUP: the replica
# never asks the tier), from nothing to everything: idle (DIAG_NOPUB: the tier is there, no step names
# full blocks), nopush (blocks noted and checked, then dropped: nothing rides), rows0 (the committer
# runs the gathers, copying nothing), nostore (gathered, the publishers recycle them unstored), pub
# (gathered and stored); then the real embedded run. CPU time of the process (user sys real) per run.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; uname -r) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name tier env...
 local n=$1 t=$2; shift 2
 c=$( { time env "$@" $B/omni-dj replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7 8; do
 [ $(( $(date +%s) - T0 )) -gt 430 ] && break
 rep off off X=1
 rep idle embedded DIAG_NOLOOKUP=1 DIAG_NOPUB=1
 rep nopush embedded DIAG_NOLOOKUP=1 DIAG_NOPUSH=1
 rep rows0 embedded DIAG_NOLOOKUP=1 DIAG_NOROWS=1
 rep nostore embedded DIAG_NOLOOKUP=1 DIAG_NOSTORE=1
 rep pub embedded DIAG_NOLOOKUP=1
 rep emb embedded X=1
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
