"""Reading AgentWorldBench files for evaluation: history, ground truth and chat messages by turn.

Positions come from `turn_idx` (see `lwm_jax/data/bench_records.py`): the history is the first
`turn_idx - 1` (action, observation) pairs, the action under test is `prompt[turn_idx - 1]` (falling
back to `current_prompt` when `prompt` stops before it), and the ground truth is
`response[turn_idx - 1]` when present (absent in inference-only files). This is the rule the
official client applies, so both clients send a model the same messages. Future turns never reach
the model.
"""
from __future__ import annotations

import glob
import logging
import os
from typing import Iterable

from lwm_jax import domains as domains_lib
from lwm_jax.data import bench_records as awb
from lwm_jax.eval.metrics import domain_of

log = logging.getLogger(__name__)


def domain(rec: awb.AWBRecord) -> str:
  return domain_of(rec.task)


def record_key(rec: awb.AWBRecord) -> str:
  """Cache key of a record: ids are only unique within a domain."""
  return f"{domain(rec)}:{rec.id}"


def history(rec: awb.AWBRecord) -> list[tuple[str, str]]:
  """Earlier (action, observation) pairs as the file renders them."""
  return rec.history()


def chat_messages(rec: awb.AWBRecord) -> list[dict[str, str]]:
  """System prompt (when not empty), the history as user/assistant pairs, then the action."""
  return rec.messages()


def ground_truth(rec: awb.AWBRecord) -> str | None:
  """The real observation after `current_prompt`, header removed; None when the file lacks it."""
  i = rec.turn_idx - 1
  if 0 <= i < len(rec.response):
    return awb.parse_observation(rec.response[i])
  return None


def previous_observation(rec: awb.AWBRecord) -> str:
  """The observation just before the action under test ('' at the first turn)."""
  i = rec.turn_idx - 2
  if 0 <= i < len(rec.response):
    return awb.parse_observation(rec.response[i])
  return ""


def clean_prediction(text: str) -> str:
  """A prediction without the observation header a model may copy from its context."""
  return awb.parse_observation(text.strip()).strip()


def bench_files(path: str | os.PathLike) -> list[str]:
  """`path` itself, or the `*_test.jsonl` files of a directory (else all its `*.jsonl`)."""
  path = os.fspath(path)
  if os.path.isdir(path):
    files = sorted(glob.glob(os.path.join(path, "*_test.jsonl"))) or sorted(
        glob.glob(os.path.join(path, "*.jsonl")))
    if not files:
      raise FileNotFoundError(f"{path}: no *_test.jsonl or *.jsonl files")
    return files
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such benchmark file or directory")
  return [path]


def load_bench(path: str | os.PathLike, domains: Iterable[str] | None = None,
               limit_per_domain: int | None = None) -> list[awb.AWBRecord]:
  """All records under `path`, optionally only some domains and the first N of each.

  Raises ValueError naming the file and line (record) of a malformed record, a bad turn_idx or a
  duplicate id.
  """
  wanted = set(domains) if domains else None
  records: list[awb.AWBRecord] = []
  seen: dict[str, str] = {}
  per_domain: dict[str, int] = {}
  unknown: set[str] = set()
  for f in bench_files(path):
    for n, rec in enumerate(awb.read_awb_jsonl(f), 1):
      where = f"{f}: record {n}"
      dom = domain(rec)
      if rec.turn_idx < 1:
        raise ValueError(f"{where}: turn_idx must be >= 1, got {rec.turn_idx}")
      if not domains_lib.is_domain(dom):
        unknown.add(dom)
      if wanted is not None and dom not in wanted:
        continue
      if limit_per_domain is not None and per_domain.get(dom, 0) >= limit_per_domain:
        continue
      key = record_key(rec)
      if key in seen:
        raise ValueError(f"{where}: duplicate record id '{rec.id}' in domain '{dom}' "
                         f"(first at {seen[key]})")
      seen[key] = where
      per_domain[dom] = per_domain.get(dom, 0) + 1
      records.append(rec)
  if unknown:
    log.warning("domains outside the seven of AgentWorldBench: %s", ", ".join(sorted(unknown)))
  return records
