"""Resumable job running: a JSONL cache of finished results and rounds of backend calls.

Every finished result is appended to the cache file and flushed at once, keyed by `key`; a rerun
loads the cache and skips those keys, so an interrupted run resumes where it stopped. Failed calls
are written to `<cache>.errors.jsonl`, counted and retried by the next run, never cached as done.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

from tqdm import tqdm

from lwm_jax.sampling.backends import Backend, Completion, Messages

log = logging.getLogger(__name__)


class JsonlCache:
  """Finished rows by key, backed by an append-only JSONL file (the last row of a key wins)."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self.rows: dict[str, dict[str, Any]] = {}
    self.lock = threading.Lock()
    self.torn_lines = 0
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        lines = f.read().split("\n")
      for lineno, line in enumerate(lines, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
          key = row["key"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
          if lineno >= len(lines) - 1:  # a line torn by an interruption while writing
            self.torn_lines += 1
            log.warning("%s:%d: ignoring an incomplete last line (%s)", self.path, lineno, e)
            continue
          raise ValueError(f"{self.path}:{lineno}: bad cache row ({e})") from None
        self.rows[key] = row
      if self.torn_lines:  # rewrite without the torn line so later appends stay valid
        self._rewrite()
    else:
      os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)

  def _rewrite(self) -> None:
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      for row in self.rows.values():
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, self.path)

  def __contains__(self, key: str) -> bool:
    return key in self.rows

  def add(self, row: dict[str, Any]) -> None:
    with self.lock:
      self.rows[row["key"]] = row
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()

  def log_error(self, key: str, error: str) -> None:
    with self.lock:
      with open(self.path + ".errors.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"key": key, "error": error, "time": time.time()}) + "\n")


@dataclasses.dataclass
class Job:
  key: str
  messages: Messages
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RunStats:
  total: int = 0
  cached: int = 0
  done: int = 0
  errors: int = 0
  error_keys: list[str] = dataclasses.field(default_factory=list)

  def summary(self) -> str:
    return (f"{self.total} jobs: {self.cached} from cache, {self.done} done now, "
            f"{self.errors} failed (rerun to retry)")


# finish(job, completion, last_round) -> row to cache, or None to ask for another call.
Finish = Callable[[Job, Completion, bool], "dict[str, Any] | None"]


def run_jobs(jobs: Sequence[Job], backend: Backend, cache: JsonlCache, finish: Finish, *,
             rounds: int = 1, desc: str = "jobs", progress: bool = True) -> RunStats:
  """Runs the jobs not in the cache through `backend`, caching each finished row at once.

  A job whose `finish` returns None is called again in the next round (up to `rounds`); in the
  last round `finish` must return a row. A backend exception counts as an error for that job.
  """
  stats = RunStats(total=len(jobs))
  pending = [j for j in jobs if j.key not in cache]
  stats.cached = len(jobs) - len(pending)
  bar = tqdm(total=len(pending), desc=desc, disable=not progress, dynamic_ncols=True)
  for r in range(max(1, rounds)):
    if not pending:
      break
    last = r == max(1, rounds) - 1
    again: list[Job] = []
    for i, out in backend.complete_many([j.messages for j in pending]):
      job = pending[i]
      if isinstance(out, Exception):
        stats.errors += 1
        stats.error_keys.append(job.key)
        cache.log_error(job.key, f"{type(out).__name__}: {out}")
        log.warning("%s: %s failed: %s", desc, job.key, out)
        bar.update(1)
        continue
      row = finish(job, out, last)
      if row is None:
        again.append(job)
        continue
      row.setdefault("key", job.key)
      cache.add(row)
      stats.done += 1
      bar.update(1)
    pending = again
  bar.close()
  return stats
