#!/bin/bash
# per run: TLB shootdowns, function-call and rescheduling IPIs (both CPUs), engine ns/step
cd /work/main
irq() { awk '/TLB:|CAL:|RES:/ {print $1, $2+$3}' /proc/interrupts | tr '\n' ' '; }
for r in 1 2; do
 for t in off embedded "embedded --tier-mib 1"; do
  a=$(irq); s=$(date +%s.%N)
  /tmp/ab/omni-new replay --trace bench/testdata/mooncake/synthetic_trace.jsonl --replicas 4 --route round-robin --shared-kv-blocks 65536 --tier $t --json /tmp/j.jsonl >/dev/null 2>&1
  e=$(date +%s.%N); b=$(irq)
  python3 -c "
import json
a='$a'.split(); b='$b'.split()
d=json.loads(open('/tmp/j.jsonl').readline()); s=d['steps']
dt=$e-$s
print('%-22s %5.1fs eng/step %5.0f'%('$t',dt,d['engine_ns_total']/s), ' '.join('%s %.0f/s'%(a[i], (float(b[i+1])-float(a[i+1]))/dt) for i in range(0,len(a),2)))"
 done
done
