#!/bin/bash
# Not run (no device time left): the next H200 measurement, about 3 minutes.
# Build on the VM, from the repository root, and carry the archive (.gpu/pk.tgz):
#   git worktree add -f /tmp/base 22b4d7d && (cd /tmp/base && go test -c -o /tmp/ab/step-base.test .)
#   go test -c -o /tmp/ab/step-cur.test . && go build -o /tmp/ab/omni ./cmd/omnicache
#   tar czf .gpu/pk.tgz -C /tmp/ab step-base.test step-cur.test omni
# Run: mkdir -p /tmp/x && tar xzf .gpu/pk.tgz -C /tmp/x && bash bench/results/h200-2026-12-04d/next.sh
# BenchmarkStep base / cur, every decode64 case and prefill8192 row=64, each benchmark its own
# process, interleaved, 6 rounds (cur reports committer-ns/op and caller-reads/op); then the
# 4-replica replay, tier off / embedded, 3 rounds, per-call totals from --json.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
cat /proc/loadavg; nproc
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 300 ] && break
 for c in 'decode64/row=64/hit=0/buffer=on' 'decode64/row=64/hit=0/buffer=off' 'decode64/row=64/hit=50/buffer=on' 'decode64/row=64/hit=50/buffer=off' 'decode64/row=4096/hit=0/buffer=on' 'decode64/row=4096/hit=0/buffer=off' 'decode64/row=4096/hit=50/buffer=on' 'decode64/row=4096/hit=50/buffer=off'; do
  for b in base cur; do
   $B/step-$b.test -test.run '^$' -test.bench "BenchmarkStep/shape=$c\$" -test.benchtime 0.3s | grep '^Bench' | sed "s/^/$b /" >> $OUT/step.txt
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s" | tee -a $OUT/step.txt
done
for r in 1 2 3; do
 for t in off embedded; do
  $B/omni replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl >/dev/null 2>&1
  echo "r$r $t $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
 done
done
cat /proc/loadavg | tee -a $OUT/step.txt
