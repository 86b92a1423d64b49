#!/bin/bash
# perf of BenchmarkStep decode64 row=64 hit=0 buffer=off on the H200 host,
# 22b4d7d (step-base) against this tree (step-new), the same 300000 steps
# each: hardware events where the host has them, the engine goroutine's
# samples folded to paths under stepEngine.step / the plan's advance.
# .gpu/px.tgz: perf (Debian's linux-perf 6.1) with its libraries and loader,
# and bench/tools/perffold.
mkdir -p /tmp/x && tar xzf .gpu/px.tgz -C /tmp/x
P="/tmp/x/px/lib/ld-linux-x86-64.so.2 --library-path /tmp/x/px/lib /tmp/x/px/perf"
cat /proc/loadavg
$P stat -e cycles,instructions,cache-misses,LLC-load-misses true 2>&1 | grep -E "cycles|instr|miss"
B='BenchmarkStep/shape=decode64/row=64/hit=0/buffer=off$'
for ev in ${EVENTS:-cycles instructions}; do for b in base new; do
  $P record -e $ev -c ${PERIOD:-20000} -g -o /tmp/s.data ./.gpu/step-$b.test -test.run '^$' -test.bench "$B" -test.benchtime 300000x > /tmp/out.txt 2>/tmp/perr.txt
  echo "$ev $b $(grep Benchmark /tmp/out.txt) $(tail -1 /tmp/perr.txt)"
  $P script -i /tmp/s.data -F comm,tid,ip,sym 2>/dev/null > /tmp/s.txt
  (echo "== $ev $b"; /tmp/x/px/perffold -roots 'omnicache_test.(*stepEngine).step,omnicache_test.benchStep.func1' -depth 2 < /tmp/s.txt | head -60
   /tmp/x/px/perffold -depth 8 < /tmp/s.txt | head -400) > $OUT/paths-$ev-$b.txt
done; done
cat /proc/loadavg
