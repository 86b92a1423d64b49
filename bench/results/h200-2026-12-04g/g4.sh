#!/bin/bash
# H200 host: issue 16's engine time with the committed change (omni-new: Config.SyncSpin, the replica
# replay's pacing spins by default; tier.Options.RecentWindow, blocks stored within 1 s are not
# published again). Each round: off and embedded on the defaults; rounds 1-3 also off and embedded with
# --pace-park (the pacing as before) and embedded with --tier-recent=-1ns (every block published).
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name tier flags...
 local n=$1 t=$2; shift 2
 c=$( { time $B/omni-new replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t "$@" --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7; do
 [ $(( $(date +%s) - T0 )) -gt 330 ] && break
 rep off off
 rep emb embedded
 if [ $r -le 3 ]; then
  rep off-park off --pace-park
  rep emb-park embedded --pace-park
  rep emb-norecent embedded --tier-recent=-1ns
 fi
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
