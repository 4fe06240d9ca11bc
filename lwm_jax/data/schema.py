"""The trajectory record shared by every domain, and JSONL input/output.

A trajectory is one episode of an agent in an environment: the static description of the world
(task, action space, initial state, optional demonstrations and simulation instruction) and the
sequence of (action, observation) turns. A Language World Model learns to predict each observation
from everything before it.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
from typing import Any, Iterable, Iterator

DOMAINS = ("mcp", "search", "terminal", "swe", "android", "web", "os")
TEXT_DOMAINS = ("mcp", "search", "terminal", "swe")
GUI_DOMAINS = ("android", "web", "os")


@dataclasses.dataclass
class Turn:
  action: str
  observation: str

  def to_dict(self) -> dict[str, Any]:
    return {"action": self.action, "observation": self.observation}


@dataclasses.dataclass
class Trajectory:
  id: str
  domain: str
  task: str
  action_space: str
  initial_state: str
  turns: list[Turn]
  demonstrations: str = ""
  simulation_instruction: str = ""
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict[str, Any]:
    return {
        "id": self.id,
        "domain": self.domain,
        "task": self.task,
        "action_space": self.action_space,
        "initial_state": self.initial_state,
        "demonstrations": self.demonstrations,
        "simulation_instruction": self.simulation_instruction,
        "turns": [t.to_dict() for t in self.turns],
        "meta": self.meta,
    }

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
    """Builds a trajectory from a plain dict; raises ValueError naming the first bad field."""
    if not isinstance(d, dict):
      raise ValueError(f"record is a {type(d).__name__}, expected a JSON object")
    for field in ("id", "domain", "task", "action_space", "initial_state", "turns"):
      if field not in d:
        raise ValueError(f"missing field '{field}'")
    for field in ("id", "domain", "task", "action_space", "initial_state"):
      if not isinstance(d[field], str):
        raise ValueError(f"field '{field}' must be a string, got {type(d[field]).__name__}")
    if d["domain"] not in DOMAINS:
      raise ValueError(f"unknown domain '{d['domain']}' (expected one of {', '.join(DOMAINS)})")
    turns = d["turns"]
    if not isinstance(turns, list) or not turns:
      raise ValueError("field 'turns' must be a non-empty list")
    parsed = []
    for i, t in enumerate(turns):
      if not isinstance(t, dict) or not isinstance(t.get("action"), str) or not isinstance(
          t.get("observation"), str):
        raise ValueError(f"turns[{i}] must be an object with string 'action' and 'observation'")
      parsed.append(Turn(t["action"], t["observation"]))
    for field in ("demonstrations", "simulation_instruction"):
      if field in d and not isinstance(d[field], str):
        raise ValueError(f"field '{field}' must be a string")
    meta = d.get("meta", {})
    if not isinstance(meta, dict):
      raise ValueError("field 'meta' must be an object")
    return cls(
        id=d["id"], domain=d["domain"], task=d["task"], action_space=d["action_space"],
        initial_state=d["initial_state"], turns=parsed,
        demonstrations=d.get("demonstrations", ""),
        simulation_instruction=d.get("simulation_instruction", ""), meta=meta)


def _open_text(path: str | os.PathLike, mode: str) -> io.TextIOBase:
  path = os.fspath(path)
  if path.endswith(".gz"):
    return gzip.open(path, mode + "t", encoding="utf-8")
  return open(path, mode, encoding="utf-8")


def read_jsonl(path: str | os.PathLike) -> Iterator[Trajectory]:
  """Reads trajectories strictly: the first bad line raises `ValueError('path:line: why')`."""
  with _open_text(path, "r") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        yield Trajectory.from_dict(json.loads(line))
      except (json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"{os.fspath(path)}:{lineno}: {e}") from None


def write_jsonl(path: str | os.PathLike, trajectories: Iterable[Trajectory]) -> int:
  """Writes trajectories one per line (gzip when the name ends in .gz); returns the count."""
  n = 0
  with _open_text(path, "w") as f:
    for t in trajectories:
      f.write(json.dumps(t.to_dict(), ensure_ascii=False, sort_keys=False) + "\n")
      n += 1
  return n
