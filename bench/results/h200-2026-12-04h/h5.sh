#!/bin/bash
# H200 host: the engine goroutine alone on CPU 15 with the rest of the process on CPUs 0-7 ("-far") or
# 0-14 ("-pin", as h4), to see whether a neighbouring vCPU (an SMT sibling on the host, or a shared L2)
# carries the tier's cost. omni-dgt = 93dc180 + dh.patch.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; ls /sys/devices/system/node/ | grep node; cat /proc/sys/kernel/numa_balancing 2>&1; uname -r) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
snap() { # CPU 15's counters
 awk '/^cpu15 /{printf "%d %d %d ", $7, $8, $9}' /proc/stat
 for k in TLB RES CAL LOC; do grep -E "^ *$k:" /proc/interrupts | awk '{printf "%d ", $17}'; done
}
rep() { # name tier cpus
 local n=$1 t=$2 cpus=$3 pin=15
 local s0 s1 c pre="taskset -c $cpus"
 s0=($(snap))
 c=$( { time env DIAG_RU=1 DIAG_PIN=$pin $pre $B/omni-dgt replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/tmp/e.txt >/dev/null; } 2>&1 )
 s1=($(snap))
 local d="" i
 for i in 0 1 2 3 4 5 6; do d="$d $(( ${s1[$i]} - ${s0[$i]} ))"; done
 echo "r$r $n cpu=$c cpu15[irq,softirq,steal,TLB,RES,CAL,LOC]=$d $(grep DGT /tmp/e.txt | tr '\n' ' ') $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 230 ] && break
 rep off-far off 0-7
 rep emb-far embedded 0-7
 rep off-pin off 0-14
 rep emb-pin embedded 0-14
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
