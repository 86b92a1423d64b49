#!/bin/bash
# H200 host: CPU profiles (pprof) of BenchmarkStep decode64 row=64, 1M steps,
# 22b4d7d (base) against this tree (new): on one core (taskset -c 2,
# GOMAXPROCS=1: sec/op is then all the CPU a step takes, engine and
# committer) and on all 16.
cat /proc/loadavg
for r in 1 2; do for b in base new; do
  taskset -c 2 env GOMAXPROCS=1 ./.gpu/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=64/hit=0/buffer=off$' -test.benchtime 1000000x -test.cpuprofile $OUT/c1-$b-$r.prof | grep Bench | sed "s/^/$b c1 /" | tee -a $OUT/prof.txt
done; done
for b in base new; do
  ./.gpu/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=64/hit=0/buffer=off$' -test.benchtime 1000000x -test.cpuprofile $OUT/c16-$b.prof | grep Bench | sed "s/^/$b c16 /" | tee -a $OUT/prof.txt
  ./.gpu/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=64/hit=50/buffer=off$' -test.benchtime 500000x -test.cpuprofile $OUT/h16-$b.prof | grep Bench | sed "s/^/$b h16 /" | tee -a $OUT/prof.txt
done
cat /proc/loadavg
