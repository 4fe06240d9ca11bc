"""lwm_jax: train, serve and evaluate Language World Models for AI agents in JAX.

Packages from the bottom up, with what each may import from the others:
  domains   the domain records and their registry (imports nothing of ours)
  data      trajectories, prompts, the reply format, tokenizers, input pipelines
  envs      real environments, one folder per domain (imports data)
  model     the MoE transformer (sharding.py only); `hf.py` sits beside it
  train     CPT, SFT and GSPO training (model, data)
  sampling  decoding, the server and model backends (model, data; never train)
  judge.py  the five-dimension judge on plain inputs (data)
  eval, sim, rl   benchmark evaluation, the world model as an environment, RL (see each)
See docs/architecture.md for the map and what flows between the packages.
"""

__version__ = "0.1.0"

import os as _os


def child_pythonpath() -> str:
  """PYTHONPATH for a child Python process that must import this same copy of lwm_jax (an
  environment's tool server, an index builder): its folder first, then the caller's PYTHONPATH."""
  root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
  return _os.pathsep.join(p for p in (root, _os.environ.get("PYTHONPATH", "")) if p)
