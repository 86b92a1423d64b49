#!/bin/bash
# H200 host: BenchmarkStep decode64 (all 8), each benchmark in a process of
# its own, interleaved, 6 rounds of 0.5 s, binaries named by BINS: base
# (22b4d7d), new (ddf0fac), spin (the committer spins 20 us before it
# polls; its commit of a host-only write takes no state lock), spin2 (spin,
# and Queue.WaitFor spins up to 50 us before it sleeps).
mkdir -p /tmp/x && tar xzf .gpu/pk.tgz -C /tmp/x
cat /proc/loadavg
for round in 1 2 3 4 5 6; do
for bm in row=64/hit=0/buffer=off row=64/hit=0/buffer=on row=4096/hit=0/buffer=off row=4096/hit=0/buffer=on row=64/hit=50/buffer=off row=64/hit=50/buffer=on row=4096/hit=50/buffer=off row=4096/hit=50/buffer=on; do
for b in ${BINS:-base new spin}; do
  /tmp/x/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$bm\$" -test.benchtime ${BT:-0.5s} | grep Benchmark | sed "s/^/$b /" >> $OUT/step.txt
done; done; done
cat /proc/loadavg
