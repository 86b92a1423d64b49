#!/bin/bash
# H200 host: hist.sh's throw-away test with each call timed apart (Begin,
# Save, Discard; steps without a stall), 22b4d7d (base), ddf0fac (new),
# this tree (wait2), 3 interleaved rounds.
mkdir -p /tmp/x && tar xzf .gpu/pk.tgz -C /tmp/x
cat /proc/loadavg
for r in 1 2 3; do for b in base new wait2; do
  HIST=1 /tmp/x/hist-$b.test -test.run TestStepHist -test.v | grep -E "HIST|CALLS" | sed "s/^/$b r=$r /" >> $OUT/calls.txt
done; done
cat /proc/loadavg
