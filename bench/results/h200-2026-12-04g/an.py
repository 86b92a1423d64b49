import json,sys,collections
# g1_rep.jsonl: engine ns/step per run; g1_dg.txt: steps by (pd, cls, mig), weighted over replicas
for l in open(sys.argv[1]):
    i=l.index('{'); j=json.loads(l[i:])
    print('%-26s mean %5.0f p50 %5d begin %5.0f save %5.0f disc %4.0f pace %.2fs tierhit %d' % (l[:i].strip(), j['engine_ns_per_step_mean'], j['engine_ns_p50'], j['begin_ns_total']/j['steps'], j['save_ns_total']/j['steps'], j['discard_ns_total']/j['steps'], j['pace_ns_total']/1e9, j['tier_hit_tokens']))
run=None; agg=collections.OrderedDict()
for l in open(sys.argv[2]):
    if l.startswith('=='): run=l[3:].strip(); agg[run]=collections.defaultdict(lambda:[0,0,0]); continue
    f=l.split(); k=(int(f[4]),int(f[6]),int(f[8])); n=int(f[10]); a=agg[run][k]; a[0]+=n; a[1]+=n*int(f[12]); a[2]+=n*int(f[14])
for run,d in agg.items():
    print(run.ljust(24),' '.join('pd%d c%d m%d n=%d b=%d s=%d'%(k+(v[0],v[1]//v[0],v[2]//v[0])) for k,v in sorted(d.items()) if k[1]==0))
