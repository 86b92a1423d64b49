import json,sys,collections
# engine ns/step per run and per variant (range, median) of a replay JSONL tagged "rN variant cpu=U S R {...}"
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    i=l.index('{'); j=json.loads(l[i:]); tag=l[:i].split()
    d[tag[1]].append(j)
    print('%-3s %-13s %s mean %5.0f p50 %5d begin %5.0f save %5.0f disc %4.0f hit %.4f pub %.2fGB recent %d drop %d' % (tag[0],tag[1],' '.join(tag[2:5]), j['engine_ns_per_step_mean'], j['engine_ns_p50'], j['begin_ns_total']/j['steps'], j['save_ns_total']/j['steps'], j['discard_ns_total']/j['steps'], j['hit_rate'], j['tier_bytes_published']/1e9, j.get('tier_publish_recent',0), j['tier_publish_dropped']))
for k,v in d.items():
    m=sorted(x['engine_ns_per_step_mean'] for x in v); print(k, len(m), 'range %.0f-%.0f median %.0f'%(m[0],m[-1],m[len(m)//2]))
