#!/bin/bash
# Where the engine goroutine waits outside the stall window in BenchmarkStep
# decode64 hit=0 buffer=off: block and mutex profiles (every event) of
# 22b4d7d (step-base) and 9f68b13 (step-new), row=64 and row=4096.
mkdir -p /tmp/x && tar xzf .gpu/pk2.tgz -C /tmp/x
cat /proc/loadavg
for b in base new; do for row in 64 4096; do
  /tmp/x/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/row=$row/hit=0/buffer=off" -test.benchtime 2s -test.count 1 \
    -test.blockprofile $OUT/block-$b-$row.out -test.blockprofilerate 1 -test.mutexprofile $OUT/mutex-$b-$row.out -test.mutexprofilefraction 1 | grep Benchmark | sed "s/^/$b /"
done; done
