"""Resumable job running: a JSONL cache of finished results and rounds of backend calls.

Every finished result is appended to the cache file and flushed at once, keyed by `key`; a rerun
loads the cache and skips those keys, so an interrupted run resumes where it stopped. Failed calls
are written to `<cache>.errors.jsonl`, counted and retried by the next run, never cached as done.

The cache never rewrites or truncates a file: it only appends. The one line it tolerates that is
not a row is a torn write: a final line without a newline that starts a JSON object. Before the
next append it ends that line with a newline and notes its number in `<cache>.torn`, so later
loads skip it; any other line that is not a row of this cache (bad JSON, no `key`) is an error
naming the file and line. Reading (`read_rows`) never writes anything.
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


class ForeignFileError(ValueError):
  """A file in a cache's place holds a line that is not one of the cache's rows."""


def _torn_path(path: str) -> str:
  return path + ".torn"


def _known_torn(path: str) -> set[int]:
  """Line numbers of earlier torn writes, ended with a newline by a later append."""
  p = _torn_path(path)
  if not os.path.exists(p):
    return set()
  with open(p, encoding="utf-8") as f:
    return {int(json.loads(line)["line"]) for line in f if line.strip()}


def scan_jsonl(path: str, parse: Callable[[dict[str, Any], str], None]
               ) -> tuple[bool, int | None]:
  """Calls `parse(row, where)` on each JSON object of `path`, where = 'path:line'.

  Returns (whether the file ends with a newline or is empty, line number of a torn final line or
  None). A line that is not a JSON object, other than a torn final line or one noted in
  `<path>.torn`, raises ForeignFileError.
  """
  with open(path, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise ForeignFileError(f"{path}:{line}: not UTF-8 text; not a results file of this "
                           "program (move it away or choose another --out)") from None
  lines = text.split("\n")
  ends_clean = text.endswith("\n") or not text
  if ends_clean:
    lines = lines[:-1]
  known = _known_torn(path)
  torn = None
  for lineno, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except RecursionError:
      raise ForeignFileError(f"{path}:{lineno}: JSON nested too deeply; not a results file of "
                             "this program") from None
    except json.JSONDecodeError as e:
      if lineno in known:
        continue
      if lineno == len(lines) and not ends_clean and line.lstrip().startswith("{"):
        torn = lineno  # written in part when a run was killed
        log.warning("%s:%d: ignoring an incomplete last line (%s)", path, lineno, e)
        continue
      raise ForeignFileError(f"{path}:{lineno}: not a JSON row ({e}); this file was not written "
                             "by this program (move it away or choose another --out)") from None
    if not isinstance(row, dict):
      raise ForeignFileError(f"{path}:{lineno}: a JSON {type(row).__name__}, not a row object")
    parse(row, f"{path}:{lineno}")
  return ends_clean, torn


def _keyed(rows: dict[str, dict[str, Any]]) -> Callable[[dict[str, Any], str], None]:
  def parse(row: dict[str, Any], where: str) -> None:
    key = row.get("key")
    if not isinstance(key, str):
      hint = ("; it looks like an official client file: those are read by judge and score "
              "(lwm_jax/eval/official.py), never appended to") if "gen" in row or (
                  "failed" in row and "turn_idx" in row) else "; not a results file of this program"
      raise ForeignFileError(f"{where}: row has no string 'key' (keys: "
                             f"{', '.join(list(row)[:8])}){hint}")
    rows[key] = row
  return parse


def read_rows(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
  """The finished rows of a cache file by key (the last row of a key wins); writes nothing."""
  rows: dict[str, dict[str, Any]] = {}
  scan_jsonl(os.fspath(path), _keyed(rows))
  return rows


class JsonlCache:
  """Finished rows by key, backed by an append-only JSONL file (the last row of a key wins)."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self.rows: dict[str, dict[str, Any]] = {}
    self.lock = threading.Lock()
    self.torn_lines = 0
    self._torn_line: int | None = None
    self._needs_newline = False
    if os.path.exists(self.path):
      ends_clean, self._torn_line = scan_jsonl(self.path, _keyed(self.rows))
      self._needs_newline = not ends_clean
      self.torn_lines = int(self._torn_line is not None)

  def __contains__(self, key: str) -> bool:
    return key in self.rows

  def add(self, row: dict[str, Any]) -> None:
    with self.lock:
      os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
      line = json.dumps(row, ensure_ascii=False) + "\n"
      if self._torn_line is not None:  # remembered, so later loads skip it
        with open(_torn_path(self.path), "a", encoding="utf-8") as f:
          f.write(json.dumps({"line": self._torn_line}) + "\n")
        self._torn_line = None
      if self._needs_newline:  # end the last line first: this row starts a line of its own
        line = "\n" + line
        self._needs_newline = False
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
      self.rows[row["key"]] = row

  def log_error(self, key: str, error: str) -> None:
    with self.lock:
      os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
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
