#!/bin/bash
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
nproc; cat /proc/loadavg
run() { # name, env, extra args
  local n=$1 env=$2; shift 2
  local t0=$(date +%s%N)
  env $env .gpu/omnicache-exp $A "$@" >/tmp/$n.txt 2>&1
  echo "$n load=$(cut -d' ' -f1 /proc/loadavg) wall=$(( ($(date +%s%N) - t0) / 1000000 ))ms :: $(grep 'all 4' /tmp/$n.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/summary.txt
}
for r in 1 2 3; do
 run off$r X=1 --tier off
 run emb$r X=1 --tier embedded
 run nogather$r X_NOGATHER=1 --tier embedded
 run noset$r X_NOSET=1 --tier embedded
 run offspin$r X_SPIN=1 --tier off
 run embspin$r X_SPIN=1 --tier embedded
done
cp /tmp/emb1.txt $OUT/emb1.txt; cp /tmp/nogather1.txt $OUT/nogather1.txt
