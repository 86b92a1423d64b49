#!/bin/bash
# H200: BenchmarkStep base / head / g3 (as in d3) / g4 (g3 with the spins, the claim's and WaitFor's,
# pausing between checks: PAUSE, internal/spin) / g5 (g4 without the claim's spin),
# each benchmark its own process, interleaved, up to 6 rounds
B=/tmp/x
T0=$(date +%s)
cat /proc/loadavg; nproc
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 250 ] && break
 for c in 'decode64/row=64/hit=0/buffer=on' 'decode64/row=64/hit=0/buffer=off' 'decode64/row=64/hit=50/buffer=on' 'decode64/row=64/hit=50/buffer=off' 'decode64/row=4096/hit=50/buffer=on'; do
  for b in base head g3 g4 g5; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/d4.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s" | tee -a $OUT/d4.txt
done
cat /proc/loadavg | tee -a $OUT/d4.txt
