"""The trajectory record shared by every domain, and JSONL input/output.

A trajectory is one episode of an agent in an environment: the static description of the world
(task, action space, initial state, optional demonstrations and simulation instruction) and the
sequence of (action, observation) turns. A Language World Model learns to predict each observation
from everything before it.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Iterable, Iterator

from lwm_jax import domains as domains_lib
from lwm_jax.data import jsonl

# The domains are the registry's (`lwm_jax.domains`): a record's `domain` must be registered.


class RecordError(ValueError):
  """A record that does not fit the schema; `reason` is a short key used for counting."""

  def __init__(self, message: str, reason: str):
    super().__init__(message)
    self.reason = reason


@dataclasses.dataclass
class Turn:
  """One step of an episode. `env`, when present, is what the real environment itself reported
  about the step at collection time (`lwm_jax.envs.recorder`): `{"error": reason or "",
  "changed": bool}`, "changed" only where the environment can tell whether its state changed.
  It is a fact about the episode, not text a model sees, and two turns with the same action and
  observation are equal whatever it holds."""
  action: str
  observation: str
  env: dict[str, Any] | None = dataclasses.field(default=None, compare=False)

  def to_dict(self) -> dict[str, Any]:
    out: dict[str, Any] = {"action": self.action, "observation": self.observation}
    if self.env is not None:
      out["env"] = self.env
    return out


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
    if not domains_lib.is_domain(d["domain"]):
      raise RecordError(
          f"unknown domain '{d['domain']}' (expected one of {', '.join(domains_lib.names())})",
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
      facts = t.get("env")
      if facts is not None and not isinstance(facts, dict):
        raise RecordError(f"turns[{i}].env must be an object", "bad_turn")
      parsed.append(Turn(t["action"], t["observation"], facts))
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


_open_text = jsonl.open_text


def quarantine_path(quarantine_dir: str | os.PathLike, input_path: str | os.PathLike) -> str:
  """Where bad records of `input_path` go: its basename plus a digest of its absolute path, so
  inputs of the same name in different folders never share (or overwrite) one file."""
  full = os.path.abspath(os.fspath(input_path))
  digest = hashlib.blake2b(full.encode("utf-8", "surrogateescape"), digest_size=4).hexdigest()
  return os.path.join(os.fspath(quarantine_dir),
                      f"{os.path.basename(full)}.{digest}.quarantine.jsonl")


def read_jsonl(path: str | os.PathLike) -> Iterator[Trajectory]:
  """Reads trajectories strictly: the first bad line raises `ValueError('path:line: why')`."""
  for _, traj in iter_records(path, Trajectory.from_dict, mode="strict"):
    yield traj


MAX_EXAMPLES = 5  # bad lines a LoadReport names one by one


@dataclasses.dataclass
class LoadReport:
  """What a load kept and what it set aside, by reason."""
  path: str
  loaded: int = 0
  bad: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  quarantine: str | None = None
  examples: list[str] = dataclasses.field(default_factory=list)  # first bad lines, "path:line: why"

  @property
  def num_bad(self) -> int:
    return sum(self.bad.values())

  def summary(self) -> str:
    parts = ", ".join(f"{k}={v}" for k, v in sorted(self.bad.items())) or "none"
    q = f" (quarantined to {self.quarantine})" if self.quarantine and self.num_bad else ""
    lines = [f"{self.path}: loaded {self.loaded}, bad {self.num_bad} [{parts}]{q}"]
    lines += [f"  skipped {e}" for e in self.examples]
    if self.num_bad > len(self.examples):
      lines.append(f"  ... and {self.num_bad - len(self.examples)} more bad lines")
    return "\n".join(lines)


def iter_records(path: str | os.PathLike, parse: Callable[[Any], Any], mode: str = "strict",
                 report: LoadReport | None = None,
                 quarantine: str | os.PathLike | None = None,
                 byte_range: tuple[int, int | None, int] | None = None,
                 quarantine_sink: Callable[[int, str], None] | None = None
                 ) -> Iterator[tuple[int, Any]]:
  """Yields (line number, parse(json)) for each non-blank line.

  mode='strict' raises `ValueError('path:line: why')` at the first bad line. mode='skip' counts
  each bad line under its reason in `report.bad` and, when `quarantine` is given, appends a JSON
  line {path, line, reason, error, text} there (the file is opened for appending: it never loses
  what an earlier load put there). `parse` raises ValueError (RecordError to name a reason) for a
  record it rejects. Unreadable bytes, bad JSON and broken gzip are `jsonl.iter_jsonl`'s cases:
  in skip mode a broken gzip keeps every record before the break and counts `truncated_file`.
  `byte_range` reads part of a plain file (`jsonl.iter_jsonl`). `quarantine_sink(line, text)`,
  when given, receives each quarantine line (without its newline) instead of `quarantine`'s file:
  a distributed build gathers them and writes each input's quarantine file in line order.
  """
  if mode not in ("strict", "skip"):
    raise ValueError(f"mode must be 'strict' or 'skip', got '{mode}'")
  name = os.fspath(path)
  qf = None
  try:
    for lineno, value in jsonl.iter_jsonl(path, strict=False, allow_nan=False,
                                          byte_range=byte_range):
      text = ""
      if isinstance(value, jsonl.BadLine):
        err: ValueError = value
        text = value.text
      else:
        try:
          item = parse(value)
        except ValueError as e:
          err = e
          text = json.dumps(value, ensure_ascii=False)
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
        if len(report.examples) < MAX_EXAMPLES:
          report.examples.append(f"{name}:{lineno}: {err}")
      if quarantine_sink is not None:
        quarantine_sink(lineno, json.dumps({"path": name, "line": lineno, "reason": reason,
                                            "error": str(err), "text": text}, ensure_ascii=True))
      elif quarantine is not None:
        if qf is None:
          os.makedirs(os.path.dirname(os.path.abspath(os.fspath(quarantine))), exist_ok=True)
          qf = _open_text(quarantine, "a")
        qf.write(json.dumps({"path": name, "line": lineno, "reason": reason, "error": str(err),
                             "text": text}, ensure_ascii=True) + "\n")
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
