#!/bin/bash
# H200 host: BenchmarkStep decode64 hit=0, 22b4d7d (step-base), this tree
# before (step-new) and after (step-fix) a change under test. perf cpu-clock
# of row=64 buffer=off (300000 steps each): paths under the engine's calls
# and the leaf addresses (go tool addr2line, +0x400000); then 4 interleaved
# rounds of the four decode64 hit=0 benchmarks.
mkdir -p /tmp/x && tar xzf .gpu/px.tgz -C /tmp/x
P="/tmp/x/px/lib/ld-linux-x86-64.so.2 --library-path /tmp/x/px/lib /tmp/x/px/perf"
F=/tmp/x/px/perffold
R='omnicache_test.(*stepEngine).step,omnicache_test.benchStep.func1'
cat /proc/loadavg
for b in ${BINS:-base new fix}; do
  $P record -e cpu-clock -c 20000 -g -o /tmp/s.data ./.gpu/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=64/hit=0/buffer=off$' -test.benchtime 300000x > /tmp/out.txt 2>/tmp/perr.txt
  echo "perf $b $(grep Benchmark /tmp/out.txt)"
  $P script -i /tmp/s.data -F comm,tid,ip,sym 2>/dev/null > /tmp/s.txt
  (echo "== $b"; $F -roots "$R" -depth 2 < /tmp/s.txt | head -60; $F -depth 8 < /tmp/s.txt | head -500) > $OUT/paths-$b.txt
  $F -roots "$R" -leafip < /tmp/s.txt | head -800 > $OUT/leaf-$b.txt
done
for round in 1 2 3 4; do for b in ${BINS:-base new fix}; do
  ./.gpu/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/.*/hit=0/' -test.benchtime 1s | grep Benchmark | sed "s/^/$b /"
done; done
cat /proc/loadavg
