#!/bin/bash
# H200 host. (1) The per-step engine time of decode64 row=64 hit=0 (stall
# left out) as a distribution, split into steps that stalled, steps right
# after one, and the others: a throw-away test (zz_hist_test.go, not kept)
# built into 22b4d7d (hist-base), ddf0fac (hist-new) and this tree
# (hist-spin2), 3 interleaved rounds. (2) The replica replay, tier off and
# embedded, this tree, 3 rounds.
mkdir -p /tmp/x && tar xzf .gpu/pk.tgz -C /tmp/x
cat /proc/loadavg
for r in 1 2 3; do for b in base new spin2; do
  HIST=1 /tmp/x/hist-$b.test -test.run TestStepHist -test.v | grep HIST | sed "s/^/$b r=$r /" | tee -a $OUT/hist.txt
done; done
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
for r in 1 2 3; do
  if [ $((r%2)) = 0 ]; then o="off embedded"; else o="embedded off"; fi
  for t in $o; do
    /tmp/x/oc-spin2 $A --tier $t --json /tmp/j.json > /tmp/out.txt 2>&1
    echo "oc $t round=$r load=$(cut -d' ' -f1 /proc/loadavg) $(grep 'all 4' /tmp/out.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/tier.txt
    (echo "{\"round\":$r,\"report\":"; cat /tmp/j.json; echo "}") | tr -d '\n' >> $OUT/tier.jsonl; echo >> $OUT/tier.jsonl
    [ $r = 1 ] && cp /tmp/out.txt $OUT/tier-$t-$r.out
  done
done
cat /proc/loadavg
