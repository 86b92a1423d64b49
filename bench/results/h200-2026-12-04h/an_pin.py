import json,re,sys,collections,statistics
# h4/h5: engine ns/step, CPU 15's interrupts, the engine thread's context switches; per-variant range
d=collections.OrderedDict()
for l in open(sys.argv[1]):
    i=l.index('{'); j=json.loads(l[i:]); head=l[:i]; h=head.split()
    c15=re.search(r'\]= ([-\d ]+)',head).group(1).split()
    th=re.search(r'nvcsw (\d+) nivcsw (\d+) minflt (\d+)',head)
    print('%-3s %-8s eng %5.0f p50 %5d beg %4.0f save %4.0f %s | cpu15 TLB %s RES %s CAL %s LOC %s | vcsw %s ivcsw %s'%(h[0],h[1],j['engine_ns_per_step_mean'],j['engine_ns_p50'],j['begin_ns_total']/j['steps'],j['save_ns_total']/j['steps'],' '.join(h[2:5]),*c15[3:],*th.groups()[:2]))
    d.setdefault(h[1],[]).append(j['engine_ns_per_step_mean'])
for k,v in d.items(): print('%-8s n=%d %5.0f-%5.0f median %5.0f'%(k,len(v),min(v),max(v),statistics.median(v)))
