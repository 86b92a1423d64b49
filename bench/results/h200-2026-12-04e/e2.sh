#!/bin/bash
# H200 host: execution traces of BenchmarkStep decode64 hit=50 (base, cur,
# nopf; the goroutine states are read on the VM with go tool trace), and the
# 4-replica replay with steps split by class (omni-cls: HEAD with per-class
# engine times on stderr, a diagnosis build): tier off, embedded, embedded
# with a 1 MiB tier (publishing as much, almost no tier hits), 3 rounds;
# one execution trace of off and embedded, summarized by tra (regions by
# GC overlap and goroutine state).
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
for c in 'row=64/hit=50/buffer=on' 'row=4096/hit=50/buffer=on'; do
 for b in base cur nopf; do
  n=$(echo $c | tr '/=' '__')
  $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/$c\$" -test.benchtime 40000x -test.trace /tmp/tr_${b}_$n.out | grep '^Bench' | sed "s/^/$b /" >> $OUT/log.txt
 done
done
tar czf $OUT/steptraces.tgz -C /tmp $(cd /tmp && ls tr_*.out)
for r in 1 2 3; do
 for t in "off" "embedded" "embedded --tier-mib 1"; do
  $B/omni-cls replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/tmp/cls.txt >/dev/null
  echo "r$r $t $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
  grep CLS /tmp/cls.txt | awk '$5!="n=0"' | sed "s/^/r$r $t | /" >> $OUT/cls.txt
 done
 echo "rep round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
for t in off embedded; do
 $B/omni-cls replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --exec-trace /tmp/et_$t.out --json /tmp/j.jsonl >/dev/null 2>&1
 echo "== $t" >> $OUT/tra.txt; $B/tra /tmp/et_$t.out >> $OUT/tra.txt 2>&1
done
cat /proc/loadavg | tee -a $OUT/log.txt
