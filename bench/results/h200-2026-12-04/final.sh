#!/bin/bash
# H200 host, closing measurements. (1) BenchmarkStep decode64, every
# benchmark in a process of its own, 22b4d7d (step-base) and this tree
# (step-fix) interleaved, 6 rounds of 0.6 s. (2) The replica replay, tier off and
# embedded interleaved, 4 rounds (eng/step = the engine goroutine's
# Begin+Save+Discard per step).
cat /proc/loadavg
for round in 1 2 3 4 5 6; do
for bm in row=64/hit=0/buffer=off row=64/hit=0/buffer=on row=4096/hit=0/buffer=off row=4096/hit=0/buffer=on row=64/hit=50/buffer=off row=64/hit=50/buffer=on row=4096/hit=50/buffer=off row=4096/hit=50/buffer=on; do
for b in base fix; do
  ./.gpu/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$bm\$" -test.benchtime ${BT:-0.6s} | grep Benchmark | sed "s/^/$b /" >> $OUT/step.txt
done; done; done
cat /proc/loadavg
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
for r in 1 2 3 4; do
  if [ $((r%2)) = 0 ]; then o="off embedded"; else o="embedded off"; fi
  for t in $o; do
    ./.gpu/oc-new $A --tier $t --json /tmp/j.json > /tmp/out.txt 2>&1
    echo "oc $t round=$r load=$(cut -d' ' -f1 /proc/loadavg) $(grep 'all 4' /tmp/out.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/summary.txt
    (echo "{\"round\":$r,\"report\":"; cat /tmp/j.json; echo "}") | tr -d '\n' >> $OUT/runs.jsonl; echo >> $OUT/runs.jsonl
  done
done
cat /proc/loadavg
