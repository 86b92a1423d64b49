#!/bin/bash
# H200 host: issue 16's engine-time gap split by step kind. omni-dg = 5ec39b0 + dg.patch (diagnosis:
# per replica, steps by pure decode (pd), tier class (cls: 0 no hit, 1 local hit, 2 tier import) and
# whether the engine thread changed CPU between Begin and Save (mig); DIAG_SPIN=1 makes the pacing
# Sync spin up to 1 s before parking). off / embedded × park / spin, interleaved.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
for r in 1 2 3 4; do
 [ $(( $(date +%s) - T0 )) -gt 330 ] && break
 for t in off embedded; do
  for s in "" 1; do
   echo "== r$r $t spin=$s" >> $OUT/dg.txt
   DIAG_SPIN=$s $B/omni-dg replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>&1 >/dev/null | grep '^DG' >> $OUT/dg.txt
   echo "r$r $t spin=$s $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
  done
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
