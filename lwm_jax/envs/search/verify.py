"""The search domain's task verifiers (the record's `verifier` and `transcript_verifier`).

`check(env, goal, turns)` judges a finished episode on the real environment's state;
`check_transcript(env, goal, turns)` judges it from the transcript alone, with `env` only reset to
the episode's world. What each checks is listed in `lwm_jax/envs/verify.py` and
`lwm_jax/envs/verify_transcript.py`, which dispatch to these through the domain registry.
"""
from __future__ import annotations

import re
from typing import Any

from lwm_jax.envs import verify as V
from lwm_jax.envs.verify import Turns, Verdict, _v


def _check_search_turns(g: dict[str, Any], turns: Turns) -> Verdict:
  target = g["target"]
  if any(o.startswith(f"[{target}] page ") for _, o in turns):
    return _v(True, 1, f"opened the target document {target}")
  listed = any(re.search(rf"^\d+\. \[{re.escape(target)}\]", o, re.M) for _, o in turns)
  return _v(False, 0.5 if listed else 0,
            f"target {target} {'listed in results but never opened' if listed else 'never found'}")


def check(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  return _check_search_turns(g, turns)


# -- web ------------------------------------------------------------------------------------------


def check_transcript(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  return _check_search_turns(g, turns)
