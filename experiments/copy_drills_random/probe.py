"""In-context copy probe over a run's kept checkpoints: mean next-token NLL of the first and the
second copy of (a) held-out observations (200-600 characters, 12 per domain, test split) and
(b) fresh random-piece strings (seed 99, never trained on), each written twice. A model that
copies scores the second copy far lower than the first. (c) "random, gap G": the same random
strings with G pieces of held-out terminal observations between the two copies (a simulation
instruction can sit that far before the observation that should follow it).

  python experiments/copy_drills_random/probe.py RUN_WORKDIR_OR_MODEL_DIR [MORE]
"""
import gzip, json, os, sys
import numpy as np, jax.numpy as jnp
from pilot import random_drills, TOKENIZER
from lwm_jax import checkpoints
from lwm_jax.train.losses import token_logprobs


def token_nll(model, ids):
  """Next-token NLL of every position of the token list `ids` but the first, as a numpy array."""
  toks = jnp.asarray([ids], jnp.int32)
  return -np.asarray(token_logprobs(model(toks).logits[:, :-1], toks[:, 1:])[0][0])


def pair_nll(model, ids):
  nll = token_nll(model, ids + ids)
  n = len(ids)
  return float(nll[:n - 1].mean()), float(nll[n:].mean())


def gap_nll(model, ids, filler):
  """Mean NLL of the second copy of `ids` written after `ids` and `filler`."""
  return float(token_nll(model, ids + filler + ids)[len(ids) + len(filler):].mean())


def probe(path, tok_path=TOKENIZER, gaps=(500, 1000)):
  model, tok = checkpoints.load(path, tokenizer=tok_path)
  res = {}
  for dom in ("terminal", "mcp", "web"):
    obs = []
    for line in gzip.open(f"data/corpus/{dom}_test.jsonl.gz", "rt"):
      for t in json.loads(line)["turns"]:
        if 200 < len(t["observation"]) < 600:
          obs.append(t["observation"])
    pairs = [pair_nll(model, tok.encode(o)) for o in obs[:12]]
    res[dom] = [round(float(np.mean([p[i] for p in pairs])), 3) for i in (0, 1)]
  strings = [tok.encode(d.text.split("\n\n")[0])[:120] for d in random_drills(12, seed=99)]
  pairs = [pair_nll(model, ids) for ids in strings]
  res["random"] = [round(float(np.mean([p[i] for p in pairs])), 3) for i in (0, 1)]
  filler = []
  for line in gzip.open("data/corpus/terminal_test.jsonl.gz", "rt"):
    filler += [i for t in json.loads(line)["turns"] for i in tok.encode(t["observation"])]
    if len(filler) >= max(gaps, default=0):
      break
  for g in gaps:
    res[f"random, gap {g}"] = round(float(np.mean([gap_nll(model, ids, filler[:g])
                                                   for ids in strings])), 3)
  return res


if __name__ == "__main__":
  for arg in sys.argv[1:]:
    paths = [arg]
    cpt = os.path.join(arg, "cpt")
    if os.path.isdir(cpt):
      paths = checkpoints.step_dirs(cpt)
    for p in paths:
      print(json.dumps({"model": p, "first/second copy NLL": probe(p)}), flush=True)
