#!/bin/bash
# H200 host: what of the tier costs the engine goroutine. omni-dg (dg.patch, all runs DIAG_SPIN=1):
# off; embedded; embedded with DIAG_NOGATHER (nothing gathered, published or imported: the tier's
# presence alone); embedded with DIAG_NOCOPY (gathers queued and run, every block dropped before its
# copy). Process CPU time per run (user, sys, real s) from bash's time. CPU topology first.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; lscpu | grep -Ei 'model name|thread|core|socket|numa|L[123]'; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
for r in 1 2 3 4; do
 [ $(( $(date +%s) - T0 )) -gt 300 ] && break
 for v in off emb nogather nocopy; do
  t=embedded; e=""
  case $v in off) t=off;; nogather) e=DIAG_NOGATHER=1;; nocopy) e=DIAG_NOCOPY=1;; esac
  echo "== r$r $v" >> $OUT/dg.txt
  c=$( { time env DIAG_SPIN=1 $e $B/omni-dg replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/tmp/err >/dev/null; } 2>&1 )
  grep '^DG' /tmp/err >> $OUT/dg.txt
  echo "r$r $v cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
