import json,sys,re,collections,statistics
# h1: python3 an.py h1_rep.jsonl. h1_rep.jsonl: one line per run: tags, cpu=user sys wall, host deltas, DGT lines, JSON report
rows=collections.OrderedDict()
for l in open(sys.argv[1]):
    i=l.index('{'); j=json.loads(l[i:]); head=l[:i]
    r,name=head.split()[:2]
    cpu=re.search(r'cpu=([\d.]+) ([\d.]+) ([\d.]+)',head).groups()
    host=re.search(r'\]= ([-\d ]+)',head).group(1).split()
    th=re.search(r'nvcsw (\d+) nivcsw (\d+) minflt (\d+) utime (\d+) stime (\d+)',head)
    dg=[x for x in re.findall(r'DGT replica \d+ steps (\d+) wall (\d+) cpu (\d+)',head) if int(x[1])>0] # the simulator-only pass reports 0
    cal=re.search(r'calib (\d+)',head)
    s='%-3s %-14s eng %5.0f p50 %5d p99 %6d beg %4.0f save %4.0f | user %5s sys %4s wall %5s | irq %s sirq %s steal %s TLB %s RES %s CAL %s LOC %s' % (r,name,j['engine_ns_per_step_mean'],j['engine_ns_p50'],j['engine_ns_p99'],j['begin_ns_total']/j['steps'],j['save_ns_total']/j['steps'],*cpu,*host)
    if th: s+=' | thr vcsw %s ivcsw %s flt %s ut %s st %s'%th.groups()
    if dg:
        st=sum(int(x[0]) for x in dg); w=sum(int(x[1]) for x in dg); c=sum(int(x[2]) for x in dg)
        s+=' | tcpu/step %.0f wall/step %.0f calib %s'%(c/st,w/st,re.findall(r'calib (\d+)',head)[-1])
    print(s)
    rows.setdefault(name,[]).append(j['engine_ns_per_step_mean'])
print()
for k,v in rows.items():
    print('%-14s n=%d min %5.0f median %5.0f max %5.0f'%(k,len(v),min(v),statistics.median(v),max(v)))
