#!/bin/bash
# Is the tier's engine-time gap the GC? off and embedded at the default
# GOGC and at GOGC=1000, with gctrace counted in round 1.
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
nproc; cat /proc/loadavg
run() { local n=$1 env=$2; shift 2
  env $env .gpu/oc-new $A "$@" >/tmp/$n.txt 2>/tmp/$n.err
  echo "$n load=$(cut -d' ' -f1 /proc/loadavg) gcs=$(grep -c '^gc ' /tmp/$n.err) :: $(grep 'all 4' /tmp/$n.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/gc-summary.txt; }
for r in 1 2 3; do
 run off$r GODEBUG=gctrace=1 --tier off
 run emb$r GODEBUG=gctrace=1 --tier embedded
 run offgc$r GOGC=1000 --tier off
 run embgc$r GOGC=1000 --tier embedded
done
tail -5 /tmp/off1.err > $OUT/gctrace-off1.txt; tail -5 /tmp/emb1.err > $OUT/gctrace-emb1.txt
