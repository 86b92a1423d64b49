#!/bin/bash
# H200 host: the tier's cost to the engine goroutine on the same steps. omni-dg (dg.patch, all runs
# DIAG_SPIN=1): off; embedded; embedded with DIAG_NOLOAD (everything published, the shared KV store
# loads nothing: no tier hit, the steps of the run without tier); embedded with DIAG_DD (the committer
# skips the blocks the embedded store holds, e6_dd.patch). Process CPU time per run (user, sys, real s).
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; which perf) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
for r in 1 2 3 4; do
 [ $(( $(date +%s) - T0 )) -gt 300 ] && break
 for v in off emb noload dd; do
  t=embedded; e=""
  case $v in off) t=off;; noload) e=DIAG_NOLOAD=1;; dd) e=DIAG_DD=1;; esac
  echo "== r$r $v" >> $OUT/dg.txt
  c=$( { time env DIAG_SPIN=1 $e $B/omni-dg replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/tmp/err >/dev/null; } 2>&1 )
  grep '^DG' /tmp/err >> $OUT/dg.txt
  echo "r$r $v cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
 done
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
