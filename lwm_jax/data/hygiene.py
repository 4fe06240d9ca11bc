"""Data-hygiene filters (docs/recipe.md, "Data hygiene"): every drop is counted under its reason.

- a trajectory without a starting state is dropped: its `initial_state` (the state part of the
  system prompt: the sandbox's file listing, the first screen, the database summary) is blank and
  no imported system prompt (`meta["system_str"]`) carries one;
- an MCP/SWE trajectory that calls a tool it does not declare is dropped. Declared tools are
  `meta["declared_tools"]` (what the environment recorder writes), else `meta["tools"]`, else a
  JSON tool list or call signatures (`name(`) in the action space; a name merely mentioned in
  prose is not a declaration;
- a GUI trajectory broken by the environment (captcha, HTTP error page, `meta.broken`) is dropped;
- a retry cycle (a failing action repeated with the same observation as before) keeps only its
  first turn;
- in GUI domains, a turn whose observation equals the state before it (unchanged screen) is dropped;
- a trajectory with fewer than 2 turns (after the turn filters) is dropped.

When a corpus is split (`DuplicateFilter`, used by tools/make_corpus.py), two trajectories of one
domain with the same action sequence are duplicates when they also share their world (the same
episode recorded twice) or when they would land in different splits (a held-out trajectory that
repeats a training one step for step). The later one in collection order is dropped and counted;
the same action sequence in two different worlds of one split is kept, since its observations
differ and nothing leaks across splits.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import re
from typing import Any, Iterable

from lwm_jax import domains
from lwm_jax.data.schema import Trajectory

_CALL_RE = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*\(")
_SIGNATURE_RE = re.compile(r"(?<![\w.\-])([A-Za-z_][\w.\-]*)\(")
# An observation reads as a failure when its first line opens with an error marker (after at most
# two "prog:" prefixes, as in `ls: cannot access`), when it is a JSON error reply, or when it is a
# test run with failures.
_FAILURE_RE = re.compile(
    r"\A\s*(?:(?:[\w.\-/]+:\s*){0,2}(?:error|errno|exception|traceback|fatal|fail(?:ed|ure)?|"
    r"usage|invalid|unknown|cannot|can't|no such|permission denied|not found|command not found|"
    r"timed? ?out|refused)\b|\{\s*\"error\")"
    r"|\"isError\":\s*true|^=+ FAILURES =+$|^=+ .*\b\d+ failed\b.* =+$", re.I | re.M)
_BROKEN_RE = re.compile(
    r"captcha|verify you are (a )?human|\bHTTP(?:/\d(?:\.\d)?)?\s+(?:error\s+)?[45]\d\d\b"
    r"|\b(?:403 Forbidden|404 Not Found|500 Internal Server Error|502 Bad Gateway|"
    r"503 Service Unavailable)\b", re.I)
# Every match of _BROKEN_RE holds one of these (lower-cased): an ASCII text without any of them
# cannot match, which skips the expensive search on almost every GUI screen.
_BROKEN_NEEDLES = ("captcha", "verify you are", "http", "403 forbidden", "404 not found",
                   "500 internal server error", "502 bad gateway", "503 service unavailable")


@dataclasses.dataclass
class HygieneReport:
  kept: int = 0
  dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  turns_dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  def summary(self) -> str:
    d = ", ".join(f"{k}={v}" for k, v in sorted(self.dropped.items())) or "none"
    t = ", ".join(f"{k}={v}" for k, v in sorted(self.turns_dropped.items())) or "none"
    return f"kept {self.kept} trajectories; dropped trajectories [{d}]; dropped turns [{t}]"


def tool_name(action: str) -> str | None:
  """The tool an action calls: JSON {name|tool|function.name} or `name(...)`; None if unclear."""
  text = action.strip()
  if text.startswith("{"):
    try:
      obj = json.loads(text)
    except json.JSONDecodeError:
      obj = None
    if isinstance(obj, dict):
      for key in ("name", "tool", "tool_name"):
        if isinstance(obj.get(key), str):
          return obj[key]
      fn = obj.get("function")
      if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return fn["name"]
      return None
  m = _CALL_RE.match(text)
  return m.group(1) if m else None


def declared_tools(traj: Trajectory) -> set[str]:
  """Tool names a trajectory declares (see the module docstring for where they are read)."""
  for key in ("declared_tools", "tools"):
    tools = traj.meta.get(key)
    if isinstance(tools, list):
      return {_name_of(t) for t in tools} - {None}
  text = traj.action_space.strip() or str(traj.meta.get("system_str") or "")
  try:
    spec: Any = json.loads(text)
  except json.JSONDecodeError:
    spec = None
  if isinstance(spec, dict):
    spec = spec.get("tools")
  if isinstance(spec, list):
    return {_name_of(t) for t in spec} - {None}
  # Prose with call signatures, e.g. "Tools: read_file(path), run_tests()".
  return set(_SIGNATURE_RE.findall(text))


def _name_of(tool: Any) -> str | None:
  if isinstance(tool, str):
    return tool
  if isinstance(tool, dict):
    if isinstance(tool.get("name"), str):
      return tool["name"]
    fn = tool.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
      return fn["name"]
  return None


def calls_undeclared_tool(traj: Trajectory) -> bool:
  if not domains.get_domain(traj.domain).tool_calls:
    return False
  declared = declared_tools(traj)
  return any(name is not None and name not in declared
             for name in (tool_name(t.action) for t in traj.turns))


def missing_initial_state(traj: Trajectory) -> bool:
  """No starting state anywhere: a blank `initial_state` and no imported system prompt."""
  return not traj.initial_state.strip() and not str(traj.meta.get("system_str") or "").strip()


def is_failure(observation: str) -> bool:
  """Whether an observation reads as an error or a failed action."""
  return bool(_FAILURE_RE.search(observation))


def drop_retry_cycles(traj: Trajectory) -> tuple[Trajectory, int]:
  """Keeps the first of each repeated (action, failing observation) pair; returns the count dropped."""
  seen, kept = set(), []
  for t in traj.turns:
    key = (t.action.strip(), t.observation.strip())
    if key in seen and is_failure(t.observation):
      continue
    seen.add(key)
    kept.append(t)
  dropped = len(traj.turns) - len(kept)
  if dropped:
    traj = dataclasses.replace(traj, turns=kept, meta={**traj.meta, "retry_turns_dropped": dropped})
  return traj, dropped


def is_broken_gui(traj: Trajectory) -> bool:
  if not domains.get_domain(traj.domain).gui:
    return False
  if traj.meta.get("broken"):
    return True
  return any(_looks_broken(t.observation) for t in traj.turns)


def _looks_broken(text: str) -> bool:
  if text.isascii():
    low = text.lower()
    if not any(n in low for n in _BROKEN_NEEDLES):
      return False
  return bool(_BROKEN_RE.search(text))


def drop_unchanged_gui_turns(traj: Trajectory) -> tuple[Trajectory, int]:
  """GUI domains: removes turns whose observation equals the state before the action."""
  if not domains.get_domain(traj.domain).gui:
    return traj, 0
  kept, prev = [], traj.initial_state.strip()
  for t in traj.turns:
    cur = t.observation.strip()
    if cur != prev:
      kept.append(t)
    prev = cur
  dropped = len(traj.turns) - len(kept)
  if dropped:
    traj = dataclasses.replace(traj, turns=kept,
                               meta={**traj.meta, "unchanged_turns_dropped": dropped})
  return traj, dropped


def filter_trajectories(trajs: Iterable[Trajectory],
                        report: HygieneReport | None = None) -> list[Trajectory]:
  """Applies every filter; counts go to `report` (a fresh one when None is given)."""
  report = report if report is not None else HygieneReport()
  out = []
  for traj in trajs:
    if missing_initial_state(traj):
      report.dropped["missing_initial_state"] += 1
      continue
    if calls_undeclared_tool(traj):
      report.dropped["undeclared_tool"] += 1
      continue
    if is_broken_gui(traj):
      report.dropped["broken_environment"] += 1
      continue
    traj, n = drop_retry_cycles(traj)
    if n:
      report.turns_dropped["retry_cycle"] += n
    traj, n = drop_unchanged_gui_turns(traj)
    if n:
      report.turns_dropped["unchanged_gui_state"] += n
    if len(traj.turns) < 2:
      report.dropped["fewer_than_2_turns"] += 1
      continue
    report.kept += 1
    out.append(traj)
  return out


def action_digest(traj: Trajectory) -> str:
  """A digest of a trajectory's action sequence (exact strings, in order)."""
  blob = json.dumps([t.action for t in traj.turns], ensure_ascii=False)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


