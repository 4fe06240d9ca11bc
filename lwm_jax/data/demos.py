"""Worked demonstrations for the long system prompts, drawn from the training pool.

A `DemoPool` keeps, per domain, a few training trajectories rendered as worked examples (the task,
then numbered actions and the observations that followed). `pick(traj, k, seed)` returns up to `k`
examples of `traj`'s domain in an order fixed by (seed, trajectory id), never `traj` itself, so
a prompt never shows the trajectory it is evaluated on. Which trajectories enter the pool depends
only on their ids (the smallest hashes win), not on the order of the source.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

from lwm_jax.data.schema import Trajectory


def _hash(*parts: object) -> int:
  h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(h, "big")


def render_example(traj: Trajectory, max_chars: int) -> str | None:
  """The trajectory's first turns as a worked example of at most `max_chars` characters (whole
  turns only, at least two); None when even two turns do not fit."""
  task = traj.task.strip().splitlines()[0] if traj.task.strip() else "(no task given)"
  out = [f"Episode task: {task}"]
  size, shown = len(out[0]), 0
  for i, t in enumerate(traj.turns, 1):
    block = f"Action {i}:\n{t.action}\nObservation {i}:\n{t.observation}"
    if size + len(block) + 1 > max_chars:
      break
    out.append(block)
    size += len(block) + 1
    shown += 1
  if shown < min(2, len(traj.turns)):
    return None
  return "\n".join(out)


class DemoPool:
  """Worked examples per domain; see the module docstring."""

  def __init__(self, examples: dict[str, list[tuple[str, str]]]):
    self.examples = examples  # domain -> [(trajectory id, example text)]

  @classmethod
  def from_trajectories(cls, trajs: Iterable[Trajectory], per_domain: int = 8,
                        max_chars: int = 1500, seed: int = 0) -> "DemoPool":
    ranked: dict[str, list[tuple[int, Trajectory]]] = {}
    for t in trajs:
      ranked.setdefault(t.domain, []).append((_hash(seed, "demo", t.id), t))
    examples: dict[str, list[tuple[str, str]]] = {}
    for domain, items in ranked.items():
      items.sort(key=lambda x: x[0])
      chosen = []
      for _, t in items:
        text = render_example(t, max_chars)
        if text is not None:
          chosen.append((t.id, text))
        if len(chosen) == per_domain:
          break
      examples[domain] = chosen
    return cls(examples)

  @classmethod
  def from_source(cls, source: Sequence[Trajectory], per_domain: int = 8, max_reads: int = 4000,
                  **kw) -> "DemoPool":
    """A pool from a random-access source, reading at most `max_reads` evenly spaced items."""
    n = len(source)
    step = max(1, -(-n // max_reads))
    return cls.from_trajectories((source[i] for i in range(0, n, step)), per_domain, **kw)

  def pick(self, traj: Trajectory, k: int, seed: int = 0) -> list[str]:
    """Up to `k` examples of `traj.domain`, excluding `traj` itself (deterministic)."""
    cands = [(tid, text) for tid, text in self.examples.get(traj.domain, []) if tid != traj.id]
    cands.sort(key=lambda x: _hash(seed, "pick", traj.id, x[0]))
    return [text for _, text in cands[:k]]
