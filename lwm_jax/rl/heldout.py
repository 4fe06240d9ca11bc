"""Held-out evaluation of the policy during RL: greedy replies to fixed held-out prompts, scored
judge-free (and with the run's reward mix, which includes the judge when one is configured).

The prompts are those of an RL pool built from held-out trajectories (the test split, or the
mini benchmark's source trajectories), at most `limit` of them, evenly spaced so every domain
keeps its share. Metrics (`evaluate`): the reward mix's mean total and components, the mean
token F1, edit similarity and exact match of the sanitized prediction against the real
observation (as `lwm_jax.textsim` computes them for the benchmark), the share of replies
that parse as one observation block, the mean reply length, and token F1 per domain.
"""
from __future__ import annotations

import collections
from typing import Any

import numpy as np

from lwm_jax import textsim
from lwm_jax.rl import guard
from lwm_jax.rl.pool import PoolItem, RlPool
from lwm_jax.rl.rewards import MixedReward, RewardInput, prediction_of, reply_parses
from lwm_jax.sampling.params import SamplingParams


def spread(items: list, limit: int) -> list:
  """At most `limit` items, evenly spaced over the list (all of them when limit <= 0)."""
  if limit <= 0 or len(items) <= limit:
    return list(items)
  idx = np.linspace(0, len(items) - 1, limit).round().astype(int)
  return [items[i] for i in sorted(set(idx.tolist()))]


def similarity(domain: str, reply: str, reference: str) -> dict[str, float]:
  """Token F1 / edit similarity / exact match of a reply's sanitized prediction."""
  pred, _ = prediction_of(domain, reply)
  ref = guard.classify(domain, reference).clean
  return textsim.free_metrics(textsim.normalise(pred), textsim.normalise(ref))


class HeldOut:
  """Greedy evaluation on fixed held-out prompts (see the module docstring)."""

  def __init__(self, pool: RlPool, limit: int = 64, max_new_tokens: int = 256):
    self.items: list[PoolItem] = spread(pool.items, limit)
    if not self.items:
      raise ValueError("held-out evaluation: no prompt fits the token limit")
    self.max_new_tokens = max_new_tokens

  def evaluate(self, sampler: Any, reward: MixedReward) -> tuple[dict[str, float], list[dict]]:
    """(metrics, one row per prompt: id, domain, reply, reward, token_f1)."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
    gens = sampler.generate([it.prompt_ids for it in self.items], greedy)
    inputs = [RewardInput(it.domain, it.context, it.action, g.text, it.reference,
                          it.meta)
              for it, g in zip(self.items, gens)]
    scores = reward.score(inputs)
    rows, per_domain = [], collections.defaultdict(list)
    for it, g, s in zip(self.items, gens, scores):
      sim = similarity(it.domain, g.text, it.reference)
      per_domain[it.domain].append(sim["token_f1"])
      rows.append({"id": it.id, "domain": it.domain, "reply": g.text, "reward": s["total"],
                   "valid": s.get("valid", True), "failures": s.get("failures", {}),
                   "components": s["components"], "parses": reply_parses(g.text),
                   "tokens": len(g.token_ids), **sim})
    # a failed judgement is excluded from the means and counted (never scored 0)
    m = {"reward_mean": _mean([r["reward"] for r in rows]),
         "invalid_rewards": float(sum(not r["valid"] for r in rows)),
         "token_f1": float(np.mean([r["token_f1"] for r in rows])),
         "edit_sim": float(np.mean([r["edit_sim"] for r in rows])),
         "exact": float(np.mean([r["exact"] for r in rows])),
         "parses": float(np.mean([r["parses"] for r in rows])),
         "response_len": float(np.mean([r["tokens"] for r in rows])),
         "prompts": float(len(rows))}
    for k in reward.weights:
      m[f"reward_{k}"] = _mean([r["components"][k] for r in rows])
    for d, v in sorted(per_domain.items()):
      m[f"token_f1_{d}"] = float(np.mean(v))
    return m, rows


def _mean(xs) -> float:
  ok = [x for x in xs if np.isfinite(x)]
  return float(np.mean(ok)) if ok else float("nan")
