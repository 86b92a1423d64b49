#!/bin/bash
# H200 host: BenchmarkStep decode64 hit=0, each of the four benchmarks in a
# process of its own (-count 1, 1s), binaries interleaved per round:
# 22b4d7d (step-base), and the trees under test (BINS).
cat /proc/loadavg
for round in $(seq 1 ${ROUNDS:-4}); do
for bm in row=64/hit=0/buffer=off row=64/hit=0/buffer=on row=4096/hit=0/buffer=off row=4096/hit=0/buffer=on; do
for b in ${BINS:-base new fix}; do
  ./.gpu/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$bm\$" -test.benchtime 1s | grep Benchmark | sed "s/^/$b /"
done; done; done
cat /proc/loadavg
