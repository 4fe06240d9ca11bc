"""Judging AgentWorldBench predictions: benchmark records to the judge's plain inputs, and runs.

The rubric, the official style and reply parsing live in `lwm_jax.judge`; this module only reads
a record's history, action and ground truth, calls a judge style through a model backend, and
writes one row per record. A reply the style finds unusable is retried, then recorded with
`scores: null` and `failed: true`, and excluded from the score (see docs/benchmark.md).
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

from lwm_jax.data.bench_records import AWBRecord
from lwm_jax.eval import records as R
from lwm_jax.eval.official import is_empty_generation
from lwm_jax.eval.runner import Job, JsonlCache, RunStats, run_jobs
from lwm_jax.judge import JudgeStyle, Messages, rubric_style
from lwm_jax.sampling.backends import Backend, Completion

log = logging.getLogger(__name__)


def judge_messages(rec: AWBRecord, prediction: str, truth: str,
                   max_context_chars: int | None = None,
                   style: JudgeStyle | None = None,
                   row: Mapping[str, Any] | None = None) -> Messages:
  """The judge conversation for one record: our rubric cut to `max_context_chars`, or `style`
  (which carries its own context limit). A style that builds requests from the whole record (the
  official client's code) gets the record's dict and the prediction `row`."""
  style = style or rubric_style(max_context_chars)
  if style.record_messages is not None:
    return style.record_messages(rec.to_dict(), row if row is not None else
                                 {"prediction": prediction})
  return style.messages(R.domain(rec), R.history(rec), rec.current_prompt, prediction, truth)


def run_judging(records: Iterable[AWBRecord], predictions: Mapping[str, Mapping[str, Any]],
                backend: Backend, out_path: str, *, retries: int = 2,
                max_context_chars: int | None = None, style: JudgeStyle | None = None,
                drop_empty: bool = False, progress: bool = True,
                desc: str = "judge") -> tuple[RunStats, dict[str, int]]:
  """Judges every record that has a prediction and a ground truth; rows go to `out_path`.

  `style` defaults to our rubric cut to `max_context_chars`; `retries` extra calls follow an
  unusable reply (2 gives the official client's 3 tries). Returns the run statistics and counts of
  records skipped before judging: `no_prediction` (inference failed or not run),
  `no_ground_truth` (inference-only file) and, with `drop_empty`, `empty_prediction`: as the
  official client does, an empty generation is not sent to the judge; it gets a failed row
  (`dropped_empty: true`), so it is excluded from the score and counted there, never lost.
  """
  style = style or rubric_style(max_context_chars)
  skipped = {"no_prediction": 0, "no_ground_truth": 0}
  if drop_empty:
    skipped["empty_prediction"] = 0
  by_key: dict[str, AWBRecord] = {}
  jobs: list[Job] = []
  cache = JsonlCache(out_path)
  for rec in records:
    key = R.record_key(rec)
    truth = R.ground_truth(rec)
    if truth is None:
      skipped["no_ground_truth"] += 1
      continue
    if key not in predictions:
      skipped["no_prediction"] += 1
      continue
    prediction = str(predictions[key].get("prediction", ""))
    if drop_empty and is_empty_generation(predictions[key]):
      skipped["empty_prediction"] += 1
      if key not in cache:
        cache.add({"key": key, "task": R.domain(rec), "id": rec.id, "scores": None,
                   "failed": True, "reason": "empty generation, not judged (drop_empty)",
                   "dropped_empty": True, "judge_style": style.name})
      continue
    by_key[key] = rec
    jobs.append(Job(key, judge_messages(rec, prediction, truth, style=style,
                                        row=predictions[key])))

  def finish(job: Job, out: Completion, last: bool) -> dict[str, Any] | None:
    parsed = style.parse(out.text)
    ok = style.usable(parsed)
    if not ok and not last:
      return None
    rec = by_key[job.key]
    row = {"key": job.key, "task": R.domain(rec), "id": rec.id,
           "scores": parsed["scores"] if ok else None,
           "reason": parsed["reason"] if ok else "", "judge_raw": out.text, "failed": not ok,
           "judge_style": style.name}
    if ok:
      row.update({k: v for k, v in parsed.items() if k not in ("scores", "reason")})
    return row

  stats = run_jobs(jobs, backend, cache, finish, rounds=1 + retries,
                   desc=desc, progress=progress)
  if any(skipped.values()):
    log.warning("%s: skipped %s", desc, skipped)
  return stats, skipped
