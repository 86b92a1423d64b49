#!/bin/bash
# .gpu/oc-base (7da9f49) against .gpu/oc-new2 (publish batches, the embedded
# store's Set copying outside its lock): eng/step, and the scheduler's
# Lookup time (lookup_ns_total, outside the engine time).
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
nproc; cat /proc/loadavg
run() { local n=$1 b=$2; shift 2
  .gpu/oc-$b $A "$@" --json /tmp/$n.json >/tmp/$n.txt 2>&1
  echo "$n load=$(cut -d' ' -f1 /proc/loadavg) $(grep -o '"lookup_ns_total":[0-9]*' /tmp/$n.json | head -1) $(grep -o '"steps":[0-9]*' /tmp/$n.json | head -1) :: $(grep 'all 4' /tmp/$n.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/setlock-summary.txt; }
for r in 1 2 3 4; do
 if [ $((r%2)) = 0 ]; then o="base new2"; else o="new2 base"; fi
 for b in $o; do run $b-off-$r $b --tier off; run $b-emb-$r $b --tier embedded; done
done
cp /tmp/new2-emb-1.txt $OUT/
