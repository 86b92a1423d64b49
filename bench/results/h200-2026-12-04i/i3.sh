#!/bin/bash
# H200 host: the embedded store's slabs as 2 MiB frames of huge-page regions (omni-thp, the working
# tree after 6e6dbb8) against main 6e6dbb8 (omni-new: 1 MiB chunks, one 4 KiB-page mapping each).
# Each round: thp off, new embedded, thp embedded. CPU time of the process (user sys real) per run.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; uname -r; cat /sys/kernel/mm/transparent_hugepage/enabled) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name binary tier
 local n=$1 b=$2 t=$3
 c=$( { time $B/$b replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(grep -E 'thp_fault_alloc|pgfault ' /proc/vmstat | tr '\n' ' ') $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7 8 9; do
 [ $(( $(date +%s) - T0 )) -gt 280 ] && break
 rep off omni-thp off
 rep emb-old omni-new embedded
 rep emb-thp omni-thp embedded
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
