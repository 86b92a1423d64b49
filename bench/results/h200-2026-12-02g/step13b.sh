#!/bin/bash
# BenchmarkStep decode64 hit=0: 22b4d7d (.gpu/base.test), bd81683
# (.gpu/head.test) and bd81683 + split copies that wait for their parts,
# not for their workers (.gpu/new.test); 6 rounds, order alternating.
nproc; cat /proc/loadavg
for i in 1 2 3 4 5 6; do
  if [ $((i%2)) = 0 ]; then o="base head new"; else o="new head base"; fi
  for b in $o; do .gpu/$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=/hit=0$/' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark >> $OUT/step_$b.txt; done
  echo "round $i load $(cut -d' ' -f1 /proc/loadavg)"
done
cat /proc/loadavg
