"""A calibration for alone.py: the same copy task (rows of 512 tokens, random segments of 16-64
ids each written twice, batch 16, AdamW with warm-up and cosine decay) on a plain dense
transformer written here in a few lines of JAX, with none of lwm_jax's code: pre-norm, RoPE,
causal softmax attention (4 heads of 32), a GELU MLP, hidden 128. If this model copies where the
`demo` MoE does not, the fault is ours; if it sits on the same plateau, the plateau belongs to the
task at this scale.

  python experiments/copy_drills_random/plain_reference.py STEPS EVERY LR ALPHABET [MLP 0/1] [LAYERS] [MODE]
  python experiments/copy_drills_random/plain_reference.py 600 50 3e-3 32 1 2   # plain_32_600.jsonl

MODE (default 0) adds a previous-token path that the induction literature says shortens the
plateau: 1 = smeared keys (each head mixes every key with its predecessor's, weight sigmoid(a)
with a learnt per head, a = 0 at the start); 2 = a second embedding table of the previous token
added to the input (a token shift), so one attention layer can match "the token before j" with
"the token at t".
"""
import sys, time, json, numpy as np, jax, jax.numpy as jnp, optax
STEPS=int(sys.argv[1]); EVERY=int(sys.argv[2]); LR=float(sys.argv[3]); ALPHABET=int(sys.argv[4]); MLP=int(sys.argv[5]) if len(sys.argv)>5 else 1
B,S,V,D,H,L=16,512,2048,128,4,int(sys.argv[6]) if len(sys.argv)>6 else 2
MODE=int(sys.argv[7]) if len(sys.argv)>7 else 0
K=D//H
def rows(rng,n):
  toks=np.zeros((n,S),np.int32); second=np.zeros((n,S),bool)
  for r in range(n):
    i=0
    while i<S:
      k=int(rng.integers(16,65)); seg=rng.integers(3,3+ALPHABET,k)
      both=np.concatenate([seg,seg])[:S-i]; toks[r,i:i+len(both)]=both; second[r,i+k:i+len(both)]=True; i+=len(both)
  return toks,second
def init(key):
  ks=iter(jax.random.split(key,100)); n=lambda *s,sc=0.02: jax.random.normal(next(ks),s)*sc
  p={"emb":n(V,D)}
  if MODE: p["emb_prev"]=n(V,D)*(MODE==2)  # drawn only with a MODE: MODE 0 keeps its old draws
  p.update(out=n(D,V),layers=[])
  for _ in range(L):
    p["layers"].append({"qkv":n(D,3*D),"o":n(D,D),"w1":n(D,4*D),"w2":n(4*D,D),"smear":jnp.zeros((H,))})
  return p
def rope(x,pos):
  half=K//2; f=1e4**(-jnp.arange(half)/half); a=pos[:,None]*f[None]; c,s=jnp.cos(a),jnp.sin(a)
  x1,x2=x[...,:half],x[...,half:]
  return jnp.concatenate([x1*c[:,None]-x2*s[:,None], x2*c[:,None]+x1*s[:,None]],-1)
def norm(x): return x*jax.lax.rsqrt((x*x).mean(-1,keepdims=True)+1e-6)
def fwd(p,t):
  x=p["emb"][t]
  if MODE==2: x=x+jnp.pad(p["emb_prev"][t],((0,0),(1,0),(0,0)))[:,:-1]
  pos=jnp.arange(S); m=jnp.tril(jnp.ones((S,S),bool))
  for l in p["layers"]:
    h=norm(x); q,k,v=jnp.split(h@l["qkv"],3,-1)
    q,k,v=[z.reshape(z.shape[0],S,H,K) for z in (q,k,v)]
    if MODE==1:
      g=jax.nn.sigmoid(l["smear"])[None,None,:,None]; k=g*k+(1-g)*jnp.pad(k,((0,0),(1,0),(0,0),(0,0)))[:,:-1]
    q,k=rope(q,pos),rope(k,pos)
    a=jnp.einsum("bshk,bthk->bhst",q,k)/np.sqrt(K); a=jax.nn.softmax(jnp.where(m,a,-1e30),-1)
    x=x+jnp.einsum("bhst,bthk->bshk",a,v).reshape(x.shape)@l["o"]
    if MLP: x=x+jax.nn.gelu(norm(x)@l["w1"])@l["w2"]
  return norm(x)@p["out"]
def nll(p,t):
  lp=jax.nn.log_softmax(fwd(p,t),-1); return -jnp.take_along_axis(lp[:,:-1],t[:,1:,None],-1)[...,0]
WARM=min(20,STEPS//2)  # 20 for the recorded run, as alone.py
opt=optax.adamw(optax.warmup_cosine_decay_schedule(0,LR,WARM,max(STEPS,2*WARM+1)),weight_decay=0.1)
p=init(jax.random.PRNGKey(0)); st=opt.init(p)
@jax.jit
def step(p,st,t):
  l,g=jax.value_and_grad(lambda p: nll(p,t).mean())(p); u,st=opt.update(g,st,p); return optax.apply_updates(p,u),st,l
sc=jax.jit(nll)
rng=np.random.default_rng(0); test,sec=rows(np.random.default_rng(123),16); t0=time.time()
for s in range(1,STEPS+1):
  p,st,l=step(p,st,jnp.asarray(rows(rng,B)[0]))
  if s%EVERY==0 or s==1:
    n=np.asarray(sc(p,jnp.asarray(test))); m=sec[:,1:]
    print(json.dumps({"step":s,"loss":round(float(l),3),"first":round(float(n[~m].mean()),3),"second":round(float(n[m].mean()),3),"s":round(time.time()-t0)}),flush=True)
