"""Importers from other trajectory formats into `Trajectory` records.

- AgentWorldBench JSONL (turn-level records, see `bench_records.py`): each record becomes one
  trajectory holding its history plus the current turn with its ground truth. Records of the same
  trajectory (`id` ending in `#t<k>`) are merged into the longest one when `merge=True`.
- OpenAI chat messages: one JSON object a line with `messages` (system, then user = action and
  assistant = observation), plus `domain` (or a default) and optional `id` / `meta`.

Both keep the original system prompt in `meta["system_str"]`; `prompts.system_prompt` then uses it
verbatim instead of a template. The load modes are those of `schema.iter_records`.
"""
from __future__ import annotations

import os
import re
from typing import Any

from lwm_jax import domains as domains_lib
from lwm_jax.data import bench_records as awb
from lwm_jax.data import jsonl, schema
from lwm_jax.data.schema import LoadReport, RecordError, Trajectory, Turn

_TURN_SUFFIX_RE = re.compile(r"#t\d+$")
_THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.S)
_PRED_RE = re.compile(r"<predicted_observation>(.*?)(?:</predicted_observation>|$)", re.S)


def trajectory_from_awb(rec: awb.AWBRecord) -> Trajectory:
  """One trajectory from one AgentWorldBench record; the record must carry its ground truth."""
  if not domains_lib.is_domain(rec.task):
    raise RecordError(f"unknown domain '{rec.task}' in field 'task'", "unknown_domain")
  gt = rec.ground_truth
  if gt is None:
    raise RecordError("record has no ground-truth observation for 'current_prompt'",
                      "no_ground_truth")
  # Only the history: published records also carry the turns after the one under test.
  turns = [Turn(awb.parse_action(a), awb.parse_observation(o)) for a, o in rec.history()]
  turns.append(Turn(awb.parse_action(rec.action), gt))
  return Trajectory(
      id=_TURN_SUFFIX_RE.sub("", rec.id), domain=rec.task, task="", action_space="",
      initial_state="", turns=turns,
      meta={"source": "agentworldbench", "system_str": rec.system_str, "awb_id": rec.id,
            "turn_idx": rec.turn_idx, "total_turns": rec.total_turns, **rec.extra})


def _parse_awb(obj: Any) -> Trajectory:
  try:
    rec = awb.AWBRecord.from_dict(obj)
  except RecordError:
    raise
  except ValueError as e:
    reason = "missing_field" if "missing field" in str(e) else "bad_type"
    raise RecordError(str(e), reason) from None
  return trajectory_from_awb(rec)


def load_awb_jsonl(path: str | os.PathLike, mode: str = "strict",
                   quarantine: str | os.PathLike | None = None,
                   merge: bool = True) -> tuple[list[Trajectory], LoadReport]:
  """Imports an AgentWorldBench file; with `merge`, keeps the longest record per trajectory."""
  report = LoadReport(path=os.fspath(path),
                      quarantine=os.fspath(quarantine) if quarantine is not None else None)
  trajs = [t for _, t in schema.iter_records(path, _parse_awb, mode, report, quarantine)]
  if not merge:
    return trajs, report
  best: dict[str, Trajectory] = {}
  for t in trajs:
    if t.id not in best or len(t.turns) > len(best[t.id].turns):
      best[t.id] = t
  return list(best.values()), report


def _content_text(content: Any, where: str) -> str:
  if isinstance(content, str):
    return content
  if isinstance(content, list):  # OpenAI content parts
    texts = []
    for part in content:
      if isinstance(part, dict) and isinstance(part.get("text"), str):
        texts.append(part["text"])
      else:
        raise RecordError(f"{where}: only text content parts are supported", "bad_type")
    return "".join(texts)
  raise RecordError(f"{where}: content must be a string or a list of text parts", "bad_type")


def observation_from_reply(text: str) -> str:
  """An assistant reply as an observation: drops <think>, takes the last prediction block."""
  text = _THINK_RE.sub("", text)
  blocks = _PRED_RE.findall(text)
  if blocks:
    text = blocks[-1].strip("\n")
  return awb.parse_observation(text.strip("\n"))


