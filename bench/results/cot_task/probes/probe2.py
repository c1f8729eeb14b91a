import json, random, sys, time, statistics as S
from reasonrl.stages.eval import EvalConfig
from reasonrl.stages.options import open_generation
from reasonrl.engines.base import SamplingParams
from reasonrl.rollouts import generate_rollouts
from reasonrl.rewards.extract import extract_answer

def q(t): return "What is " + " + ".join(map(str, t)) + "?"
def partial(t):
    s=t[0]; lines=[]
    for x in t[1:]:
        lines.append(f"{s} + {x} = {s+x}"); s+=x
    return "\n".join(lines)+f"\nAnswer: {s}"
def partial_dot(t):
    s=t[0]; parts=[]
    for x in t[1:]:
        parts.append(f"{s} + {x} = {s+x}."); s+=x
    return " ".join(parts)+f"\nAnswer: {s}"
def rewrite(t):
    lines=[" + ".join(map(str,t))]; cur=list(t)
    while len(cur)>1:
        cur=[cur[0]+cur[1]]+cur[2:]; lines.append("= "+" + ".join(map(str,cur)))
    return "\n".join(lines)+f"\nAnswer: {sum(t)}"
def rewrite_inline(t):
    lines=[]; cur=list(t)
    while len(cur)>1:
        nxt=[cur[0]+cur[1]]+cur[2:]; lines.append(" + ".join(map(str,cur))+" = "+" + ".join(map(str,nxt))); cur=nxt
    return "\n".join(lines)+f"\nAnswer: {sum(t)}"
def chained(t):
    cur=list(t); parts=[" + ".join(map(str,cur))]
    while len(cur)>1:
        cur=[cur[0]+cur[1]]+cur[2:]; parts.append(" + ".join(map(str,cur)))
    return " = ".join(parts)+f"\nAnswer: {sum(t)}"
def labelled(t):
    s=t[0]; lines=[f"Start with {s}."]
    for x in t[1:]:
        lines.append(f"Add {x}: {s} + {x} = {s+x}."); s+=x
    return "\n".join(lines)+f"\nAnswer: {s}"
def rewrite_so(t):
    cur=list(t); lines=["Start: "+" + ".join(map(str,cur))]
    while len(cur)>1:
        a,b=cur[0],cur[1]; cur=[a+b]+cur[2:]
        lines.append(f"{a} + {b} = {a+b}"+(", so "+" + ".join(map(str,cur)) if len(cur)>1 else ""))
    return "\n".join(lines)+f"\nAnswer: {sum(t)}"
def left(t):
    s=t[0]; rest=list(t[1:]); lines=[f"Start with {s}. Left: "+", ".join(map(str,rest))+"."]
    while rest:
        x=rest.pop(0); lines.append(f"Add {x}: {s} + {x} = {s+x}. Left: "+(", ".join(map(str,rest)) if rest else "none")+"."); s+=x
    return "\n".join(lines)+f"\nAnswer: {s}"
def numbered(t):
    s=t[0]; lines=[f"1. Start with {s}."]
    for i,x in enumerate(t[1:],start=2):
        lines.append(f"{i}. Add {x}: {s} + {x} = {s+x}."); s+=x
    return "\n".join(lines)+f"\nAnswer: {s}"
def of(t):
    n=len(t); s=t[0]; lines=[f"1 of {n}: start with {s}."]
    for i,x in enumerate(t[1:],start=2):
        lines.append(f"{i} of {n}: add {x}, {s} + {x} = {s+x}."); s+=x
    return "\n".join(lines)+f"\nAnswer: {s}"
