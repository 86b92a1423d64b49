#!/bin/bash
# H200 host: does a neighbour that copies through the cache (temporal stores, as the tier's block
# copies are) slow tier-off's engine like the tier does, and one that copies with non-temporal stores
# (Go's memmove from 1 MiB up) not? hog (hog/main.go.txt) copies chunks across a 1 GiB arena at a paced
# rate; omni-new = 93dc180.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name tier [hog flags...]
 local n=$1 t=$2; shift 2
 local hp=
 if [ $# -gt 0 ]; then $B/hog -arena $((1<<30)) "$@" & hp=$!; sleep 2.5; fi
 c=$( { time $B/omni-new replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 [ -n "$hp" ] && kill $hp && wait $hp 2>/dev/null
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5; do
 [ $(( $(date +%s) - T0 )) -gt 260 ] && break
 rep off off
 rep off-hog64k-2g off -chunk 65536 -rate 2e9
 rep off-hog64k-8g off -chunk 65536 -rate 8e9
 rep off-hog4m-8g off -chunk 4194304 -rate 8e9
 rep emb embedded
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