def trajectory_from_chat(obj: Any, default_domain: str | None = None,
                         default_id: str = "") -> Trajectory:
  """One trajectory from {"messages": [...], "domain"?, "id"?, "meta"?}."""
  if not isinstance(obj, dict):
    raise RecordError(f"record is a {type(obj).__name__}, expected a JSON object", "not_object")
  msgs = obj.get("messages")
  if not isinstance(msgs, list):
    raise RecordError("missing field 'messages' (a list)", "missing_field")
  domain = obj.get("domain", default_domain)
  if domain is None:
    raise RecordError("missing field 'domain' and no default domain given", "missing_field")
  if not domains_lib.is_domain(domain):
    raise RecordError(f"unknown domain '{domain}'", "unknown_domain")
  system, turns, pending = "", [], None
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
      raise RecordError(f"messages[{i}] needs role system, user or assistant", "bad_turn")
    text = _content_text(m.get("content"), f"messages[{i}]")
    if m["role"] == "system":
      if i != 0:
        raise RecordError(f"messages[{i}]: system message must come first", "bad_turn")
      system = text
    elif m["role"] == "user":
      if pending is not None:
        raise RecordError(f"messages[{i}]: two user messages in a row", "bad_turn")
      pending = awb.parse_action(text)
    else:
      if pending is None:
        raise RecordError(f"messages[{i}]: assistant message without an action", "bad_turn")
      turns.append(Turn(pending, observation_from_reply(text)))
      pending = None
  if pending is not None:
    raise RecordError("last user message has no observation", "bad_turn")
  if not turns:
    raise RecordError("no user/assistant turns", "empty_turns")
  meta = obj.get("meta", {})
  if not isinstance(meta, dict):
    raise RecordError("field 'meta' must be an object", "bad_type")
  return Trajectory(id=str(obj.get("id", default_id)), domain=domain, task="", action_space="",
                    initial_state="", turns=turns,
                    meta={"source": "chat", **meta, "system_str": system})


def load_chat_jsonl(path: str | os.PathLike, default_domain: str | None = None,
                    mode: str = "strict", quarantine: str | os.PathLike | None = None
                    ) -> tuple[list[Trajectory], LoadReport]:
  """Imports an OpenAI chat-messages JSONL file; records without an id get `<file>:<line>`."""
  report = LoadReport(path=os.fspath(path),
                      quarantine=os.fspath(quarantine) if quarantine is not None else None)
  base = os.path.basename(os.fspath(path))
  out = []
  counter = iter(range(1, 1 << 62))

  def parse(obj: Any) -> Trajectory:
    return trajectory_from_chat(obj, default_domain, f"{base}:{next(counter)}")

  for _, t in schema.iter_records(path, parse, mode, report, quarantine):
    out.append(t)
  return out, report


def load_any(path: str | os.PathLike, fmt: str = "auto", mode: str = "strict",
             quarantine: str | os.PathLike | None = None,
             default_domain: str | None = None) -> tuple[list[Trajectory], LoadReport]:
  """Loads `fmt` in {trajectory, awb, chat}; 'auto' looks at the first record's keys."""
  if fmt == "auto":
    fmt = sniff_format(path)
  if fmt == "trajectory":
    return schema.load_jsonl(path, mode, quarantine)
  if fmt == "awb":
    return load_awb_jsonl(path, mode, quarantine)
  if fmt == "chat":
    return load_chat_jsonl(path, default_domain, mode, quarantine)
  raise ValueError(f"unknown format '{fmt}' (expected auto, trajectory, awb or chat)")


def sniff_format(path: str | os.PathLike) -> str:
  """The format of the first readable record (trajectory when none can be read)."""
  for _, obj in jsonl.iter_jsonl(path, strict=False):
    if isinstance(obj, jsonl.BadLine):
      if obj.reason == "truncated_file":
        break
      continue
    if isinstance(obj, dict):
      if "messages" in obj:
        return "chat"
      if "current_prompt" in obj or "system_str" in obj:
        return "awb"
    return "trajectory"
  return "trajectory"
