import csv,sys,collections
rows=list(csv.reader(open(sys.argv[1])))
kern=[];cur=None
for r in rows:
    if r and r[0]=='Kernel Name': cur={'name':r[1],'hdr':None,'rows':[]}; kern.append(cur); continue
    if cur is None: continue
    if r and r[0]=='Address': cur['hdr']=r; continue
    if r: cur['rows'].append(r)
which=int(sys.argv[2]) if len(sys.argv)>2 else 0
k=kern[which]; h=k['hdr']; R=k['rows']
print(k['name'][:40], k['name'][-120:])
ci={x:i for i,x in enumerate(h)}
sc=[x for x in h if x.startswith('stall_') and 'Not Issued' not in x]
def num(x):
    try: return float(x.replace(',',''))
    except: return 0.0
tot=collections.Counter()
for r in R:
    for s in sc: tot[s]+=num(r[ci[s]])
T=sum(num(r[ci['Warp Stall Sampling (All Samples)']]) for r in R)
print('total samples',T)
for s,v in tot.most_common(12): print(f'  {s:28s} {v:8.0f} {v/T:.3f}')
# top instructions
R2=sorted(R,key=lambda r:-num(r[ci['Warp Stall Sampling (All Samples)']]))
for r in R2[:int(sys.argv[3]) if len(sys.argv)>3 else 40]:
    st=sorted(((num(r[ci[s]]),s[6:]) for s in sc),reverse=True)[:3]
    print(f"{r[0][-5:]} {num(r[ci['Warp Stall Sampling (All Samples)']]):6.0f} ex {num(r[ci['Instructions Executed']]):9.0f} {r[1].strip()[:60]:60s} {st}")
