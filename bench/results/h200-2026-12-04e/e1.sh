#!/bin/bash
# H200 host, session 2026-12-04 (fifth). Binaries built on the VM (see README):
#   step-base.test  22b4d7d           step-cur.test  HEAD (0d0fdfe)
#   step-nopf.test  HEAD with DisablePrefetch in newStepEngine (diagnosis only)
#   omni            HEAD's cmd/omnicache
# BenchmarkStep decode64, each benchmark its own process, interleaved, 6 rounds
# (hit=0 cases: base, cur; hit=50: base, cur, nopf). Then the 4-replica replay,
# tier off / embedded alternating, 6 rounds, per-call totals from --json.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/step.txt
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 200 ] && break
 for c in 'row=64/hit=0/buffer=on' 'row=64/hit=0/buffer=off' 'row=4096/hit=0/buffer=on' 'row=4096/hit=0/buffer=off' 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=50/buffer=on' 'row=4096/hit=50/buffer=off'; do
  bins="base cur"; case $c in *hit=50*) bins="base cur nopf";; esac
  for b in $bins; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/step.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/step.txt
done
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 420 ] && break
 for t in off embedded; do
  $B/omni replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl >/dev/null 2>&1
  echo "r$r $t $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
 done
 echo "rep round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/step.txt
done
cat /proc/loadavg | tee -a $OUT/step.txt
