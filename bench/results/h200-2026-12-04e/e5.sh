#!/bin/bash
# H200 host: the change as committed (step-new.test, omni-new) against
# 22b4d7d (step-base.test): BenchmarkStep decode64, every case, each
# benchmark its own process, interleaved, 6 rounds; then the 4-replica
# replay (omni-new), tier off / embedded alternating, 4 rounds.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/step.txt
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 200 ] && break
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=4096/hit=0/buffer=on' 'row=4096/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=50/buffer=on' 'row=4096/hit=50/buffer=off'; do
  for b in base new; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/step.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/step.txt
done
for r in 1 2 3 4; do
 [ $(( $(date +%s) - T0 )) -gt 330 ] && break
 for t in off embedded; do
  $B/omni-new replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl >/dev/null 2>&1
  echo "r$r $t $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
 done
 echo "rep round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/step.txt
done
cat /proc/loadavg | tee -a $OUT/step.txt
