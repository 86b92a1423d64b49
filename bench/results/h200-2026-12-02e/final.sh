#!/bin/bash
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --wait-publish"
nproc; cat /proc/loadavg
run() { # name, env, extra args
  local n=$1 env=$2; shift 2
  env $env .gpu/omnicache $A "$@" >$OUT/$n.txt 2>&1
  echo "$n load=$(cut -d' ' -f1 /proc/loadavg) :: $(grep 'all 4' $OUT/$n.txt | awk '{print $5, $(NF-2), $(NF-1)}')"
}
for r in 1 2 3; do
 run off$r X=1 --tier off
 run small$r X=1 --tier embedded --tier-mib 1
 run emb$r X=1 --tier embedded
done
for r in 1 2; do
 run off-p4-$r GOMAXPROCS=4 --tier off
 run small-p4-$r GOMAXPROCS=4 --tier embedded --tier-mib 1
done
.gpu/new.test -test.run '^$' -test.bench 'BenchmarkTierStep' -test.count 6 -test.benchtime 1s 2>&1 | grep Benchmark | tee $OUT/tierstep.txt
cat /proc/loadavg
for i in 1 2 3 4 5 6; do for b in base new; do .gpu/$b.test -test.run '^$' -test.bench 'BenchmarkStep/shape=decode64/' -test.benchtime 1s -test.count 1 2>/dev/null | grep Benchmark >> $OUT/step_$b.txt; done; done
cat /proc/loadavg
