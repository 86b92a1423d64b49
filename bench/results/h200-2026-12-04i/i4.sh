#!/bin/bash
# H200 host: is the engine's slowdown with the tier the tier's, or any CPU load on the host? Tier-off
# runs beside burn (burn.go.txt: N threads of a multiply chain, or of L2-resident 256 KiB copies, in
# another process, for the whole run) against embedded, omni-thp as in i3.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name tier [burn args]
 local n=$1 t=$2; shift 2
 [ $# -gt 0 ] && { $B/burn -d 30s "$@" & BP=$!; }
 c=$( { time $B/omni-thp replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 [ $# -gt 0 ] && { kill $BP; wait $BP 2>/dev/null; }
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7; do
 [ $(( $(date +%s) - T0 )) -gt 230 ] && break
 rep off off
 rep off+alu1 off -n 1 -mode alu
 rep off+alu2 off -n 2 -mode alu
 rep off+copy1 off -n 1 -mode copy
 rep emb embedded
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
