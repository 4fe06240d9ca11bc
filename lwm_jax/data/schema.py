"""The trajectory record shared by every domain, and JSONL input/output.

A trajectory is one episode of an agent in an environment: the static description of the world
(task, action space, initial state, optional demonstrations and simulation instruction) and the
sequence of (action, observation) turns. A Language World Model learns to predict each observation
from everything before it.
"""
from __future__ import annotations

import collections
import dataclasses
import gzip
import io
import json
import os
from typing import Any, Callable, Iterable, Iterator

DOMAINS = ("mcp", "search", "terminal", "swe", "android", "web", "os")
TEXT_DOMAINS = ("mcp", "search", "terminal", "swe")
GUI_DOMAINS = ("android", "web", "os")


class RecordError(ValueError):
  """A record that does not fit the schema; `reason` is a short key used for counting."""

  def __init__(self, message: str, reason: str):
    super().__init__(message)
    self.reason = reason


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
    """Builds a trajectory from a plain dict; raises RecordError naming the first bad field."""
    if not isinstance(d, dict):
      raise RecordError(f"record is a {type(d).__name__}, expected a JSON object", "not_object")
    for field in ("id", "domain", "task", "action_space", "initial_state", "turns"):
      if field not in d:
        raise RecordError(f"missing field '{field}'", "missing_field")
    for field in ("id", "domain", "task", "action_space", "initial_state"):
      if not isinstance(d[field], str):
        raise RecordError(
            f"field '{field}' must be a string, got {type(d[field]).__name__}", "bad_type")
    if d["domain"] not in DOMAINS:
      raise RecordError(
          f"unknown domain '{d['domain']}' (expected one of {', '.join(DOMAINS)})",
          "unknown_domain")
    turns = d["turns"]
    if not isinstance(turns, list):
      raise RecordError("field 'turns' must be a non-empty list", "bad_type")
    if not turns:
      raise RecordError("field 'turns' must be a non-empty list", "empty_turns")
    parsed = []
    for i, t in enumerate(turns):
      if not isinstance(t, dict) or not isinstance(t.get("action"), str) or not isinstance(
          t.get("observation"), str):
        raise RecordError(
            f"turns[{i}] must be an object with string 'action' and 'observation'", "bad_turn")
      parsed.append(Turn(t["action"], t["observation"]))
    for field in ("demonstrations", "simulation_instruction"):
      if field in d and not isinstance(d[field], str):
        raise RecordError(f"field '{field}' must be a string", "bad_type")
    meta = d.get("meta", {})
    if not isinstance(meta, dict):
      raise RecordError("field 'meta' must be an object", "bad_type")
    return cls(
        id=d["id"], domain=d["domain"], task=d["task"], action_space=d["action_space"],
        initial_state=d["initial_state"], turns=parsed,
        demonstrations=d.get("demonstrations", ""),
        simulation_instruction=d.get("simulation_instruction", ""), meta=meta)


def _open_text(path: str | os.PathLike, mode: str) -> io.TextIOBase:
  path = os.fspath(path)
  if path.endswith(".gz"):
    if mode == "w":  # mtime 0: the same records give the same bytes
      return io.TextIOWrapper(gzip.GzipFile(path, "wb", mtime=0), encoding="utf-8")
    return gzip.open(path, mode + "t", encoding="utf-8")
  return open(path, mode, encoding="utf-8")


def read_jsonl(path: str | os.PathLike) -> Iterator[Trajectory]:
  """Reads trajectories strictly: the first bad line raises `ValueError('path:line: why')`."""
  for _, traj in iter_records(path, Trajectory.from_dict, mode="strict"):
    yield traj


@dataclasses.dataclass
class LoadReport:
  """What a load kept and what it set aside, by reason."""
  path: str
  loaded: int = 0
  bad: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  quarantine: str | None = None

  @property
  def num_bad(self) -> int:
    return sum(self.bad.values())

  def summary(self) -> str:
    parts = ", ".join(f"{k}={v}" for k, v in sorted(self.bad.items())) or "none"
    q = f" (quarantined to {self.quarantine})" if self.quarantine and self.num_bad else ""
    return f"{self.path}: loaded {self.loaded}, bad {self.num_bad} [{parts}]{q}"


def iter_records(path: str | os.PathLike, parse: Callable[[Any], Any], mode: str = "strict",
                 report: LoadReport | None = None,
                 quarantine: str | os.PathLike | None = None) -> Iterator[tuple[int, Any]]:
  """Yields (line number, parse(json)) for each non-blank line.

  mode='strict' raises `ValueError('path:line: why')` at the first bad line. mode='skip' counts
  each bad line under its reason in `report.bad` and, when `quarantine` is given, appends a JSON
  line {path, line, reason, error, text} there. `parse` raises ValueError (RecordError to name a
  reason) for a record it rejects.
  """
  if mode not in ("strict", "skip"):
    raise ValueError(f"mode must be 'strict' or 'skip', got '{mode}'")
  name = os.fspath(path)
  qf = None
  try:
    with _open_text(path, "r") as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          obj = json.loads(line)
        except json.JSONDecodeError as e:
          err: ValueError = RecordError(f"bad JSON: {e}", "bad_json")
        else:
          try:
            item = parse(obj)
          except ValueError as e:
            err = e
          else:
            if report is not None:
              report.loaded += 1
            yield lineno, item
            continue
        if mode == "strict":
          raise ValueError(f"{name}:{lineno}: {err}") from None
        reason = getattr(err, "reason", "invalid")
        if report is not None:
          report.bad[reason] += 1
        if quarantine is not None:
          if qf is None:
            qf = _open_text(quarantine, "w")
          qf.write(json.dumps({"path": name, "line": lineno, "reason": reason, "error": str(err),
                               "text": line.rstrip("\n")}, ensure_ascii=False) + "\n")
  finally:
    if qf is not None:
      qf.close()


def load_jsonl(path: str | os.PathLike, mode: str = "strict",
               quarantine: str | os.PathLike | None = None) -> tuple[list[Trajectory], LoadReport]:
  """Loads all trajectories of a JSONL(.gz) file; see `iter_records` for the modes."""
  report = LoadReport(path=os.fspath(path),
                      quarantine=os.fspath(quarantine) if quarantine is not None else None)
  trajs = [t for _, t in iter_records(path, Trajectory.from_dict, mode, report, quarantine)]
  return trajs, report


def write_jsonl(path: str | os.PathLike, trajectories: Iterable[Trajectory]) -> int:
  """Writes trajectories one per line (gzip when the name ends in .gz); returns the count."""
  n = 0
  with _open_text(path, "w") as f:
    for t in trajectories:
      f.write(json.dumps(t.to_dict(), ensure_ascii=False, sort_keys=False) + "\n")
      n += 1
  return n
