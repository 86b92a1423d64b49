#!/bin/bash
# H200 host: which copy of publishing costs the engine goroutine, on the steps of the run without tier.
# omni-dg2 = d59e8e1 + dg2.patch (diagnosis switches). All embedded runs with DIAG_NOLOAD=1 (everything
# published, nothing loaded: no tier hit). Variants: off; nl; nl + DIAG_NOSETCOPY (the embedded store
# keeps keys, not value bytes); nl + DIAG_NOGATHERCOPY (the committer's gather reads no rows);
# nl + DIAG_NOSEAL (no checksum). Pacing spins (the new default).
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name tier env...
 local n=$1 t=$2; shift 2
 c=$( { time env "$@" $B/omni-dg2 replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5; do
 [ $(( $(date +%s) - T0 )) -gt 300 ] && break
 rep off off X=1
 rep nl embedded DIAG_NOLOAD=1
 rep nl-noset embedded DIAG_NOLOAD=1 DIAG_NOSETCOPY=1
 rep nl-nogcopy embedded DIAG_NOLOAD=1 DIAG_NOGATHERCOPY=1
 rep nl-noseal embedded DIAG_NOLOAD=1 DIAG_NOSEAL=1
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
