"""The AgentWorldBench record format (reader and writer): one turn-level sample per JSONL line.

The evaluation library that runs models on these records is `lwm_jax/eval/`; the command line
and the bundled mini benchmark are in `evals/`.

A record holds the system prompt (`system_str`), the actions (`prompt`) and their ground-truth
observations (`response`), the action to predict for (`current_prompt`), and where that turn sits in
its trajectory (`turn_idx`, 1-based, of `total_turns`). Actions are rendered as a `### Turn k`
heading, an `**Action:**` line and a fenced block; observations start with
`**Environment Observation:**`.

Published files, and the files `trajectory_to_records` writes, keep the WHOLE trajectory in `prompt`
and `response`; positions come from `turn_idx`. The history is the first `turn_idx - 1`
action/observation pairs, the action under test is `prompt[turn_idx - 1]` (the official client reads
only that one; `current_prompt` is the fallback for files whose `prompt` stops before it) and the
ground truth is `response[turn_idx - 1]` when present. Later turns never reach a model.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Iterable, Iterator

from lwm_jax.data import schema
from lwm_jax.data.jsonl import iter_jsonl

OBSERVATION_HEADER = "**Environment Observation:**"
# `extra` key of a record made from a recorded trajectory: the turn under test's `Turn.env` (the
# error the real environment reported, whether its state changed), read by the by-kind report.
ENV_KEY = "env"
INT_ID = "_int_id"  # `extra` flag: the file's id was a JSON number
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
    """The observation that follows the action under test, when the record carries it."""
    if len(self.response) >= self.turn_idx:
      return parse_observation(self.response[self.turn_idx - 1])
    return None

  @property
  def action(self) -> str:
    """The action under test: `prompt[turn_idx - 1]` when present, else `current_prompt`."""
    if len(self.prompt) >= self.turn_idx:
      return self.prompt[self.turn_idx - 1]
    return self.current_prompt

  def history(self) -> list[tuple[str, str]]:
    """The earlier (action, observation) pairs, as the file renders them."""
    h = self.turn_idx - 1
    return list(zip(self.prompt[:h], self.response[:h]))

  def messages(self) -> list[dict[str, str]]:
    """Chat messages for inference: the system prompt (when not empty), the history as
    user/assistant pairs, then the action under test."""
    msgs = [{"role": "system", "content": self.system_str}] if self.system_str else []
    for act, obs in self.history():
      msgs.append({"role": "user", "content": act})
      msgs.append({"role": "assistant", "content": obs})
    msgs.append({"role": "user", "content": self.action})
    return msgs

  def to_dict(self) -> dict[str, Any]:
    extra = dict(self.extra)
    rid: str | int = int(self.id) if extra.pop(INT_ID, False) else self.id
    d = {"task": self.task, "id": rid, "prompt": self.prompt, "response": self.response,
         "current_prompt": self.current_prompt, "system_str": self.system_str,
         "turn_idx": self.turn_idx, "total_turns": self.total_turns}
    d.update(extra)
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "AWBRecord":
    if not isinstance(d, dict):
      raise ValueError(f"record is a {type(d).__name__}, expected a JSON object")
    d = dict(d)
    if "current_prompt" not in d and isinstance(d.get("prompt"), list) and isinstance(
        d.get("turn_idx"), int) and 1 <= d["turn_idx"] <= len(d["prompt"]):
      d["current_prompt"] = d["prompt"][d["turn_idx"] - 1]  # the official client's own rule
    for key, typ in (("task", str), ("id", (str, int)), ("prompt", list), ("response", list),
                     ("current_prompt", str), ("system_str", str), ("turn_idx", int),
                     ("total_turns", int)):
      if key not in d:
        raise ValueError(f"missing field '{key}'")
      if not isinstance(d[key], typ) or isinstance(d[key], bool):
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
    extra = {k: v for k, v in d.items() if k not in known}
    if isinstance(d["id"], int):
      extra[INT_ID] = True  # written back as a number
    return cls(task=d["task"], id=str(d["id"]), system_str=d["system_str"], prompt=d["prompt"],
               response=d["response"], current_prompt=d["current_prompt"],
               turn_idx=d["turn_idx"], total_turns=d["total_turns"], extra=extra)


def read_awb_jsonl(path: str | os.PathLike) -> Iterator[AWBRecord]:
  """Reads an AgentWorldBench file; a bad line raises `ValueError('path:line: why')`."""
  for lineno, value in iter_jsonl(path):
    try:
      yield AWBRecord.from_dict(value)
    except ValueError as e:
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
  """One AgentWorldBench record per 0-based turn index, in the published layout: `prompt` and
  `response` hold the whole trajectory and `turn_idx` marks the turn under test."""
  actions = [format_action(i + 1, x.action) for i, x in enumerate(traj.turns)]
  observations = [format_observation(x.observation) for x in traj.turns]
  records = []
  for t in turn_indices:
    if not 0 <= t < len(traj.turns):
      raise ValueError(f"trajectory {traj.id}: turn index {t} out of range")
    rec = AWBRecord(
        task=traj.domain, id=f"{traj.id}#t{t + 1}", system_str=system_str,
        prompt=list(actions), response=list(observations), current_prompt=actions[t],
        turn_idx=t + 1, total_turns=len(traj.turns))
    if traj.turns[t].env is not None:  # what the real environment reported about this step
      rec.extra[ENV_KEY] = traj.turns[t].env
    records.append(rec)
  return records
