#!/usr/bin/env python3
"""Print one `--tensor-type '^NAME$=TYPE'` rule per quantised dense tensor of a GGUF (routed experts excluded), so that
`k3 quantize` writes another quantiser's exact type allocation: the equal-types comparisons of docs/quantization.md
(session 30). Usage: eval "k3 quantize MODEL OUT PRESET $(scripts/perf/gguf_types_as_rules.py LLAMA.gguf)"."""
import struct,sys
def read_gguf(path):
    f=open(path,'rb')
    def u32(): return struct.unpack('<I',f.read(4))[0]
    def u64(): return struct.unpack('<Q',f.read(8))[0]
    def s(): n=u64(); return f.read(n).decode('utf-8','replace')
    assert f.read(4)==b'GGUF'; ver=u32(); nt=u64(); nkv=u64()
    sizes={0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
    def val(t):
        if t==8: return s()
        if t==9:
            et=u32(); n=u64(); return [val(et) for _ in range(n)]
        return f.read(sizes[t])
    for _ in range(nkv): k=s(); t=u32(); val(t)
    out=[]
    for _ in range(nt):
        name=s(); nd=u32(); dims=[u64() for _ in range(nd)]; typ=u32(); off=u64(); out.append((name,typ))
    return out
T={2:'q4_0',3:'q4_1',6:'q5_0',7:'q5_1',8:'q8_0',10:'q2_k',11:'q3_k',12:'q4_k',13:'q5_k',14:'q6_k',20:'iq4_nl',23:'iq4_xs'}
rules=[]
for name,typ in read_gguf(sys.argv[1]):
    if typ in T and '_exps' not in name:
        rules.append("--tensor-type '^%s$=%s'" % (name.replace('.','\\.'), T[typ]))
print(' '.join(rules))
