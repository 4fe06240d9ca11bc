"""Which worlds a range of seeds gives: a census over each domain's world generator.

Each bundled environment builds its episode's world (files, rows, documents, shop, phone,
desktop) from the episode seed alone (the `generate_world(seed)` its module exposes), and the recorder
names it by `base.world_id` (a hash of its canonical JSON). `census` generates the worlds of a
seed range and counts the distinct ids, so "how many different worlds do seeds 0..N give" has a
measured answer, and says for each top-level part of a world (e.g. `modules`, `documents`,
`customers`) how many different values it takes, i.e. what actually varies from seed to seed.
`python launch/data.py worlds --seeds=0:10000` prints it; docs/recipe.md records the
figures. Collection runs use seed `recorder.episode_seed(S, i)` for episode i of base seed S.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable

from lwm_jax.envs import base


def generate(domain: str, seed: int) -> Any:
  """The world of `domain` for `seed` as JSON-able data (what `base.world_id` hashes)."""
  world = base.generate_world(domain, seed)  # ValueError naming the domains for an unknown one
  return world.to_json() if hasattr(world, "to_json") else world  # swe: a Repo


@dataclasses.dataclass
class Census:
  domain: str
  seeds: int
  distinct: int                                  # different world ids among the seeds
  repeats: list[tuple[int, int]]                 # (seed, earlier seed of the same world), first 5
  parts: dict[str, int]                          # top-level key -> different values it took

  def line(self) -> str:
    varied = ", ".join(f"{k} {v}" for k, v in sorted(self.parts.items()))
    rep = (f"; repeats e.g. seed {self.repeats[0][0]} = seed {self.repeats[0][1]}"
           if self.repeats else "")
    return f"{self.domain}: {self.distinct} distinct worlds from {self.seeds} seeds{rep} " \
           f"(distinct values per part: {varied})"


def census(domain: str, seeds: Iterable[int]) -> Census:
  """Generates the world of every seed and counts distinct worlds and distinct part values."""
  first: dict[str, int] = {}
  repeats: list[tuple[int, int]] = []
  parts: dict[str, set[str]] = collections.defaultdict(set)
  n = 0
  for seed in seeds:
    n += 1
    world = generate(domain, seed)
    wid = base.world_id(domain, world)
    if wid in first:
      if len(repeats) < 5:
        repeats.append((seed, first[wid]))
    else:
      first[wid] = seed
    if isinstance(world, dict):
      for key, value in world.items():
        parts[key].add(base.canonical_digest(value, 16))
  return Census(domain, n, len(first), repeats, {k: len(v) for k, v in parts.items()})


def parse_seed_range(text: str) -> range:
  """'A:B' -> range(A, B) (B exclusive); a bad range is an error naming the flag."""
  try:
    lo, hi = (int(x) for x in text.split(":"))
  except ValueError:
    raise ValueError(f"--seeds: expected START:STOP (e.g. 0:1000), got '{text}'") from None
  if not 0 <= lo < hi:
    raise ValueError(f"--seeds: need 0 <= START < STOP, got '{text}'")
  return range(lo, hi)
