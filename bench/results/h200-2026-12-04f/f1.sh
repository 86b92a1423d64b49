#!/bin/bash
# H200 host: issue 16's engine time with 78f9c30 (omni-pool = 5ec39b0) vs 095fbde (omni-old),
# off / embedded interleaved, TLB shootdowns per run; then omni-cls (5ec39b0 + ../h200-2026-12-04e/e2_cls.patch,
# a diagnosis build printing engine time by step class: 0 no hit, 1 local hit, 2 tier import).
# Build on the VM: see next.sh in ../h200-2026-12-04e; omni-cls = go build after git apply e2_cls.patch.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
tlb() { awk '/TLB:/ {s=0; for (i=2; i<=NF; i++) if ($i ~ /^[0-9]+$/) s+=$i; print s}' /proc/interrupts; }
rep() { $B/$1 replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $2 --json /tmp/j.jsonl >/dev/null 2>>$3; }
for r in 1 2 3 4; do
 [ $(( $(date +%s) - T0 )) -gt 300 ] && break
 for t in off embedded; do
  for b in omni-old omni-pool; do
   a=$(tlb); rep $b $t /dev/null; z=$(tlb)
   echo "r$r $t $b tlb=$((z-a)) $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
for r in 1 2 3; do
 [ $(( $(date +%s) - T0 )) -gt 480 ] && break
 for t in off embedded; do
  echo "r$r $t" >> $OUT/cls.txt; rep omni-cls $t $OUT/cls.txt
  echo "r$r $t cls $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
 done
done
echo "end $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
