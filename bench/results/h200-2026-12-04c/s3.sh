#!/bin/bash
# H200: BenchmarkStep decode64 (base 22b4d7d / head 3b6487d / join = JoinSeq slot scan), 6 rounds,
# each benchmark its own process; then the replica replay, head vs join, tier off/embedded.
cd "$(dirname "$0")"
: "${T:?}"
cat /proc/loadavg
for r in 1 2 3 4 5 6; do
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=50/buffer=on' 'row=4096/hit=50/buffer=off'; do
  for b in base head join; do
   ./step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.4s | grep '^Bench' | sed "s/^/$b /" >> $OUT/s3.txt
  done
 done
done
cat /proc/loadavg | tee -a $OUT/s3.txt
for r in 1 2; do
 for b in head join; do
  for t in off embedded; do
   ./omni-$b replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>&1 | grep "all 4" | sed "s/^/r$r $b /" | tee -a $OUT/rep.txt; echo "r$r $b $t" >> $OUT/rep.jsonl; head -1 /tmp/j.jsonl >> $OUT/rep.jsonl
  done
 done
done
cat /proc/loadavg | tee -a $OUT/rep.txt
