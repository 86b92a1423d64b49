#!/bin/bash
# Not run (no device time left): issue 16 on the H200 host with the replica replay's
# recycled output buffers (78f9c30). Build on the VM from the repository root:
#   git worktree add -f /tmp/old 095fbde && (cd /tmp/old && go build -o /tmp/ab/omni-old ./cmd/omnicache)
#   go build -o /tmp/ab/omni-pool ./cmd/omnicache
#   tar czf .gpu/pk.tgz -C /tmp/ab omni-old omni-pool
# Run: mkdir -p /tmp/x && tar xzf .gpu/pk.tgz -C /tmp/x && bash bench/results/h200-2026-12-04e/next.sh
# 4 rounds of off / embedded with each build, interleaved; TLB shootdowns per run from /proc/interrupts.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
tlb() { awk '/TLB:/ {s=0; for (i=2; i<=NF; i++) if ($i ~ /^[0-9]+$/) s+=$i; print s}' /proc/interrupts; }
for r in 1 2 3 4; do
 [ $(( $(date +%s) - T0 )) -gt 420 ] && break
 for t in off embedded; do
  for b in omni-old omni-pool; do
   a=$(tlb); $B/$b replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl >/dev/null 2>&1; z=$(tlb)
   echo "r$r $t $b tlb=$((z-a)) $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
