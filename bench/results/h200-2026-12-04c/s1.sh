#!/bin/bash
# H200: base / new / nohuge, decode64 row=64, 6 rounds, each benchmark its own process.
cd "$(dirname "$0")"
cat /proc/loadavg; nproc
for r in 1 2 3 4 5 6; do
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off'; do
  for b in base new nohuge; do
   ./step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.5s | grep '^Bench' | sed "s/^/$b /" >> $OUT/s1.txt
  done
 done
done
cat /proc/loadavg
for b in base new nohuge; do
 ./step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=64/hit=0/buffer=on$' -test.benchtime 1000000x -test.cpuprofile $OUT/on16-$b.prof | grep '^Bench' >> $OUT/prof.txt
 taskset -c 2 env GOMAXPROCS=1 ./step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=64/hit=0/buffer=off$' -test.benchtime 1000000x -test.cpuprofile $OUT/off1-$b.prof | grep '^Bench' >> $OUT/prof.txt
done
cat /proc/loadavg
