#!/bin/bash
# Interleaved replica runs: .gpu/oc-base (7da9f49) against .gpu/oc-new
# (publish batches), --tier off and embedded, eng/step per run.
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
nproc; cat /proc/loadavg
for r in 1 2 3 4; do
 if [ $((r%2)) = 0 ]; then o="base new"; else o="new base"; fi
 for b in $o; do for t in off embedded; do
  .gpu/oc-$b $A --tier $t >/tmp/$b-$t-$r.txt 2>&1
  echo "$b $t round=$r load=$(cut -d' ' -f1 /proc/loadavg) :: $(grep 'all 4' /tmp/$b-$t-$r.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/batch-summary.txt
 done; done
done
cp /tmp/new-embedded-1.txt /tmp/base-embedded-1.txt $OUT/
