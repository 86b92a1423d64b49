#!/bin/bash
# H200 host: issue 16's engine-time gap against Go runtime knobs, with the engine thread's own
# counters (omni-dgt = 93dc180 + dh.patch: DIAG_RU locks the replay's engine goroutine to its thread
# and prints its voluntary/involuntary context switches, minor faults, user/system ms; DIAG_TCPU
# also reads the thread's CPU clock around Begin, Save and Discard). Per run also the host-side
# deltas of /proc/stat (irq, softirq, steal jiffies) and /proc/interrupts (TLB, RES, CAL, LOC).
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag 2>&1; grep -m1 'model name' /proc/cpuinfo; grep -c ^processor /proc/cpuinfo) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
snap() {
 awk '/^cpu /{printf "%d %d %d ", $7, $8, $9}' /proc/stat
 for k in TLB RES CAL LOC; do grep -E "^ *$k:" /proc/interrupts | awk '{s=0; for(i=2;i<=NF;i++) if ($i ~ /^[0-9]+$/) s+=$i; printf "%d ", s}'; done
}
rep() { # name tier env...
 local n=$1 t=$2; shift 2
 local s0 s1 c
 s0=($(snap))
 c=$( { time env "$@" $B/omni-dgt replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/tmp/e.txt >/dev/null; } 2>&1 )
 s1=($(snap))
 local d="" i
 for i in 0 1 2 3 4 5 6; do d="$d $(( ${s1[$i]} - ${s0[$i]} ))"; done
 echo "r$r $n cpu=$c host[irq,softirq,steal,TLB,RES,CAL,LOC]=$d $(grep DGT /tmp/e.txt | tr '\n' ' ') $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 470 ] && break
 rep off off DIAG_RU=1
 rep emb embedded DIAG_RU=1
 rep emb-nopreempt embedded DIAG_RU=1 GODEBUG=asyncpreemptoff=1
 rep emb-gogc400 embedded DIAG_RU=1 GOGC=400
 rep off-p4 off DIAG_RU=1 GOMAXPROCS=4
 rep emb-p4 embedded DIAG_RU=1 GOMAXPROCS=4
 if [ $r -le 2 ]; then
  rep off-plain off X=1
  rep emb-plain embedded X=1
  rep off-tcpu off DIAG_TCPU=1
  rep emb-tcpu embedded DIAG_TCPU=1
 fi
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
