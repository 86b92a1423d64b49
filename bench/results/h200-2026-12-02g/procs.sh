#!/bin/bash
# BenchmarkStep decode64 hit=0 buffer=off: 22b4d7d (.gpu/base.test) and
# 83fb7e2 (.gpu/new.test), each at the host's 16 Ps and at GOMAXPROCS=2
# (which also leaves one copy goroutine: no split copies); 4 rounds.
nproc; cat /proc/loadavg
for i in 1 2 3 4; do
  if [ $((i%2)) = 0 ]; then o="base new"; else o="new base"; fi
  for b in $o; do
    .gpu/$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=/hit=0$/buffer=off' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark >> $OUT/p16_$b.txt
    GOMAXPROCS=2 .gpu/$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=/hit=0$/buffer=off' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark | sed 's/-2 / /' >> $OUT/p2_$b.txt
  done
  echo "round $i load $(cut -d' ' -f1 /proc/loadavg)"
done
