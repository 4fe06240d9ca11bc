"""AgentWorldBench inference: predictions from any backend, the baselines, and a run's on-disk layout.

`lwm_jax/eval/` is the evaluation library (this module, the judge, scoring, reports); `evals/` holds
the command line (`evals/agentworldbench.py`) and the bundled mini benchmark; the record format
itself is `lwm_jax/data/bench_records.py`.

An output directory holds

    predictions/{system}.jsonl   one row per record: key, task, id, prediction (parsed), raw text
    judged/{system}.jsonl        one row per record: key, task, id, scores (or null), judge reply
    scores.json, scores.md, scores_*.png   written by `report.score_run`

`{system}` is the model's name or one of the baselines: `copy_previous` (the observation before the
action, '' at the first turn) and `empty` (an empty prediction).
"""
from __future__ import annotations

import logging
import os
import re
from typing import Any, Iterable

from lwm_jax.data.bench_records import AWBRecord
from lwm_jax.eval import records as R
from lwm_jax.eval.backends import Backend, Completion
from lwm_jax.eval.runner import Job, JsonlCache, RunStats, run_jobs
from lwm_jax.sampling.parsing import parse_prediction

log = logging.getLogger(__name__)

BASELINES = ("copy_previous", "empty")
PRED_DIR, JUDGED_DIR = "predictions", "judged"


def system_slug(name: str) -> str:
  """A file-safe system name ('Qwen/Qwen3-8B' -> 'Qwen__Qwen3-8B')."""
  slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name.replace("/", "__")).strip("._")
  if not slug:
    raise ValueError(f"system name {name!r} gives an empty file name")
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
  """Writes (replaces) the baseline prediction files; they need no model."""
  recs = list(records)
  paths = []
  for b in BASELINES:
    path = predictions_path(out_dir, b)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
      os.remove(path)
    cache = JsonlCache(path)
    for rec in recs:
      cache.add(_row(rec, baseline_prediction(rec, b)))
    paths.append(path)
  return paths


def load_rows(path: str) -> dict[str, dict[str, Any]]:
  """Finished rows of a predictions or judged file, by key."""
  return dict(JsonlCache(path).rows)


def list_systems(out_dir: str, kind: str = PRED_DIR) -> list[str]:
  """Systems with a file under `out_dir/kind`, model systems first, baselines last."""
  folder = os.path.join(out_dir, kind)
  if not os.path.isdir(folder):
    return []
  names = sorted(f[:-len(".jsonl")] for f in os.listdir(folder)
                 if f.endswith(".jsonl") and not f.endswith(".errors.jsonl"))
  return [n for n in names if n not in BASELINES] + [b for b in BASELINES if b in names]
