#!/bin/bash
# Go execution traces of BenchmarkStep decode64 hit=0 on the H200 host,
# 22b4d7d (step-base) against this tree (step-new), 20000 steps each, and
# engine-ns/op in 3 interleaved rounds. Binaries: .gpu/step-{base,new}.test
# (go test -c of the root package at each commit).
cat /proc/loadavg; nproc
mkdir -p $OUT/tr
for b in base new; do for row in 64 4096; do for buf in off on; do
  ./.gpu/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/row=$row/hit=0/buffer=$buf\$" -test.benchtime 20000x \
    -test.trace $OUT/tr/$b-$row-$buf.trace | grep Benchmark | sed "s/^/trace $b /"
done; done; done
for round in 1 2 3; do for b in base new; do
  ./.gpu/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/.*/hit=0/' -test.benchtime 1s | grep Benchmark | sed "s/^/$b /"
done; done
cat /proc/loadavg
tar czf $OUT/traces.tgz -C $OUT tr && rm -rf $OUT/tr
