"""The RL prompt pool, and the split of trajectories into disjoint CPT / SFT / RL pools.

`split_pools(trajectories, {"cpt": 0.6, "sft": 0.3, "rl": 0.1}, seed)` assigns every trajectory to
one pool by a hash of its id (and the seed), so the split is deterministic, needs no shared state
between processes, and a trajectory's turns never appear in two stages: RL never sees a turn
that SFT trained on.

`build_pool` turns the RL share into prompts: one target turn per trajectory (the same seeded
choice as the data pipeline's), the system prompt in variant v0, the history up to that turn's
action, rendered with the chat template and the assistant generation header. A prompt longer than
`max_prompt_tokens` is dropped and counted, never cut: a cut history would ask the policy to
predict an observation from a context that lacks what determines it. See docs/recipe.md.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Any, Mapping, Sequence

import numpy as np

from lwm_jax.data import prompts
from lwm_jax.data.pipeline import target_turn
from lwm_jax.data.schema import Trajectory

POOLS = ("cpt", "sft", "rl")


def _unit(seed: int, key: str) -> float:
  """A uniform number in [0, 1) fixed by (seed, key)."""
  h = hashlib.blake2b(f"{seed}\x1fpool\x1f{key}".encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(h, "big") / 2.0 ** 64


def check_fractions(fractions: Mapping[str, float]) -> dict[str, float]:
  unknown = sorted(set(fractions) - set(POOLS))
  if unknown:
    raise ValueError(f"pool fractions: unknown pool(s) {', '.join(unknown)} "
                     f"(known: {', '.join(POOLS)})")
  fr = {k: float(fractions.get(k, 0.0)) for k in POOLS}
  if any(v < 0 for v in fr.values()) or abs(sum(fr.values()) - 1.0) > 1e-6:
    raise ValueError(f"pool fractions must be >= 0 and sum to 1, got {fr}")
  return fr


def pool_of(traj_id: str, fractions: Mapping[str, float], seed: int = 0) -> str:
  """The pool of one trajectory id."""
  fr = check_fractions(fractions)
  u, acc = _unit(seed, traj_id), 0.0
  for name in POOLS:
    acc += fr[name]
    if u < acc:
      return name
  return [k for k in POOLS if fr[k] > 0][-1]  # u within rounding of 1


def split_pools(trajectories: Sequence[Trajectory], fractions: Mapping[str, float],
                seed: int = 0) -> dict[str, list[Trajectory]]:
  """`{pool: trajectories}`, disjoint, in input order. Trajectories sharing an id share a pool."""
  fr = check_fractions(fractions)
  out: dict[str, list[Trajectory]] = {k: [] for k in POOLS}
  for t in trajectories:
    out[pool_of(t.id, fr, seed)].append(t)
  return out


@dataclasses.dataclass
class PoolItem:
  """One RL prompt: the target turn of a trajectory and what its reward needs."""
  id: str
  domain: str
  turn: int
  messages: list[dict[str, str]]
  prompt_ids: list[int]
  context: list[tuple[str, str]]  # earlier (action, observation) pairs
  action: str
  reference: str                  # the real observation of the target turn
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # the trajectory's


@dataclasses.dataclass
class RlPool:
  items: list[PoolItem]
  stats: dict[str, Any]

  def __len__(self) -> int:
    return len(self.items)

  def summary(self) -> str:
    s = self.stats
    per = ", ".join(f"{d}={n}" for d, n in sorted(s["per_domain"].items()))
    return (f"RL pool: {s['kept']} prompts of {s['trajectories']} trajectories "
            f"({s['dropped_too_long']} dropped as longer than {s['max_prompt_tokens']} tokens); "
            f"{per}")


def build_pool(trajectories: Sequence[Trajectory], tokenizer: Any, max_prompt_tokens: int,
               seed: int = 0, variant: int | None = None) -> RlPool:
  """RL prompts of `trajectories` (see the module docstring). `variant` defaults to the RL
  stage's (v0)."""
  if max_prompt_tokens < 1:
    raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
  items: list[PoolItem] = []
  dropped: collections.Counter = collections.Counter()
  per_domain: collections.Counter = collections.Counter()
  for traj in trajectories:
    t = target_turn(traj, seed)
    v = prompts.variant_for("rl", traj.id, seed) if variant is None else variant
    msgs = prompts.prompt_messages(traj, t, v)
    ids = tokenizer.encode_chat(msgs, add_generation_prompt=True)
    if len(ids) > max_prompt_tokens:
      dropped[traj.domain] += 1
      continue
    per_domain[traj.domain] += 1
    items.append(PoolItem(
        id=traj.id, domain=traj.domain, turn=t, messages=msgs, prompt_ids=list(ids),
        context=[(x.action, x.observation) for x in traj.turns[:t]],
        action=traj.turns[t].action, reference=traj.turns[t].observation,
        meta=dict(traj.meta)))
  stats = {"trajectories": len(trajectories), "kept": len(items),
           "dropped_too_long": sum(dropped.values()), "dropped_per_domain": dict(dropped),
           "per_domain": dict(per_domain), "max_prompt_tokens": max_prompt_tokens}
  return RlPool(items, stats)


class PromptOrder:
  """An endless, seeded order over `n` prompts: a fresh permutation each epoch; this process
  takes every `process_count`-th slot. `get_state` / `set_state` resume exactly."""

  def __init__(self, n: int, seed: int = 0, shuffle: bool = True, process_index: int = 0,
               process_count: int = 1):
    if n < 1:
      raise ValueError("the RL pool is empty (no prompt fits the token limit?)")
    self.n, self.seed, self.shuffle = n, seed, shuffle
    self.process_index, self.process_count = process_index, process_count
    self.epoch, self.pos = 0, 0

  def _perm(self, epoch: int) -> np.ndarray:
    if not self.shuffle:
      return np.arange(self.n)
    return np.random.default_rng([self.seed, epoch]).permutation(self.n)

  def take(self, k: int) -> list[int]:
    """The next `k` prompt indices for this process."""
    out = []
    perm = self._perm(self.epoch)
    while len(out) < k:
      slot = self.pos * self.process_count + self.process_index
      if slot >= self.n:
        self.epoch, self.pos = self.epoch + 1, 0
        perm = self._perm(self.epoch)
        if self.process_index >= self.n:
          raise ValueError(f"process {self.process_index} has no prompt ({self.n} in the pool)")
        continue
      out.append(int(perm[slot]))
      self.pos += 1
    return out

  def get_state(self) -> dict[str, int]:
    return {"epoch": self.epoch, "pos": self.pos}

  def set_state(self, state: Mapping[str, int]) -> None:
    self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
