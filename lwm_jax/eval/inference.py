"""AgentWorldBench inference: predictions from any backend, the baselines, and a run's on-disk layout.

`lwm_jax/eval/` is the evaluation library (this module, the judge, scoring, reports); `evals/` holds
the command line (`evals/agentworldbench.py`) and the bundled mini benchmark; the record format
itself is `lwm_jax/data/bench_records.py`.

An output directory holds

    predictions/{system}.jsonl   one row per record: key, task, id, prediction (parsed), raw text
    judged/{system}.jsonl        one row per record: key, task, id, scores (or null), judge reply
    scores.json, scores.md, scores_*.png   written by `report.score_run`

`{system}` is the model's name or one of the baselines: `copy_previous` (the observation before the
action, '' at the first turn) and `empty` (an empty prediction). The baselines' names are reserved:
a model may not be called that. Prediction and judged files may also be in the official client's
shapes (`lwm_jax/eval/official.py`); they are read, never appended to.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Any, Iterable

from lwm_jax.data.bench_records import AWBRecord
from lwm_jax.data.reply import parse_prediction
from lwm_jax.eval import official
from lwm_jax.eval import records as R
from lwm_jax.eval.runner import ForeignFileError, Job, JsonlCache, RunStats, read_rows, run_jobs
from lwm_jax.sampling.backends import Backend, Completion

log = logging.getLogger(__name__)

BASELINES = ("copy_previous", "empty")
PRED_DIR, JUDGED_DIR = "predictions", "judged"


def system_slug(name: str) -> str:
  """A file-safe system name ('Qwen/Qwen3-8B' -> 'Qwen__Qwen3-8B')."""
  slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name.replace("/", "__")).strip("._")
  if not slug:
    raise ValueError(f"system name {name!r} gives an empty file name")
  return slug


def check_system_name(name: str) -> str:
  """Refuses a model system whose file would be a baseline's; returns the file-safe name."""
  slug = system_slug(name)
  if slug in BASELINES:
    raise ValueError(f"system name {name!r} is reserved for a baseline (reserved: "
                     f"{', '.join(BASELINES)}); pass another --system")
  return slug


def predictions_path(out_dir: str, system: str) -> str:
  return os.path.join(out_dir, PRED_DIR, system_slug(system) + ".jsonl")


def judged_path(out_dir: str, system: str) -> str:
  return os.path.join(out_dir, JUDGED_DIR, system_slug(system) + ".jsonl")


def _row(rec: AWBRecord, prediction: str, **extra: Any) -> dict[str, Any]:
  return {"key": R.record_key(rec), "task": R.domain(rec), "id": rec.id,
          "prediction": prediction, **extra}


def run_inference(records: Iterable[AWBRecord], backend: Backend, out_path: str, *,
                  progress: bool = True) -> RunStats:
  """Predicts the next observation of every record not already in `out_path` (the cache)."""
  check_system_name(backend.name)
  recs = list(records)
  by_key = {R.record_key(r): r for r in recs}
  jobs = [Job(k, R.chat_messages(r)) for k, r in by_key.items()]

  def finish(job: Job, out: Completion, last: bool) -> dict[str, Any]:
    text = out.text
    if not text.strip() and out.reasoning:
      # The server moved an unclosed reasoning into `reasoning_content`: read it as unfinished
      # reasoning, so only a complete answer block written inside it counts.
      text = "<think>" + out.reasoning
    pred = R.clean_prediction(parse_prediction(text))
    return _row(by_key[job.key], pred, raw=out.text, reasoning=out.reasoning,
                finish_reason=out.finish_reason)

  stats = run_jobs(jobs, backend, JsonlCache(out_path), finish, desc=f"infer {backend.name}",
                   progress=progress)
  log.info("inference %s: %s", backend.name, stats.summary())
  return stats


def baseline_prediction(rec: AWBRecord, baseline: str) -> str:
  if baseline == "copy_previous":
    return R.previous_observation(rec)
  if baseline == "empty":
    return ""
  raise ValueError(f"unknown baseline '{baseline}' (expected one of {', '.join(BASELINES)})")


def write_baselines(records: Iterable[AWBRecord], out_dir: str) -> list[str]:
  """Writes the baseline prediction files (they need no model), adding rows for new records.

  An existing baseline file must hold exactly the baseline's predictions; anything else there is
  refused, never replaced."""
  recs = list(records)
  by_key = {R.record_key(r): r for r in recs}
  paths = []
  for b in BASELINES:
    path = predictions_path(out_dir, b)
    cache = JsonlCache(path)
    for key, row in cache.rows.items():
      if key in by_key and row.get("prediction") != baseline_prediction(by_key[key], b):
        raise ForeignFileError(f"{path}: row '{key}' is not the {b} baseline's prediction; the "
                               f"name '{b}' is reserved for the baseline (move the file away)")
    for rec in recs:
      if R.record_key(rec) not in cache:
        cache.add(_row(rec, baseline_prediction(rec, b)))
    paths.append(path)
  return paths


def load_rows(path: str) -> dict[str, dict[str, Any]]:
  """Finished rows of one of our predictions or judged files, by key; writes nothing."""
  return read_rows(path)


def load_predictions(path: str, row_format: str = "auto") -> dict[str, dict[str, Any]]:
  """A predictions file in our shape or the official client's, as our rows by key."""
  return official.read_predictions(path, row_format)


def load_judged(path: str, row_format: str = "auto") -> dict[str, dict[str, Any]]:
  """A judged file in our shape or the official client's, as our rows by key."""
  return official.read_judged(path, row_format)


def list_systems(out_dir: str, kind: str = PRED_DIR) -> list[str]:
  """Systems with a file under `out_dir/kind`, model systems first, baselines last."""
  folder = os.path.join(out_dir, kind)
  if not os.path.isdir(folder):
    return []
  names = sorted(f[:-len(".jsonl")] for f in os.listdir(folder)
                 if f.endswith(".jsonl") and not f.endswith(".errors.jsonl"))
  return [n for n in names if n not in BASELINES] + [b for b in BASELINES if b in names]
