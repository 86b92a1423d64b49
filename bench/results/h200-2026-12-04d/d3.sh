#!/bin/bash
# H200: BenchmarkStep base (22b4d7d) / head (600f6e7) / g1 (as in d2) / g3 (head
# + run copies + a claim that spins for a page only when its kick found the
# committer awake; woken, it parks at once), each benchmark its own process,
# interleaved, up to 6 rounds (no round starts after 250 s).
B=/tmp/x
T0=$(date +%s)
cat /proc/loadavg; nproc
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 250 ] && break
 for c in 'decode64/row=64/hit=0/buffer=on' 'decode64/row=64/hit=0/buffer=off' 'decode64/row=64/hit=50/buffer=on' 'decode64/row=64/hit=50/buffer=off' 'decode64/row=4096/hit=50/buffer=on'; do
  for b in base head g1 g3; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/d3.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s" | tee -a $OUT/d3.txt
done
cat /proc/loadavg | tee -a $OUT/d3.txt
