"""In-context copy probe: mean next-token NLL over the first and the second copy of a held-out
observation (200-600 characters, 12 per domain) written twice. A model that copies from its
context scores the second copy far lower than the first.

  python experiments/copy_drills_pilot/probe.py MODEL_HF_DIR [MORE_DIRS]
"""
import sys, gzip, json
import numpy as np, jax, jax.numpy as jnp
from lwm_jax.sampling import Sampler
for path in sys.argv[1:]:
  s = Sampler.from_checkpoint(path)
  m, tok = s.model, s.tokenizer
  res = {}
  for dom in ("terminal", "mcp", "web"):
    obs = []
    for l in gzip.open(f'data/corpus/{dom}_test.jsonl.gz', 'rt'):
      d = json.loads(l)
      for t in d['turns']:
        if 200 < len(t['observation']) < 600: obs.append(t['observation'])
    f, sc = [], []
    for o in obs[:12]:
      ids = tok.encode(o)
      toks = jnp.asarray([ids + ids], jnp.int32)
      lp = jax.nn.log_softmax(m(toks).logits.astype(jnp.float32), -1)
      nll = -jnp.take_along_axis(lp[:, :-1], toks[:, 1:, None], -1)[0, :, 0]
      n = len(ids)
      f.append(float(nll[:n-1].mean())); sc.append(float(nll[n:].mean()))
    res[dom] = (round(float(np.mean(f)), 3), round(float(np.mean(sc)), 3))
  print(path, "first/second copy NLL", res)
