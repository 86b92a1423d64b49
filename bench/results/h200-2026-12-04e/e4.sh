#!/bin/bash
# H200 host: BenchmarkStep decode64, every case: base / cur / nopf (hit=50
# only) / v3 (e4_v3.patch: v2, and a prefetched read is taken on the
# consumer's goroutine only while the committer sleeps), each benchmark its
# own process, interleaved, 6 rounds; traces of cur and v3 row=4096 hit=50 on.
B=/tmp/x
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/step.txt
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 300 ] && break
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=4096/hit=0/buffer=on' 'row=4096/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=50/buffer=on' 'row=4096/hit=50/buffer=off'; do
  bins="base cur v3"; case $c in *hit=50*) bins="base cur nopf v3";; esac
  for b in $bins; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/step.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/step.txt
done
for b in cur v3; do
 $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/row=4096/hit=50/buffer=on\$" -test.benchtime 20000x -test.trace /tmp/tr4_$b.out | grep '^Bench' | sed "s/^/trace $b /" >> $OUT/step.txt
done
tar czf $OUT/traces.tgz -C /tmp tr4_cur.out tr4_v3.out
cat /proc/loadavg | tee -a $OUT/step.txt
