#!/bin/bash
# H200 host: is the tier's cost to the engine goroutine something any busy neighbour costs it?
# omni-new (d59e8e1). Per round: off; off beside one bash busy loop (a core of pure CPU); off beside
# dd streaming /dev/zero through a 256 MiB buffer (a core of memory writes, far more bytes than the
# publishers move); embedded. Defaults otherwise (pacing spins).
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name tier
 c=$( { time $B/omni-new replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $2 --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $1 cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4; do
 [ $(( $(date +%s) - T0 )) -gt 230 ] && break
 rep off off
 ( while :; do :; done ) & P=$!; rep off-cpu off; kill $P; wait $P 2>/dev/null
 dd if=/dev/zero of=/dev/null bs=256M count=100000000 2>/dev/null & P=$!; rep off-mem off; kill $P; wait $P 2>/dev/null
 rep emb embedded
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
