#!/bin/bash
# H200 host: does the engine's vCPU share a physical core (or a cache) with another vCPU? The guest
# reports one thread per core; smt (smt/main.go.txt) times an L2-resident multiply-and-load loop on
# CPU a, alone and while CPU b copies 8 MiB buffers, for every pair. Then interleaved rounds with the
# engine goroutine on CPU 15 (DIAG_RU=1 DIAG_PIN=15, omni-dE as in i1) and the rest of the process
# (taskset) on every CPU but 15 and the CPU that slows it most ("far"), or on every CPU but 15 ("all").
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; uname -r; lscpu | grep -Ei 'model name|thread|core|socket|L[123]') | tee $OUT/log.txt
$B/smt > $OUT/smt.txt; cat $OUT/smt.txt
SIB=$(awk '/^a=15 /{m=0; s=-1; for(i=4;i<=NF;i++){split($i,p,":"); if(p[2]!="-" && p[2]+0>m){m=p[2]+0; s=p[1]}} print s}' $OUT/smt.txt)
FAR=$(seq 0 14 | grep -vx "$SIB" | paste -sd,)
echo "sibling of 15: $SIB; far set: $FAR" | tee -a $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name cpus tier
 local n=$1 cpus=$2 t=$3
 c=$( { time env DIAG_RU=1 DIAG_PIN=15 taskset -c $cpus $B/omni-dE replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/tmp/err >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(grep -o 'DGT thread[^D]*' /tmp/err | tr '\n' ' ') $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7 8; do
 [ $(( $(date +%s) - T0 )) -gt 330 ] && break
 rep off-far $FAR off
 rep emb-far $FAR embedded
 rep off-all 0-14 off
 rep emb-all 0-14 embedded
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
