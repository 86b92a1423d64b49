import json,re,sys,collections,statistics
# i1-i3: engine ns/step per run and per variant (range, median), with the process's CPU time and the
# per-call split; rounds side by side.
d=collections.OrderedDict(); rounds=collections.OrderedDict()
for l in open(sys.argv[1]):
    i=l.index('{'); j=json.loads(l[i:]); h=l[:i].split(); s=j['steps']
    cpu=re.search(r'cpu=([\d.]+) ([\d.]+) ([\d.]+)',l[:i])
    d.setdefault(h[1],[]).append((j['engine_ns_per_step_mean'],j['begin_ns_total']/s,j['save_ns_total']/s,j['discard_ns_total']/s,float(cpu.group(1)),float(cpu.group(2)),float(cpu.group(3)),j['hit_rate'],j['tier_publish_dropped']))
    rounds.setdefault(h[0],{})[h[1]]=j['engine_ns_per_step_mean']
names=list(d)
print('round '+' '.join('%8s'%n for n in names))
for r,v in rounds.items(): print('%-5s '%r+' '.join('%8.0f'%v.get(n,0) for n in names))
for k,v in d.items():
    e=[x[0] for x in v]; m=lambda i: statistics.median([x[i] for x in v])
    print('%-8s n=%d eng %5.0f-%5.0f median %5.0f | begin %4.0f save %4.0f discard %4.0f | user %4.1f sys %3.1f real %4.1f s | hit %.4f dropped %d'%(k,len(v),min(e),max(e),statistics.median(e),m(1),m(2),m(3),m(4),m(5),m(6),m(7),m(8)))
