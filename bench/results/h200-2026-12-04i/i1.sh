#!/bin/bash
# H200 host: issue 16's engine time on main 6e6dbb8 (mapped slabs, cheaper Lookup), decomposed.
# omni-new = 6e6dbb8; omni-dE = 6e6dbb8 + dh2.patch + dh3.patch (../h200-2026-12-04h) + DIAG_LOOKUPZERO
# (the replica asks the tier and throws the answer away: the tier-off run's steps with the Lookups' work).
# Each round, in turn: new off, new embedded, and with omni-dE on embedded: pub (DIAG_NOLOOKUP: the
# tier-off run's steps, its full blocks published), rows0 (+DIAG_NOROWS: gathers queued, copying
# nothing), none (DIAG_NOLOOKUP+DIAG_NOPUSH: nothing asked, nothing published), lk (DIAG_LOOKUPZERO+
# DIAG_NOPUSH: the Lookups alone).
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; uname -r) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
rep() { # name binary tier env...
 local n=$1 b=$2 t=$3; shift 3
 c=$( { time env "$@" $B/$b replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/dev/null >/dev/null; } 2>&1 )
 echo "r$r $n cpu=$c $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6 7 8; do
 [ $(( $(date +%s) - T0 )) -gt 420 ] && break
 rep off omni-new off X=1
 rep emb omni-new embedded X=1
 rep pub omni-dE embedded DIAG_NOLOOKUP=1
 rep rows0 omni-dE embedded DIAG_NOLOOKUP=1 DIAG_NOROWS=1
 rep none omni-dE embedded DIAG_NOLOOKUP=1 DIAG_NOPUSH=1
 rep lk omni-dE embedded DIAG_LOOKUPZERO=1 DIAG_NOPUSH=1
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
