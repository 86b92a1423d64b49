#!/bin/bash
# VM: BenchmarkStep prefill8192 base vs new, each benchmark its own process, interleaved, 6 rounds
cd /tmp
(cat /proc/loadavg; nproc) > /tmp/vmpf/out.txt
for r in 1 2 3 4 5 6; do
 for c in 'row=64/hit=50/buffer=on' 'row=64/hit=50/buffer=off' 'row=4096/hit=0/buffer=on' 'row=4096/hit=0/buffer=off' 'row=4096/hit=50/buffer=on' 'row=4096/hit=50/buffer=off'; do
  bt=0.3s; case $c in row=4096*) bt=20x;; esac
  for b in base new; do
   /tmp/ab/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=prefill8192/$c\$" -test.benchtime $bt | grep '^Bench' | sed "s/^/$b /" >> /tmp/vmpf/out.txt
  done
 done
 echo "round $r $(date +%T) $(cat /proc/loadavg)" >> /tmp/vmpf/out.txt
done
echo done >> /tmp/vmpf/out.txt
