#!/bin/bash
# H200: BenchmarkStep base (22b4d7d) / head (600f6e7) / g1 (head + run copies in
# the mirror + a claim that spins for a page, yielding its P first when its
# kick woke the committer) / g2 (g1 + WaitFor yields its P after a kick that
# woke the committer), each benchmark its own process, interleaved, 6 rounds
# (stops starting rounds after 380 s); then the mirror's run copies (old/new).
B=/tmp/x
T0=$(date +%s)
cat /proc/loadavg; nproc
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 380 ] && break
 for c in 'decode64/row=64/hit=0/buffer=on' 'decode64/row=64/hit=0/buffer=off' 'decode64/row=64/hit=50/buffer=on' 'decode64/row=64/hit=50/buffer=off' 'decode64/row=4096/hit=50/buffer=on' 'decode64/row=4096/hit=50/buffer=off' 'prefill8192/row=64/hit=0/buffer=on' 'prefill8192/row=64/hit=50/buffer=on'; do
  for b in base head g1 g2; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/d2.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s" | tee -a $OUT/d2.txt
done
cat /proc/loadavg | tee -a $OUT/d2.txt
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 500 ] && break
 for b in old new; do
  $B/$b.test -test.run '^$' -test.bench 'ZZRows/rb=(64|4096)/' -test.benchtime 0.2s | grep '^Bench' | sed "s/^/$b /" >> $OUT/d2_rows.txt
 done
done
cat /proc/loadavg | tee -a $OUT/d2_rows.txt
