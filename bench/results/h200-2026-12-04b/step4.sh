#!/bin/bash
# H200 host: step3.sh with BINS="base new spin3 wait" (spin3: the spins
# without runtime.Gosched and their atomics on lines of their own; wait:
# spin3 without the committer's spin, WaitFor's kept), then hist.sh's
# per-step distribution for the same four, 2 rounds.
BINS="base new spin3 wait" bash bench/results/h200-2026-12-04b/step3.sh
for r in 1 2; do for b in base new spin3 wait; do
  HIST=1 /tmp/x/hist-$b.test -test.run TestStepHist -test.v | grep HIST | sed "s/^/$b r=$r /" >> $OUT/hist.txt
done; done
cat /proc/loadavg
