import json, random, sys, time, statistics as S
from reasonrl.stages.eval import EvalConfig
from reasonrl.stages.options import open_generation
from reasonrl.engines.base import SamplingParams
from reasonrl.rollouts import generate_rollouts

def q(t): return "What is " + " + ".join(map(str, t)) + "?"
def partial(t):
    s=t[0]; lines=[]
    for x in t[1:]:
        lines.append(f"{s} + {x} = {s+x}"); s+=x
    return "\n".join(lines)+f"\nAnswer: {s}"
def rewrite(t):
    lines=[" + ".join(map(str,t))]; cur=list(t)
    while len(cur)>1:
        cur=[cur[0]+cur[1]]+cur[2:]; lines.append("= "+" + ".join(map(str,cur)))
    return "\n".join(lines)+f"\nAnswer: {sum(t)}"
def direct(t): return f"Answer: {sum(t)}"
SHOTS=[(4,1,6,2),(7,3,5,2,8,1)]
FMT={"partial":partial,"rewrite":rewrite,"direct":direct}
def msgs(fmt,t):
    m=[]
    for s in SHOTS: m+=[{"role":"user","content":q(s)},{"role":"assistant","content":FMT[fmt](s)}]
    return m+[{"role":"user","content":q(t)}]
rng=random.Random(1)
probs={k:[tuple(rng.randint(1,9) for _ in range(k)) for _ in range(int(sys.argv[2]))] for k in map(int,sys.argv[1].split(","))}
cfg=EvalConfig(dataset="aime", dtype="bf16", engine="vllm", max_response_len=256, max_prompt_len=512, top_p=0.7, n=4, quiet=True, report_to=[])
gen=open_generation(cfg)
LOG=open(sys.argv[4],"a")
for fmt in sys.argv[3].split(","):
  for k,ps in probs.items():
    rows=[{"prompt":msgs(fmt,t),"reward_model":{"style":"rule","ground_truth":str(sum(t))},"data_source":f"c{k}"} for t in ps]
    t0=time.time()
    g,st=generate_rollouts(gen.engine,gen.tokenizer,gen.scorer,rows,SamplingParams(n=4,temperature=1.0,top_p=0.7,max_tokens=256,seed=0),max_prompt_len=512)
    fl=[s for x in g for s in x]
    L=[s.length for s in fl]
    LOG.write(f"{fmt:8s} k={k} acc={sum(s.correct for s in fl)/len(fl):.3f} len mean={S.mean(L):.1f} med={S.median(L)} max={max(L)} trunc={sum(s.truncated for s in fl)} {time.time()-t0:.0f}s\n"); LOG.flush()
    LOG.write(repr(fl[0].response)+"\n"+repr(fl[1].response)+"\n"); LOG.flush()
    from reasonrl.rewards.extract import extract_answer
    LOG.write(f"   own-acc={sum(extract_answer(s.response)==s.ground_truth for s in fl)/len(fl):.3f}\n")
gen.close()
