#!/bin/bash
# perf record (10 kHz, frame-pointer call graphs) of oc-new off and
# embedded, and of BenchmarkStep decode64 hit=0 buffer=off (22b4d7d =
# step-base, this tree = step-new); the samples under Cache.Begin/Save/
# Discard folded to paths (perffold). Then BenchmarkStep decode64 hit=0
# buffer=off at 16 Ps and at GOMAXPROCS=2, three rounds.
mkdir -p /tmp/x && [ -f /tmp/x/perf ] || tar xzf .gpu/pk.tgz -C /tmp/x
P="env LD_LIBRARY_PATH=/tmp/x/lib /tmp/x/perf"
$P --version 2>&1 | head -2; cat /proc/sys/kernel/perf_event_paranoid
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
for t in off embedded; do
  $P record -F 10000 -g -o /tmp/p-$t.data /tmp/x/oc-new $A --tier $t > /tmp/out.txt 2>/tmp/perr.txt
  tail -2 /tmp/perr.txt
  echo "perf $t $(grep 'all 4' /tmp/out.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/summary.txt
  $P script -i /tmp/p-$t.data -F comm,tid,ip,sym 2>/dev/null | /tmp/x/perffold > /tmp/paths-$t.txt
  (echo "== replay $t"; cat /tmp/paths-$t.txt) >> $OUT/paths.txt
done
for b in base new; do for row in 64 4096; do
  $P record -F 10000 -g -o /tmp/s.data /tmp/x/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/row=$row/hit=0/buffer=off" -test.benchtime 2s -test.count 1 > /tmp/out.txt 2>/tmp/perr.txt
  echo "perf step $b $row $(grep Benchmark /tmp/out.txt)" | tee -a $OUT/summary.txt
  (echo "== step $b row=$row"; $P script -i /tmp/s.data -F comm,tid,ip,sym 2>/dev/null | /tmp/x/perffold) >> $OUT/paths.txt
done; done
for i in 1 2 3; do
  if [ $((i%2)) = 0 ]; then o="base new"; else o="new base"; fi
  for b in $o; do
    /tmp/x/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=/hit=0$/buffer=off' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark | sed "s/^/$b p16 /" >> $OUT/procs.txt
    GOMAXPROCS=2 /tmp/x/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=/hit=0$/buffer=off' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark | sed "s/^/$b p2 /" >> $OUT/procs.txt
  done
  echo "round $i load $(cut -d' ' -f1 /proc/loadavg)"
done
