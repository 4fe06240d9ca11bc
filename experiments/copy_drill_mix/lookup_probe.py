"""Lookup probe: mean NLL of the paths (nothing to look up) and of the answers (`ls`, `ls DIR`,
`ls -R`, all found in the paths) of 40 held-out lookup drills (seed 99; training used seed 0).

  python experiments/copy_drill_mix/lookup_probe.py MODEL_DIR [MORE]
"""
import sys
import jax.numpy as jnp
import numpy as np
from lwm_jax import checkpoints
from lwm_jax.data.drills import lookup_drills
from lwm_jax.train.losses import token_logprobs


def token_nll(model, ids):
  """Next-token NLL of every position of `ids` but the first (as copy_drills_random/probe.py)."""
  toks = jnp.asarray([ids], jnp.int32)
  return -np.asarray(token_logprobs(model(toks).logits[:, :-1], toks[:, 1:])[0][0])


docs = lookup_drills(40, seed=99)
for path in sys.argv[1:]:
  model, tok = checkpoints.load(path, tokenizer=path + "/tokenizer.model")
  first, ans = [], []
  for d in docs:
    head, rest = d.text.split("\n\n", 1)
    h, r = tok.encode(head + "\n\n"), tok.encode(rest)
    nll = token_nll(model, h + r)
    first.append(nll[:len(h) - 1].mean()); ans.append(nll[len(h) - 1:].mean())
  print(path, "paths (nothing to look up) %.3f, answers %.3f" % (np.mean(first), np.mean(ans)),
        flush=True)
