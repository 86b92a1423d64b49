#!/bin/bash
# H200 host: step3.sh with BINS="base new wait2" (wait2: this tree, the
# committer's commit of a host-only write takes no state lock and
# Queue.WaitFor spins up to 50 us before it sleeps; no committer spin),
# then hist.sh's per-step distribution for the same three, 2 rounds.
BINS="base new wait2" bash bench/results/h200-2026-12-04b/step3.sh
for r in 1 2; do for b in base new wait2; do
  HIST=1 /tmp/x/hist-$b.test -test.run TestStepHist -test.v | grep HIST | sed "s/^/$b r=$r /" >> $OUT/hist.txt
done; done
cat /proc/loadavg
