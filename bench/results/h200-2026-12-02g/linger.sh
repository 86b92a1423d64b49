#!/bin/bash
# switches3.patch (.gpu/oc-exp): X_LINGER (a gather's partial batch waits for
# the next gathers until PublishBatch blocks: far fewer publisher wakes),
# X_STREAM=MB/s (tier off beside a goroutine streaming memory at that rate).
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
nproc; cat /proc/loadavg
run() { local n=$1 env=$2; shift 2
  env $env .gpu/oc-exp $A "$@" >/tmp/$n.txt 2>&1
  echo "$n load=$(cut -d' ' -f1 /proc/loadavg) :: $(grep 'all 4' /tmp/$n.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/linger-summary.txt; }
for r in 1 2 3; do
 run off$r X=1 --tier off
 run emb$r X=1 --tier embedded
 run linger$r X_LINGER=1 --tier embedded
 run stream1500-$r X_STREAM=1500 --tier off
 run stream400-$r X_STREAM=400 --tier off
done
cp /tmp/linger1.txt $OUT/
