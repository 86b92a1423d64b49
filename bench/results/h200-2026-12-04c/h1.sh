#!/bin/bash
# H200: replicas replay, tier off vs embedded, with a held (spun) forward of X_HOLD between Begin and Save.
cd "$(dirname "$0")"
: "${T:?}"
lscpu | grep -i "thread\|core\|socket\|model name\|numa" > $OUT/lscpu.txt
cat /proc/loadavg
for r in 1 2 3; do
 for h in 0 300us 1ms; do
  for t in off embedded; do
   s=$(date +%s.%N)
   X_HOLD=$h ./omni-hold replay --trace $T --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t 2>&1 | grep "all 4" | sed "s/^/r$r hold=$h /" | tee -a $OUT/h1.txt
   echo "r$r $h $t wall $(echo "$(date +%s.%N) - $s" | bc)" >> $OUT/h1.txt
  done
 done
done
cat /proc/loadavg
