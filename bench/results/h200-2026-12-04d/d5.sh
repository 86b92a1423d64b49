#!/bin/bash
# H200: BenchmarkStep base (22b4d7d) / head (600f6e7) / g5 (as in d4: run copies,
# WaitFor's spin pausing) / g6 (g5 + the claim's spin, only when the kick did not
# wake the committer and no hit read is queued), each benchmark its own process,
# interleaved, up to 6 rounds (no round starts after 170 s).
B=/tmp/x
T0=$(date +%s)
cat /proc/loadavg; nproc
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 170 ] && break
 for c in 'decode64/row=64/hit=0/buffer=on' 'decode64/row=64/hit=0/buffer=off' 'decode64/row=64/hit=50/buffer=on' 'decode64/row=64/hit=50/buffer=off' 'decode64/row=4096/hit=50/buffer=on' 'decode64/row=4096/hit=50/buffer=off'; do
  for b in base head g5 g6; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/d5.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s" | tee -a $OUT/d5.txt
done
cat /proc/loadavg | tee -a $OUT/d5.txt
