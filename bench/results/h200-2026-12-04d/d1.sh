#!/bin/bash
# H200: BenchmarkStep base (22b4d7d) / head (600f6e7) / cspin (head + run copies
# in the mirror + a claim that spins for a page) / both (cspin + the committer's
# pop spin of s6_spin2_untested.patch), each benchmark its own process,
# interleaved, 6 rounds; then the mirror's run copies (old / new), 6 rounds.
B=/tmp/x
cat /proc/loadavg; nproc
for r in 1 2 3 4 5 6; do
 for c in 'decode64/row=64/hit=0/buffer=on' 'decode64/row=64/hit=0/buffer=off' 'decode64/row=64/hit=50/buffer=on' 'decode64/row=64/hit=50/buffer=off' 'decode64/row=4096/hit=50/buffer=on' 'decode64/row=4096/hit=50/buffer=off' 'prefill8192/row=4096/hit=0/buffer=on' 'prefill8192/row=4096/hit=50/buffer=on'; do
  for b in base head cspin both; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/d1.txt
  done
 done
done
cat /proc/loadavg | tee -a $OUT/d1.txt
for r in 1 2 3 4 5 6; do
 for b in old new; do
  $B/$b.test -test.run '^$' -test.bench 'ZZRows/rb=(64|4096)/' -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/d1_rows.txt
 done
done
cat /proc/loadavg | tee -a $OUT/d1_rows.txt
