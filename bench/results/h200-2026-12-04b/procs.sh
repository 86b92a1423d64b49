#!/bin/bash
# H200 host: BenchmarkStep decode64, 22b4d7d (step-base) against this tree
# (step-new), each benchmark in a process of its own, interleaved, at
# three CPU shapes: all 16 cores (GOMAXPROCS default), 2 cores
# (taskset -c 2,3, GOMAXPROCS=2) and 1 core (taskset -c 2, GOMAXPROCS=1).
# perf-free: software counters from /proc (steal time, the process's
# context switches) beside each run.
cat /proc/loadavg; nproc; grep -m1 'model name' /proc/cpuinfo
steal() { awk '/^cpu /{print $9}' /proc/stat; }
for round in 1 2 3 4; do
for bm in row=64/hit=0/buffer=off row=4096/hit=0/buffer=on row=64/hit=50/buffer=off; do
for shape in 16 2 1; do
for b in base new; do
  case $shape in
    16) pre="" ;;
    2) pre="taskset -c 2,3 env GOMAXPROCS=2" ;;
    1) pre="taskset -c 2 env GOMAXPROCS=1" ;;
  esac
  s0=$(steal)
  $pre ./.gpu/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$bm\$" -test.benchtime ${BT:-0.5s} | grep Benchmark | sed "s/^/$b shape=$shape /; s/-[0-9]* / /" >> $OUT/procs.txt
  echo "$b $shape $bm steal_ticks=$(( $(steal) - s0 ))" >> $OUT/steal.txt
done; done; done; done
cat /proc/loadavg
