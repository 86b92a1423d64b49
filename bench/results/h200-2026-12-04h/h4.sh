#!/bin/bash
# H200 host: the engine goroutine alone on a CPU. omni-dgt = 93dc180 + dh.patch; "-pin" runs start the
# process on CPUs 0-14 (taskset) and DIAG_PIN=15 moves the locked engine thread to CPU 15, so no other
# thread of the process shares its CPU; the interrupts CPU 15 received during the run (TLB, RES, CAL,
# LOC from /proc/interrupts) and its irq/softirq/steal jiffies are recorded. Unpinned runs as before.
B=/tmp/x
T=$PWD/bench/testdata/mooncake/synthetic_trace.jsonl
T0=$(date +%s)
(cat /proc/loadavg; nproc; ls /sys/devices/system/node/ | grep node; cat /proc/sys/kernel/numa_balancing 2>&1; uname -r) | tee $OUT/log.txt
TIMEFORMAT='%U %S %R'
snap() { # CPU 15's counters
 awk '/^cpu15 /{printf "%d %d %d ", $7, $8, $9}' /proc/stat
 for k in TLB RES CAL LOC; do grep -E "^ *$k:" /proc/interrupts | awk '{printf "%d ", $17}'; done
}
rep() { # name tier pin
 local n=$1 t=$2 pin=$3
 local s0 s1 c pre=
 [ -n "$pin" ] && pre="taskset -c 0-14"
 s0=($(snap))
 c=$( { time env DIAG_RU=1 DIAG_PIN=$pin $pre $B/omni-dgt replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl 2>/tmp/e.txt >/dev/null; } 2>&1 )
 s1=($(snap))
 local d="" i
 for i in 0 1 2 3 4 5 6; do d="$d $(( ${s1[$i]} - ${s0[$i]} ))"; done
 echo "r$r $n cpu=$c cpu15[irq,softirq,steal,TLB,RES,CAL,LOC]=$d $(grep DGT /tmp/e.txt | tr '\n' ' ') $(head -1 /tmp/j.jsonl)" >> $OUT/rep.jsonl
}
for r in 1 2 3 4 5 6; do
 [ $(( $(date +%s) - T0 )) -gt 250 ] && break
 rep off-pin off 15
 rep emb-pin embedded 15
 rep off off ""
 rep emb embedded ""
 echo "round $r $(( $(date +%s) - T0 )) s $(cat /proc/loadavg)" | tee -a $OUT/log.txt
done