def direct(t): return f"Answer: {sum(t)}"
FMT={k:v for k,v in globals().items() if k in ("partial","partial_dot","rewrite","rewrite_inline","direct","chained","labelled","rewrite_so","left","numbered","of")}
SHOTSETS={"s33":[(2,3,4),(5,1,3)], "s46":[(4,1,6,2),(7,3,5,2,8,1)], "s345":[(2,3,4),(5,1,3,6),(4,2,7,1,3)], "s44":[(4,1,6,2),(3,5,2,1)], "s3456":[(2,3,4),(5,1,3,6),(4,2,7,1,3),(6,1,8,2,5,3)]}
from reasonrl.data.templates import apply_template
import random as _r
def matched(k):
    g=_r.Random(1000+k); return [tuple(g.randint(1,9) for _ in range(k)) for _ in range(2)]
def qc(t): return q(t)+f" ({len(t)} numbers)"
def msgs(shots,fmt,t):
    if shots in ("match","matchc"):
        qq=qc if shots=="matchc" else q
        m=[]
        for s in matched(len(t)): m+=[{"role":"user","content":qq(s)},{"role":"assistant","content":FMT[fmt](s)}]
        return m+[{"role":"user","content":qq(t)}]
    if shots.startswith("count"):
        m=[]
        for s in SHOTSETS[shots[5:] or "s345"]: m+=[{"role":"user","content":qc(s)},{"role":"assistant","content":FMT[fmt](s)}]
        return m+[{"role":"user","content":qc(t)}]
    inner="none"
    if shots.startswith("d-"): inner="dapo"; shots=shots[2:]
    m=[]
    for s in SHOTSETS[shots]: m+=[{"role":"user","content":apply_template(inner,q(s))},{"role":"assistant","content":FMT[fmt](s)}]
    return m+[{"role":"user","content":apply_template(inner,q(t))}]
def main():
    N=int(sys.argv[2]); LOG=open(sys.argv[4],"a")
    rng=random.Random(1)
    probs={k:[tuple(rng.randint(1,9) for _ in range(k)) for _ in range(N)] for k in range(3,8)}
    cfg=EvalConfig(dataset="aime", dtype="bf16", engine="vllm", max_response_len=256, max_prompt_len=1024, top_p=0.7, n=4, quiet=True, report_to=[])
    gen=open_generation(cfg)
    for conf in sys.argv[3].split(","):
      shots,fmt=conf.split(":")
      for k in map(int,sys.argv[1].split(",")):
        rows=[{"prompt":msgs(shots,fmt,t),"reward_model":{"style":"rule","ground_truth":str(sum(t))},"data_source":f"c{k}"} for t in probs[k]]
        t0=time.time()
        g,st=generate_rollouts(gen.engine,gen.tokenizer,None,rows,SamplingParams(n=4,temperature=1.0,top_p=0.7,max_tokens=256,seed=0),max_prompt_len=1024) if False else (None,None)
        outs=gen.engine.generate([__import__("reasonrl.rollouts",fromlist=["x"]).prompt_text(r,gen.tokenizer) for r in rows], SamplingParams(n=4,temperature=1.0,top_p=0.7,max_tokens=256,seed=0)) if False else None
        g,st=generate_rollouts(gen.engine,gen.tokenizer,gen.scorer,rows,SamplingParams(n=4,temperature=1.0,top_p=0.7,max_tokens=256,seed=0),max_prompt_len=1024)
        fl=[s for x in g for s in x]
        L=[s.length for s in fl]
        acc=sum(extract_answer(s.response)==s.ground_truth for s in fl)/len(fl)
        LOG.write(f"{conf:22s} k={k} acc={acc:.3f} len mean={S.mean(L):.1f} med={S.median(L)} max={max(L)} trunc={sum(s.truncated for s in fl)} {time.time()-t0:.0f}s\n")
        LOG.write("    "+repr(fl[0].response)+"\n    "+repr(fl[5].response)+"\n"); LOG.flush()
        with open(sys.argv[4]+".samples.jsonl","a") as f:
            for s in fl: f.write(json.dumps({"conf":conf,"k":k,"gt":s.ground_truth,"resp":s.response,"len":s.length})+"\n")
    gen.close()
if __name__=='__main__':
    main()
