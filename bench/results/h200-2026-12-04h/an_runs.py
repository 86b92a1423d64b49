import json,re,sys,collections,statistics
# h2/h3: engine ns/step per run (and the DGP probes' ns when present); per-variant range and median
d=collections.OrderedDict()
for l in open(sys.argv[1]):
    i=l.index('{'); j=json.loads(l[i:]); head=l[:i]; h=head.split()
    p=re.search(r'DGP probes (\d+) alu (\d+) mem (\d+)',head)
    print('%-3s %-14s eng %5.0f p50 %5d beg %4.0f save %4.0f %s %s'%(h[0],h[1],j['engine_ns_per_step_mean'],j['engine_ns_p50'],j['begin_ns_total']/j['steps'],j['save_ns_total']/j['steps'],' '.join(h[2:5]),('alu %s mem %s'%(p.group(2),p.group(3))) if p else ''))
    d.setdefault(h[1],[]).append((j['engine_ns_per_step_mean'],int(p.group(2)) if p else 0,int(p.group(3)) if p else 0))
for k,v in d.items():
    e=[x[0] for x in v]; s='%-14s n=%d eng %5.0f-%5.0f median %5.0f'%(k,len(v),min(e),max(e),statistics.median(e))
    if v[0][1]: s+=' | alu median %d mem median %d'%(statistics.median([x[1] for x in v]),statistics.median([x[2] for x in v]))
    print(s)
