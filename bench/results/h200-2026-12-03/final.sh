#!/bin/bash
# One call (device time is short): (1) perf record (10 kHz, frame-pointer
# call graphs) of oc-new's replica runs, off and embedded, and of
# BenchmarkStep decode64 hit=0 buffer=off row=64/4096 for 22b4d7d
# (step-base) and this tree (step-new); the samples under Cache.Begin/
# Save/Discard folded to paths (perffold) into paths.txt. (2) BenchmarkStep
# decode64 hit=0, both buffers, 4 interleaved rounds: step-base, step-new,
# step-nosplit (this tree with DefaultSplitBytes 1 MiB: a 256 KiB decode
# step stays on the committer). (3) Two more rounds of the replica runs,
# oc-base (83fb7e2) and oc-new, off and embedded.
mkdir -p /tmp/x && [ -f /tmp/x/perf ] || tar xzf .gpu/pk.tgz -C /tmp/x
P="env LD_LIBRARY_PATH=/tmp/x/lib /tmp/x/perf"
$P --version 2>&1 | head -1; cat /proc/sys/kernel/perf_event_paranoid; nproc; cat /proc/loadavg
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
for t in off embedded; do
  $P record -F 10000 -g -o /tmp/p-$t.data /tmp/x/oc-new $A --tier $t > /tmp/out.txt 2>/tmp/perr.txt
  tail -1 /tmp/perr.txt
  echo "perf replay $t $(grep 'all 4' /tmp/out.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/summary.txt
  (echo "== replay $t"; $P script -i /tmp/p-$t.data -F comm,tid,ip,sym 2>/dev/null | /tmp/x/perffold | head -400) >> $OUT/paths.txt
  rm -f /tmp/p-$t.data
done
for b in base new; do for row in 64 4096; do
  $P record -F 10000 -g -o /tmp/s.data /tmp/x/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/row=$row/hit=0/buffer=off" -test.benchtime 2s -test.count 1 > /tmp/out.txt 2>/tmp/perr.txt
  echo "perf step $b $(grep Benchmark /tmp/out.txt)" | tee -a $OUT/summary.txt
  (echo "== step $b row=$row"; $P script -i /tmp/s.data -F comm,tid,ip,sym 2>/dev/null | /tmp/x/perffold | head -300) >> $OUT/paths.txt
done; done
echo "perf done $(date +%T)"
for i in 1 2 3 4; do
  if [ $((i%2)) = 0 ]; then o="base new nosplit"; else o="nosplit new base"; fi
  for b in $o; do
    /tmp/x/step-$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/row=/hit=0/' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark >> $OUT/step_$b.txt
  done
  echo "step round $i load $(cut -d' ' -f1 /proc/loadavg) $(date +%T)"
done
for r in 4 5; do
  if [ $((r%2)) = 0 ]; then o="oc-base oc-new"; else o="oc-new oc-base"; fi
  for b in $o; do for t in off embedded; do
    /tmp/x/$b $A --tier $t --json /tmp/j.json > /tmp/out.txt 2>&1
    echo "$b $t round=$r load=$(cut -d' ' -f1 /proc/loadavg) $(grep 'all 4' /tmp/out.txt | awk '{print $5, $(NF-2), $(NF-1)}')" | tee -a $OUT/summary.txt
    (echo "{\"bin\":\"$b\",\"round\":$r,\"report\":"; cat /tmp/j.json; echo "}") | tr -d '\n' >> $OUT/runs.jsonl; echo >> $OUT/runs.jsonl
  done; done
done