class DuplicateFilter:
  """Drops repeated action sequences that would duplicate an episode or leak across splits.

  Feed trajectories in a fixed order (the collection order) with their world and split; `admit`
  answers whether to keep each one. Drops are counted in `report.dropped` under
  `duplicate_same_world` and `duplicate_across_splits` (see the module docstring).
  """

  def __init__(self, report: HygieneReport | None = None):
    self.report = report if report is not None else HygieneReport()
    # (domain, action digest) -> the split that owns it and the worlds seen with it
    self._owner: dict[tuple[str, str], tuple[str, set[str]]] = {}

  def admit(self, traj: Trajectory, world: str, split: str) -> bool:
    return self.admit_key((traj.domain, action_digest(traj)), world, split)

  def admit_key(self, key: tuple[str, str], world: str, split: str) -> bool:
    """`admit` for a trajectory known by its key (domain, action digest): a distributed build
    groups trajectories by key and feeds each group, in collection order, to its own filter."""
    owner = self._owner.get(key)
    if owner is None:
      self._owner[key] = (split, {world})
    elif world in owner[1]:
      self.report.dropped["duplicate_same_world"] += 1
      return False
    elif split != owner[0]:
      self.report.dropped["duplicate_across_splits"] += 1
      return False
    else:
      owner[1].add(world)
    self.report.kept += 1
    return True
