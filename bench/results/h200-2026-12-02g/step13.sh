#!/bin/bash
# BenchmarkStep decode64 hit=0, 22b4d7d (.gpu/base.test) against HEAD
# (.gpu/new.test), 6 alternating rounds; then a CPU profile of each on
# row=4096 buffer=off.
nproc; cat /proc/loadavg
for i in 1 2 3 4 5 6; do
  if [ $((i%2)) = 0 ]; then o="base new"; else o="new base"; fi
  for b in $o; do .gpu/$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=/hit=0$/' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark >> $OUT/step_$b.txt; done
  echo "round $i load $(cut -d' ' -f1 /proc/loadavg)"
done
for b in base new; do
  .gpu/$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=4096/hit=0$/buffer=off' -test.benchtime 3s -test.cpuprofile $OUT/$b-4096off.prof 2>&1 | grep Benchmark | tee -a $OUT/prof-runs.txt
done
cat /proc/loadavg
