#!/bin/bash
# H200 host: is the engine thread slower with the tier because its core runs slower (clock, a busy
# SMT sibling: the multiply chain's time grows) or because memory is farther (the 64 MiB pointer
# chase's time grows), or neither (the engine's own lines)? omni-dgt = 93dc180 + dh.patch, DIAG_PROBE:
# before each Begin a 256-step dependent multiply chain and a 16-step pointer chase, each timed
# (DGP line: ns per probe). Rounds 1-2 also without the probes.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name tier env...
 local n=$1 t=$2; shift 2
 c=$( { time env "$@" $B/omni-dgt replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/tmp/e.txt >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(grep DG /tmp/e.txt | tr '\n' ' ') $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7 8; do
 [ $(( $(date +%s) - T0 )) -gt 300 ] && break
 rep off off DIAG_PROBE=1
 rep emb embedded DIAG_PROBE=1
 if [ $r -le 2 ]; then
  rep off-noprobe off X=1
  rep emb-noprobe embedded X=1
 fi
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
