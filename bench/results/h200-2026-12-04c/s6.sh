#!/bin/bash
# H200: base / join / spin2 (spin on a counter on its own line, not the lock's), 5 rounds, 4 cases.
cd "$(dirname "$0")"
cat /proc/loadavg
for r in 1 2 3 4 5; do
 for c in 'row=64/hit=0/buffer=off' 'row=64/hit=0/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=50/buffer=on'; do
  for b in base join spin2; do
   ./step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/s6.txt
  done
 done
done
cat /proc/loadavg | tee -a $OUT/s6.txt
