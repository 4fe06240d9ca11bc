"""Lookup probe: mean NLL of the paths (nothing to look up) and of the answers (`ls`, `ls DIR`,
`ls -R`, all found in the paths) of 40 held-out lookup drills (seed 99; training used seed 0).

  python experiments/copy_drill_mix/lookup_probe.py MODEL_DIR [MORE]
"""
import os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "copy_drills_random"))
from probe import token_nll
from lwm_jax import checkpoints
from lwm_jax.data.drills import lookup_drills
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
