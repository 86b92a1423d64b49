#!/bin/bash
# H200: base 22b4d7d / join (ebc2627) / spin (join + a consumer out of work spins 5 us before it polls, with >= 4 Ps), 6 rounds.
cd "$(dirname "$0")"
cat /proc/loadavg
for r in 1 2 3 4 5 6; do
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=50/buffer=on' 'row=4096/hit=50/buffer=off'; do
  for b in base join spin; do
   ./step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.4s | grep '^Bench' | sed "s/^/$b /" >> $OUT/s5.txt
  done
 done
done
cat /proc/loadavg | tee -a $OUT/s5.txt
