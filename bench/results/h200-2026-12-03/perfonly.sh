rm -rf /tmp/x; mkdir -p /tmp/x && tar xzf .gpu/pk.tgz -C /tmp/x
P="/tmp/x/lib/ld-linux-x86-64.so.2 --library-path /tmp/x/lib /tmp/x/perf"
$P --version 2>&1 | head -1
T=bench/testdata/mooncake/synthetic_trace.jsonl
A="replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536"
for t in off embedded; do
  $P record -F 10000 -g -o /tmp/p-$t.data /tmp/x/oc-new $A --tier $t > /tmp/out.txt 2>/tmp/perr.txt
  tail -1 /tmp/perr.txt
  echo "perf replay $t $(grep 'all 4' /tmp/out.txt | awk '{print $5, $(NF-2), $(NF-1)}')"
  (echo "== replay $t"; $P script -i /tmp/p-$t.data -F comm,tid,ip,sym 2>/dev/null | /tmp/x/perffold | head -400) >> $OUT/paths.txt
done
for b in base new; do for row in 64 4096; do
  $P record -F 10000 -g -o /tmp/s.data /tmp/x/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=decode64/row=$row/hit=0/buffer=off" -test.benchtime 2s -test.count 1 > /tmp/out.txt 2>/tmp/perr.txt
  echo "perf step $b $(grep Benchmark /tmp/out.txt)"
  (echo "== step $b row=$row"; $P script -i /tmp/s.data -F comm,tid,ip,sym 2>/dev/null | /tmp/x/perffold | head -300) >> $OUT/paths.txt
done; done
