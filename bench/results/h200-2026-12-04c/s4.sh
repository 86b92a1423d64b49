#!/bin/bash
# H200: base 22b4d7d / join (this tree) / eager (join + a write handed over with no page free wakes the committer), 6 rounds.
cd "$(dirname "$0")"
cat /proc/loadavg
for r in 1 2 3 4 5 6; do
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off'; do
  for b in base join eager; do
   ./step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.4s | grep '^Bench' | sed "s/^/$b /" >> $OUT/s4.txt
  done
 done
done
cat /proc/loadavg | tee -a $OUT/s4.txt
