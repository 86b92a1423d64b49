#!/bin/bash
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
cat /proc/loadavg
run() { local n=$1 env=$2; shift 2
  env $env .gpu/omnicache-exp2 $A "$@" >/tmp/$n.txt 2>&1
  echo "$n load=$(cut -d' ' -f1 /proc/loadavg) :: $(grep 'all 4' /tmp/$n.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/send-summary.txt; }
for r in 1 2 3; do
 run off$r X=1 --tier off
 run emb$r X=1 --tier embedded
 run nosend$r X_NOSEND=1 --tier embedded
 run nogather$r X_NOGATHER=1 --tier embedded
done
