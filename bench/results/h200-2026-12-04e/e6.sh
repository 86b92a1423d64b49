#!/bin/bash
# H200 host: BenchmarkStep prefill8192 against 22b4d7d (step-base.test /
# step-new.test = 095fbde), each benchmark its own process, interleaved:
# row=64 at 0.3s, row=4096 at 20x (its warm-up writes every position twice);
# then the 4-replica replay: off, embedded (omni-new = 095fbde), embedded with
# the committer skipping blocks the embedded store already holds (omni-dd,
# e6_dd.patch, a diagnosis build), 3 rounds.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/step.txt
for r in 1 2 3; do
 for t in "off omni-new" "embedded omni-new" "embedded omni-dd"; do
  set -- $t
  $B/$2 replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $1 --json /tmp/j.jsonl >/dev/null 2>&1
  echo "r$r $1 $2 $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
 done
 echo "rep round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/step.txt
done
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 400 ] && break
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=0/buffer=on' 'row=4096/hit=0/buffer=off' 'row=4096/hit=50/buffer=on' 'row=4096/hit=50/buffer=off'; do
  bt=0.3s; case $c in row=4096*) bt=20x;; esac
  for b in base new; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=prefill8192/$c\$" -test.benchtime $bt | grep '^Bench' | sed "s/^/$b /" >> $OUT/step.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/step.txt
done
cat /proc/loadavg | tee -a $OUT/step.txt
