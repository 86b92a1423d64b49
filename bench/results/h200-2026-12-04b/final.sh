#!/bin/bash
# H200 host, closing run: calls.sh (each call timed apart) and step3.sh
# (BenchmarkStep decode64, 6 interleaved rounds) for 22b4d7d (base),
# ddf0fac (new) and this tree (wait3: no state lock in writeStep, writes
# recycled in batches, a host-only commit without the state lock,
# Queue.WaitFor's spin).
mkdir -p /tmp/x && tar xzf .gpu/pk.tgz -C /tmp/x
cat /proc/loadavg
for r in 1 2 3; do for b in base new wait3; do
  HIST=1 /tmp/x/hist-$b.test -test.run TestStepHist -test.v | grep -E "HIST|CALLS" | sed "s/^/$b r=$r /" >> $OUT/calls.txt
done; done
BINS="base new wait3" bash bench/results/h200-2026-12-04b/step3.sh
