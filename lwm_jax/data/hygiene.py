"""Data-hygiene filters (docs/recipe.md, "Data hygiene"): every drop is counted under its reason.

- a trajectory with fewer than 2 turns (after the turn filter below) is dropped;
- an MCP/SWE trajectory that calls a tool its action space does not declare is dropped;
- a GUI trajectory broken by the environment (captcha, HTTP error page, `meta.broken`) is dropped;
- in GUI domains, a turn whose observation equals the state before it (unchanged screen) is dropped.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Any, Iterable

from lwm_jax.data.schema import GUI_DOMAINS, Trajectory

TOOL_DOMAINS = ("mcp", "swe")
_CALL_RE = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*\(")
_BROKEN_RE = re.compile(
    r"captcha|verify you are (a )?human|\bHTTP(?:/\d(?:\.\d)?)?\s+(?:error\s+)?[45]\d\d\b"
    r"|\b(?:403 Forbidden|404 Not Found|500 Internal Server Error|502 Bad Gateway|"
    r"503 Service Unavailable)\b", re.I)


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


def declared_tools(traj: Trajectory) -> set[str] | None:
  """Tool names a trajectory declares: `meta.tools`, or a JSON tool list in its action space."""
  tools = traj.meta.get("tools")
  if isinstance(tools, list):
    return {_name_of(t) for t in tools} - {None}
  try:
    spec: Any = json.loads(traj.action_space)
  except json.JSONDecodeError:
    return None
  if isinstance(spec, dict):
    spec = spec.get("tools")
  if isinstance(spec, list):
    return {_name_of(t) for t in spec} - {None}
  return None


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
  if traj.domain not in TOOL_DOMAINS:
    return False
  declared = declared_tools(traj)
  for t in traj.turns:
    name = tool_name(t.action)
    if name is None:
      continue
    if declared is not None:
      if name not in declared:
        return True
    elif not re.search(r"(?<![\w.\-])" + re.escape(name) + r"(?![\w\-])", traj.action_space):
      return True
  return False


def is_broken_gui(traj: Trajectory) -> bool:
  if traj.domain not in GUI_DOMAINS:
    return False
  if traj.meta.get("broken"):
    return True
  return any(_BROKEN_RE.search(t.observation) for t in traj.turns)


def drop_unchanged_gui_turns(traj: Trajectory) -> tuple[Trajectory, int]:
  """GUI domains: removes turns whose observation equals the state before the action."""
  if traj.domain not in GUI_DOMAINS:
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
    if calls_undeclared_tool(traj):
      report.dropped["undeclared_tool"] += 1
      continue
    if is_broken_gui(traj):
      report.dropped["broken_environment"] += 1
      continue
    traj, n = drop_unchanged_gui_turns(traj)
    if n:
      report.turns_dropped["unchanged_gui_state"] += n
    if len(traj.turns) < 2:
      report.dropped["fewer_than_2_turns"] += 1
      continue
    report.kept += 1
    out.append(traj)
  return out
