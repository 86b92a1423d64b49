#!/bin/bash
# H200 host: BenchmarkStep decode64, every case, base / cur / nopf / v1 / v2
# (v1: the claim spins with hit reads queued, and the committer spins for an
# engine-side read before it parks; v2: v1 + the committer spins 20 µs for
# work before its polling sleep; patches beside this script), each benchmark
# its own process, interleaved, 6 rounds; then traces of v1, v2 row=64 hit=50 on.
B=/tmp/x
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/step.txt
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 330 ] && break
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=4096/hit=0/buffer=on' 'row=4096/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=50/buffer=on' 'row=4096/hit=50/buffer=off'; do
  bins="base cur v1 v2"; case $c in *hit=50*) bins="base cur nopf v1 v2";; esac
  for b in $bins; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/step.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/step.txt
done
for b in v1 v2; do
 $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/row=64/hit=50/buffer=on\$" -test.benchtime 40000x -test.trace /tmp/tr_$b.out | grep '^Bench' | sed "s/^/trace $b /" >> $OUT/step.txt
done
tar czf $OUT/traces.tgz -C /tmp tr_v1.out tr_v2.out
cat /proc/loadavg | tee -a $OUT/step.txt
