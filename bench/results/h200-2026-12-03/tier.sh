#!/bin/bash
# Issue 16: engine time per step with the tier, H200 host. oc-base =
# 83fb7e2, oc-new = this session's tree (hit plans keep block ids, the
# publish gather takes the engine's lists), oc-x = oc-new + throw-away
# thread-CPU readings around the timed calls (X_CPU). Three interleaved
# rounds of off/embedded for base and new (JSON lines), then oc-x twice.
mkdir -p /tmp/x && tar xzf .gpu/pk.tgz -C /tmp/x
nproc; cat /proc/loadavg
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
for r in 1 2 3; do
  if [ $((r%2)) = 0 ]; then o="oc-base oc-new"; else o="oc-new oc-base"; fi
  for b in $o; do for t in off embedded; do
    /tmp/x/$b $A --tier $t --json /tmp/j.json > /tmp/out.txt 2>&1
    echo "$b $t round=$r load=$(cut -d' ' -f1 /proc/loadavg) $(grep 'all 4' /tmp/out.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/summary.txt
    (echo "{\"bin\":\"$b\",\"round\":$r,\"report\":"; cat /tmp/j.json; echo "}") | tr -d '\n' >> $OUT/runs.jsonl; echo >> $OUT/runs.jsonl
  done; done
done
for r in 1 2; do for t in off embedded; do
  X_CPU=1 /tmp/x/oc-x $A --tier $t --json /tmp/j.json > /tmp/out.txt 2>&1
  echo "oc-x $t round=$r load=$(cut -d' ' -f1 /proc/loadavg) $(grep 'all 4' /tmp/out.txt | awk '{print $5, $(NF-2), $(NF-1)}') $(grep X_CPU /tmp/out.txt) steps=$(grep -o '"steps":[0-9]*' /tmp/j.json | head -1)" | tee -a $OUT/summary.txt
done; done
