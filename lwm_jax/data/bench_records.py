"""The AgentWorldBench record format (reader and writer): one turn-level sample per JSONL line.

The evaluation library that runs models on these records is `lwm_jax/eval/`; the command line
and the bundled mini benchmark are in `evals/`.

A record holds the system prompt (`system_str`), the earlier actions (`prompt`) and their
ground-truth observations (`response`), the action to predict for (`current_prompt`), and where
that turn sits in its trajectory (`turn_idx`, 1-based, of `total_turns`). Actions are rendered as a
`### Turn k` heading, an `**Action:**` line and a fenced block; observations start with
`**Environment Observation:**`. Positions are taken from `turn_idx`: the history is the first
`turn_idx - 1` action/observation pairs and the ground truth is `response[turn_idx - 1]` when
present. That reads both the official files (whose `prompt`/`response` may hold the whole
trajectory) and ours (which hold the history plus the ground truth) the same way.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Iterable, Iterator

from lwm_jax.data import schema

OBSERVATION_HEADER = "**Environment Observation:**"
_ACTION_RE = re.compile(r"^### Turn (\d+)\n\*\*Action:\*\*\n```[^\n]*\n(.*)\n```\s*$", re.S)


def format_action(turn_idx: int, action: str) -> str:
  """Renders action number `turn_idx` (1-based) as AgentWorldBench shows it to the model."""
  fence = "```"
  while fence in action:  # a longer fence keeps a fenced block inside the action intact
    fence += "`"
  return f"### Turn {turn_idx}\n**Action:**\n{fence}\n{action}\n{fence}"


def parse_action(text: str) -> str:
  """Inverse of `format_action`; text in any other shape is returned unchanged."""
  m = re.match(r"^### Turn \d+\n\*\*Action:\*\*\n(`{3,})[^\n]*\n(.*)\n\1\s*$", text, re.S)
  return m.group(2) if m else text


def format_observation(observation: str) -> str:
  return f"{OBSERVATION_HEADER}\n{observation}"


def parse_observation(text: str) -> str:
  if text.startswith(OBSERVATION_HEADER):
    return text[len(OBSERVATION_HEADER):].lstrip("\n")
  return text


@dataclasses.dataclass
class AWBRecord:
  task: str
  id: str
  system_str: str
  prompt: list[str]
  response: list[str]
  current_prompt: str
  turn_idx: int
  total_turns: int
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def ground_truth(self) -> str | None:
    """The observation that follows `current_prompt`, when the record carries it."""
    if len(self.response) >= self.turn_idx:
      return parse_observation(self.response[self.turn_idx - 1])
    return None

  def messages(self) -> list[dict[str, str]]:
    """Chat messages for inference: system, then the history as user/assistant pairs, then the action."""
    msgs = [{"role": "system", "content": self.system_str}]
    h = self.turn_idx - 1
    for act, obs in zip(self.prompt[:h], self.response[:h]):
      msgs.append({"role": "user", "content": act})
      msgs.append({"role": "assistant", "content": obs})
    msgs.append({"role": "user", "content": self.current_prompt})
    return msgs

  def to_dict(self) -> dict[str, Any]:
    d = {"task": self.task, "id": self.id, "prompt": self.prompt, "response": self.response,
         "current_prompt": self.current_prompt, "system_str": self.system_str,
         "turn_idx": self.turn_idx, "total_turns": self.total_turns}
    d.update(self.extra)
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "AWBRecord":
    if not isinstance(d, dict):
      raise ValueError(f"record is a {type(d).__name__}, expected a JSON object")
    for key, typ in (("task", str), ("id", (str, int)), ("prompt", list), ("response", list),
                     ("current_prompt", str), ("system_str", str), ("turn_idx", int),
                     ("total_turns", int)):
      if key not in d:
        raise ValueError(f"missing field '{key}'")
      if not isinstance(d[key], typ):
        raise ValueError(f"field '{key}' has type {type(d[key]).__name__}")
    for key in ("prompt", "response"):
      if not all(isinstance(x, str) for x in d[key]):
        raise ValueError(f"field '{key}' must be a list of strings")
    if d["turn_idx"] < 1:
      raise ValueError(f"field 'turn_idx' must be >= 1, got {d['turn_idx']}")
    h = d["turn_idx"] - 1
    if len(d["prompt"]) < h or len(d["response"]) < h:
      raise ValueError(f"turn_idx {d['turn_idx']} needs {h} earlier actions and observations, "
                       f"found {len(d['prompt'])} and {len(d['response'])}")
    known = {"task", "id", "prompt", "response", "current_prompt", "system_str", "turn_idx",
             "total_turns"}
    return cls(task=d["task"], id=str(d["id"]), system_str=d["system_str"], prompt=d["prompt"],
               response=d["response"], current_prompt=d["current_prompt"],
               turn_idx=d["turn_idx"], total_turns=d["total_turns"],
               extra={k: v for k, v in d.items() if k not in known})


def read_awb_jsonl(path: str | os.PathLike) -> Iterator[AWBRecord]:
  """Reads an AgentWorldBench file; a bad line raises `ValueError('path:line: why')`."""
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        yield AWBRecord.from_dict(json.loads(line))
      except (json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"{os.fspath(path)}:{lineno}: {e}") from None


def write_awb_jsonl(path: str | os.PathLike, records: Iterable[AWBRecord]) -> int:
  n = 0
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
      n += 1
  return n


def trajectory_to_records(traj: schema.Trajectory, system_str: str,
                          turn_indices: Iterable[int]) -> list[AWBRecord]:
  """One AgentWorldBench record per 0-based turn index; `response` ends with the ground truth."""
  records = []
  for t in turn_indices:
    if not 0 <= t < len(traj.turns):
      raise ValueError(f"trajectory {traj.id}: turn index {t} out of range")
    records.append(AWBRecord(
        task=traj.domain, id=f"{traj.id}#t{t + 1}", system_str=system_str,
        prompt=[format_action(i + 1, x.action) for i, x in enumerate(traj.turns[:t])],
        response=[format_observation(x.observation) for x in traj.turns[:t + 1]],
        current_prompt=format_action(t + 1, traj.turns[t].action),
        turn_idx=t + 1, total_turns=len(traj.turns)))
  return records
