"""Replay verification: run a trajectory's actions in the real environment and compare.

The bundled environments (`lwm_jax.envs`) are real programs and every bundled trajectory records
the seed of its episode (`meta["seed"]`, `meta["source"] = "lwm_jax.envs/<domain>"`). Resetting
the domain's environment with that seed and stepping the recorded actions reproduces the
episode, so the observation of a target turn can be computed instead of read from the record.

Checked on the bundled corpus (`replay_matches`, and tests/test_rl_replay.py): all seven
domains (terminal, swe, mcp, search, web, android, os) reproduce every recorded observation of
the sampled trajectories once volatile spans (clock times, dates, durations, long hex ids) are
masked, so for them the whole observation is deterministic ground truth.

`replay` reward: 25 when the reply parses, holds no foreign or meta text (as the rule reward
requires) and its prediction equals the replayed observation after masking volatile spans, else
0. A trajectory that cannot be replayed (another source, no seed, an unknown domain or an
environment error) is scored against its recorded observation instead; `details["replayed"]`
says which, and `ReplayReward.counts` counts both. Replays are cached per (domain, seed,
actions): the G replies of a group cost one replay.
"""
from __future__ import annotations

import collections
import logging
from typing import Any, Mapping, Sequence

from lwm_jax.rl.rewards import (MAX_REWARD, Reward, RewardInput, Score, mask_volatile,
                                prediction_of, register, reply_parses)

SOURCE_PREFIX = "lwm_jax.envs/"


def replayable(domain: str, meta: Mapping[str, Any] | None) -> bool:
  """True when `meta` names a bundled environment's episode of `domain` with its seed."""
  from lwm_jax import domains  # pylint: disable=import-outside-toplevel
  meta = meta or {}
  return (str(meta.get("source", "")) == SOURCE_PREFIX + domain and "seed" in meta
          and domains.is_domain(domain))


def _follow(env: Any, spec: str) -> None:
  """Sets the episode's recorded perturbation (`meta["perturb"]`, "" for none) on a reused env,
  so a perturbed episode misbehaves again exactly as recorded and a plain one does not."""
  if hasattr(env, "set_perturb"):
    env.set_perturb(spec or None)
  elif spec:
    raise ValueError(f"replay: the {type(env).__name__} environment cannot follow '{spec}'")


def replay_observation(domain: str, seed: int, actions: Sequence[str], env: Any = None,
                       perturb: str = "") -> str:
  """The observation the real environment prints for the last of `actions`, after resetting it
  with `seed` (under the episode's recorded `perturb` spec) and stepping the others. `env` (of
  `domain`) is reused when given."""
  from lwm_jax.envs import base  # pylint: disable=import-outside-toplevel
  if not actions:
    raise ValueError("replay: no action to replay")
  own = env is None
  env = env or base.make_env(domain)
  try:
    _follow(env, perturb)
    env.reset(int(seed))
    obs = ""
    for a in actions:
      obs = env.step(a)
    return obs
  finally:
    if own:
      env.close()


def replay_matches(trajectory: Any, env: Any = None) -> list[bool]:
  """For each turn of a bundled trajectory: does replaying its actions reproduce the recorded
  observation (volatile spans masked)?"""
  from lwm_jax.envs import base  # pylint: disable=import-outside-toplevel
  own = env is None
  env = env or base.make_env(trajectory.domain)
  try:
    _follow(env, str(trajectory.meta.get("perturb", "")))
    env.reset(int(trajectory.meta["seed"]))
    return [mask_volatile(env.step(t.action)) == mask_volatile(t.observation)
            for t in trajectory.turns]
  finally:
    if own:
      env.close()


@register("replay")
class ReplayReward(Reward):
  """Binary: the prediction equals what the real environment prints (see the module docstring)."""

  def __init__(self, **_: Any):
    self._cache: dict[tuple, str | None] = {}
    self._envs: dict[str, Any] = {}
    self.counts: collections.Counter = collections.Counter()

  def _truth(self, x: RewardInput) -> tuple[str, bool]:
    if not replayable(x.domain, x.meta):
      return x.reference, False
    actions = tuple(a for a, _ in x.context) + (x.action,)
    key = (x.domain, int(x.meta["seed"]), str(x.meta.get("perturb", "")), actions)
    if key not in self._cache:
      try:
        env = self._envs.get(x.domain)
        if env is None:
          from lwm_jax.envs import base  # pylint: disable=import-outside-toplevel
          env = self._envs[x.domain] = base.make_env(x.domain)
        self._cache[key] = replay_observation(x.domain, key[1], actions, env, perturb=key[2])
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("replay of a %s episode (seed %s) failed: %s: %s", x.domain, key[1],
                        type(e).__name__, e)
        self._cache[key] = None
    got = self._cache[key]
    return (x.reference, False) if got is None else (got, True)

  def score(self, inputs: Sequence[RewardInput]) -> list[Score]:
    out = []
    for x in inputs:
      truth, replayed = self._truth(x)
      self.counts["replayed" if replayed else "recorded"] += 1
      pred, c = prediction_of(x.domain, x.reply)
      same = mask_volatile(pred) == mask_volatile(truth)
      ok = reply_parses(x.reply) and c.ok and same
      out.append(Score(MAX_REWARD if ok else 0.0,
                       {"replayed": replayed, "matches": same, "clean": c.ok}))
    return out

  def close(self) -> None:
    for env in self._envs.values():
      env.close()
    self._envs.clear()
