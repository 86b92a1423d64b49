#!/bin/bash
nproc; cat /proc/loadavg
.gpu/gpu.test -test.count 1 -test.timeout 240s > $OUT/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu-tests.txt
for i in 1 2 3 4 5 6; do
  if [ $((i%2)) = 0 ]; then o="base new"; else o="new base"; fi
  for b in $o; do .gpu/$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark >> $OUT/step_$b.txt; done
  echo "round $i load $(cut -d' ' -f1 /proc/loadavg)"
done
cat /proc/loadavg
