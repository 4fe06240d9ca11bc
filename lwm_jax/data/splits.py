"""Corpus splits by world, and the table that shows whether a held-out split is really unseen.

A world is everything an environment's seed decided before the first action (files, database rows,
documents, settings); the environment recorder writes its id to `meta["world"]`. Train, validation
and test are drawn from a hash of that id (80/10/10), so every episode of one world lands in one
split and no test world is seen in training (docs/recipe.md, "Data hygiene").

`split_table` measures a split corpus per domain: trajectories and distinct worlds per split, test
worlds also present in train, and test trajectories whose action sequence equals a train one. For a
corpus recorded before world ids existed it can stand in the initial-state text for the world; that
key is labelled as such wherever it is printed, never passed off as a world id.
"""
from __future__ import annotations

import collections
import glob
import hashlib
import os
from typing import Iterable, Sequence

from lwm_jax.data.hygiene import action_digest
from lwm_jax.data.schema import Trajectory, read_jsonl

SPLITS = ("train", "validation", "test")
WORLD_KEY = "world"
STAND_IN_LABEL = "initial-state text (stand-in: no world id recorded)"


class MissingWorldError(ValueError):
  """Trajectories without `meta["world"]` where a world id is required."""


def split_files(folder: str, split: str) -> list[str]:
  """The files of one split of a corpus folder (`DOMAIN_{split}.jsonl.gz`), in name order."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r} (one of {', '.join(SPLITS)})")
  return sorted(glob.glob(os.path.join(folder, f"*_{split}.jsonl.gz")))


def read_split(folder: str, split: str) -> list[Trajectory]:
  """Every trajectory of one split of a corpus folder, file by file in name order."""
  return [t for p in split_files(folder, split) for t in read_jsonl(p)]


def world_of(traj: Trajectory) -> str | None:
  """The recorded world id, or None when the trajectory has none."""
  w = traj.meta.get(WORLD_KEY)
  return w if isinstance(w, str) and w else None


def stand_in_world(traj: Trajectory) -> str:
  """A key for trajectories without a world id: a hash of the domain and initial-state text."""
  h = hashlib.sha256(f"{traj.domain}\x1f{traj.initial_state}".encode()).hexdigest()[:12]
  return f"initial-state:{h}"


def require_worlds(trajs: Sequence[Trajectory], where: str) -> list[str]:
  """The world id of every trajectory; raises MissingWorldError counting those without one."""
  missing = [t.id for t in trajs if world_of(t) is None]
  if missing:
    raise MissingWorldError(
        f"{where}: {len(missing)} of {len(trajs)} trajectories have no meta['{WORLD_KEY}'] "
        f"(first: {', '.join(missing[:3])}); splits are drawn by world, so every environment "
        "must record its generated world (Env._set_world in reset)")
  return [world_of(t) for t in trajs]  # type: ignore[misc]


def split_of_world(world: str) -> str:
  """train (8 in 10), validation (1 in 10) or test (1 in 10), from a hash of the world id."""
  h = int(hashlib.sha256(world.encode()).hexdigest()[:8], 16) % 10
  return "test" if h == 0 else "validation" if h == 1 else "train"


def split_table(items: Iterable[tuple[Trajectory, str]], stand_in: bool = False) -> dict:
  """Per-domain split statistics of (trajectory, split) pairs.

  With `stand_in`, trajectories without a world id are keyed by `stand_in_world` (counted under
  `missing_world`); without it they raise MissingWorldError. Returns {domain: row} where row has
  `trajectories` and `worlds` (per split), `missing_world`, `test_worlds_in_train` (distinct test
  worlds also in train), `test_trajectories_world_in_train` and `test_actions_in_train` (test
  trajectories whose action sequence equals a train one).
  """
  trajs: dict[str, dict[str, list[Trajectory]]] = collections.defaultdict(
      lambda: {s: [] for s in SPLITS})
  missing: collections.Counter = collections.Counter()
  keys: dict[int, str] = {}
  for t, split in items:
    if split not in SPLITS:
      raise ValueError(f"trajectory {t.id}: unknown split '{split}' (expected {SPLITS})")
    w = world_of(t)
    if w is None:
      if not stand_in:
        raise MissingWorldError(f"trajectory {t.id} ({t.domain}, {split}) has no "
                                f"meta['{WORLD_KEY}']")
      missing[t.domain] += 1
      w = stand_in_world(t)
    keys[id(t)] = w
    trajs[t.domain][split].append(t)
  table = {}
  for dom in sorted(trajs):
    by = trajs[dom]
    worlds = {s: {keys[id(t)] for t in by[s]} for s in SPLITS}
    train_actions = {action_digest(t) for t in by["train"]}
    table[dom] = {
        "trajectories": {s: len(by[s]) for s in SPLITS},
        "worlds": {s: len(worlds[s]) for s in SPLITS},
        "missing_world": missing[dom],
        "test_worlds_in_train": len(worlds["test"] & worlds["train"]),
        "test_trajectories_world_in_train": sum(keys[id(t)] in worlds["train"]
                                                for t in by["test"]),
        "test_actions_in_train": sum(action_digest(t) in train_actions for t in by["test"]),
    }
  return table


def format_table(table: dict, world_label: str = "worlds") -> str:
  """The table as aligned text, one line per domain; `world_label` names the world key."""
  head = ["domain", "trajectories tr/va/te", f"{world_label} tr/va/te", "test worlds in train",
          "test traj. whose world is in train", "test action seqs = a train one"]
  rows = [head]
  for dom, r in table.items():
    n, w = r["trajectories"], r["worlds"]
    rows.append([dom, "/".join(str(n[s]) for s in SPLITS), "/".join(str(w[s]) for s in SPLITS),
                 str(r["test_worlds_in_train"]),
                 f"{r['test_trajectories_world_in_train']} of {n['test']}",
                 f"{r['test_actions_in_train']} of {n['test']}"])
  widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
  return "\n".join(" | ".join(c.ljust(wd) if i == 0 else c.rjust(wd)
                               for i, (c, wd) in enumerate(zip(row, widths))).rstrip()
                    for row in rows)
