#!/bin/bash
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
nproc; cat /proc/loadavg
run() { # name, binary, extra args
  local n=$1 b=$2; shift 2
  .gpu/$b $A "$@" >/tmp/$n.txt 2>&1
  echo "$n load=$(cut -d' ' -f1 /proc/loadavg) :: $(grep 'all 4' /tmp/$n.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/pad-summary.txt
}
for r in 1 2 3 4; do
 run old-off$r omnicache-exp --tier off
 run old-emb$r omnicache-exp --tier embedded
 run new-off$r omnicache-new --tier off
 run new-emb$r omnicache-new --tier embedded
done
cp /tmp/new-emb1.txt $OUT/new-emb1.txt
