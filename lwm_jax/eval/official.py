"""The official AgentWorldBench client's row shapes, read and written next to ours.

The official client (QwenLM/Qwen-AgentWorld, `eval/eval.py infer|judge|score`) keeps one file per
step, each row the whole benchmark record plus what the step added:

- prediction rows: the record and `gen`, the model's reply text (`message.content`; '' when the
  call failed);
- judged rows: the prediction row plus the five dimensions at top level (integers 1-5, 0 for
  invalid), `total_score` (mean of the valid dimensions, 0 when none), `failed` (0.0 or 1.0),
  and the judge's notes.

Our files are keyed rows (`predictions/{system}.jsonl`: key, task, id, prediction, raw;
`judged/{system}.jsonl`: key, task, id, scores or null, failed). `sniff` tells the shapes apart
from a row's fields; `read_predictions` / `read_judged` turn either shape into ours (never writing
anything), and `export_run` writes a run's files in the official shapes, so the official `judge`
and `score` steps read them. See docs/benchmark.md.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable, Mapping

from lwm_jax.data.bench_records import AWBRecord
from lwm_jax.data.reply import parse_prediction
from lwm_jax.eval import records as R
from lwm_jax.eval.metrics import DIMENSIONS, sample_score, valid_score
from lwm_jax.eval.runner import ForeignFileError, read_rows, scan_jsonl

log = logging.getLogger(__name__)


def _tally(path: str, rows: list, judged: bool, report: dict | None) -> dict[str, int]:
  """Counts what an official file holds that our rows cannot keep as it is: a key seen before
  (the later row wins), a domain the bundled schema does not know, a score outside 1..5 or not a
  number, a field named like a score dimension that is not one. Logged as one warning and added
  to `report` (when given); nothing here is dropped without being counted."""
  from lwm_jax import domains as domains_lib  # pylint: disable=import-outside-toplevel
  counts = {"rows": len(rows), "duplicate_keys": 0, "unknown_domains": 0,
            "out_of_range_scores": 0, "unknown_dimensions": 0}
  seen: set[str] = set()
  for rec, row, _ in rows:
    key = R.record_key(rec)
    counts["duplicate_keys"] += key in seen
    seen.add(key)
    counts["unknown_domains"] += not domains_lib.is_domain(R.domain(rec))
    if judged and not row.get("failed"):
      # 0 is the official judge's mark of an invalid dimension (left out of the mean)
      counts["out_of_range_scores"] += sum(
          d in row and valid_score(row.get(d)) is None and not (
              row.get(d) == 0 and not isinstance(row.get(d), bool)) for d in DIMENSIONS)
      counts["unknown_dimensions"] += sum(
          k.lower() in {d.lower() for d in DIMENSIONS} and k not in DIMENSIONS for k in row)
  bad = {k: v for k, v in counts.items() if k != "rows" and v}
  if bad:
    log.warning("%s: %s", path, ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in bad.items()))
  if report is not None:
    report.update(counts)
  return counts

OURS, OFFICIAL = "ours", "official"
ROW_FORMATS = ("auto", OURS, OFFICIAL)


def sniff(row: Mapping[str, Any]) -> str:
  """'ours' for a keyed row, 'official' for a row that is a whole record (with `gen` or the
  judge's fields); raises ValueError for anything else."""
  if isinstance(row.get("key"), str):
    return OURS
  if "turn_idx" in row and "task" in row and ("gen" in row or "failed" in row):
    return OFFICIAL
  raise ValueError(f"neither our row (no 'key') nor an official client row (no 'gen'/'failed' "
                   f"next to a record); keys: {', '.join(list(row)[:8])}")


def file_format(path: str) -> str:
  """The shape of a results file, from its first row ('ours' for an empty file)."""
  found: list[str] = []

  class _Stop(Exception):
    pass

  def first(row: dict[str, Any], where: str) -> None:
    try:
      found.append(sniff(row))
    except ValueError as e:
      raise ForeignFileError(f"{where}: {e}") from None
    raise _Stop

  try:
    scan_jsonl(path, first)
  except _Stop:
    pass
  return found[0] if found else OURS


def _official_rows(path: str) -> list[tuple[AWBRecord, dict[str, Any], str]]:
  rows: list[tuple[AWBRecord, dict[str, Any], str]] = []

  def parse(row: dict[str, Any], where: str) -> None:
    try:
      rec = AWBRecord.from_dict(row)
    except ValueError as e:
      raise ForeignFileError(f"{where}: not an official client row: {e}") from None
    rows.append((rec, row, where))

  scan_jsonl(path, parse)
  return rows


def prediction_from_gen(gen: str) -> str:
  """The observation our pipeline reads from a reply: the last answer block, thinking removed."""
  return R.clean_prediction(parse_prediction(gen))


def read_predictions(path: str, row_format: str = "auto",
                     report: dict | None = None) -> dict[str, dict[str, Any]]:
  """A predictions file of either shape as our rows by key; writes nothing. For an official
  file, what cannot be kept as it is is counted (`_tally`) into `report` and logged."""
  fmt = file_format(path) if row_format == "auto" else row_format
  if fmt == OURS:
    return read_rows(path)
  out: dict[str, dict[str, Any]] = {}
  rows = _official_rows(path)
  _tally(path, rows, False, report)
  for rec, row, where in rows:
    gen = row.get("gen", "")
    if not isinstance(gen, str):
      raise ForeignFileError(f"{where}: field 'gen' is a {type(gen).__name__}, not a string")
    key = R.record_key(rec)
    out[key] = {"key": key, "task": R.domain(rec), "id": rec.id,
                "prediction": prediction_from_gen(gen), "raw": gen, "source": OFFICIAL}
  return out


def _official_scores(row: Mapping[str, Any], where: str) -> dict[str, float | None] | None:
  failed = row.get("failed")
  if isinstance(failed, str) or not isinstance(failed, (int, float)):
    raise ForeignFileError(f"{where}: field 'failed' is {failed!r}, expected 0 or 1")
  if failed:
    return None
  # Kept as the client recorded them (-2 and 0 included); `metrics.aggregate` reads rows from
  # this source by the client's rules.
  return {d: row.get(d) for d in DIMENSIONS}


def read_judged(path: str, row_format: str = "auto",
                report: dict | None = None) -> dict[str, dict[str, Any]]:
  """A judged file of either shape as our rows by key (failed rows keep `scores: null`); for an
  official file, what cannot be kept as it is is counted into `report` and logged (`_tally`)."""
  fmt = file_format(path) if row_format == "auto" else row_format
  if fmt == OURS:
    return read_rows(path)
  out: dict[str, dict[str, Any]] = {}
  rows = _official_rows(path)
  _tally(path, rows, True, report)
  for rec, row, where in rows:
    if "failed" not in row:
      raise ForeignFileError(f"{where}: an official prediction row (no 'failed'), not a judged "
                             "row: run the judge on it first")
    key = R.record_key(rec)
    scores = _official_scores(row, where)
    out[key] = {"key": key, "task": R.domain(rec), "id": rec.id, "scores": scores,
                "failed": scores is None, "reason": row.get("error_message", ""),
                "source": OFFICIAL}
  return out


# ------------------------------------------------------------------------------------ export


def _number(v: float | None) -> int | float:
  if v is None:
    return 0
  return int(v) if float(v).is_integer() else v


def prediction_row(rec: AWBRecord, pred: Mapping[str, Any]) -> dict[str, Any]:
  """The official prediction row of one record: the whole record plus `gen`.

  `gen` is the reply as the model wrote it when we have it (`raw`), else the parsed prediction
  (the baselines), so the official parser finds the same observation we scored."""
  gen = pred.get("raw")
  if not isinstance(gen, str):
    gen = str(pred.get("prediction", ""))
  return {**rec.to_dict(), "gen": gen}


def judged_row(rec: AWBRecord, pred: Mapping[str, Any], judged: Mapping[str, Any]
               ) -> dict[str, Any]:
  """The official judged row: the prediction row, the five dimensions, total_score, failed."""
  row = prediction_row(rec, pred)
  scores = judged.get("scores")
  total = sample_score(scores)
  if total is None:
    row.update({d: 0 for d in DIMENSIONS})
    row.update({"total_score": 0, "failed": 1.0, "error_message": "Judge scoring failed"})
    return row
  row.update({d: _number(valid_score(scores.get(d))) for d in DIMENSIONS})
  row.update({"total_score": total, "failed": 0.0})
  if judged.get("reason"):
    row["judge_raw_output"] = str(judged.get("judge_raw") or judged["reason"])
  return row


def _write(path: str, rows: Iterable[dict[str, Any]]) -> int:
  """Writes a new export file (atomically; an export is derived data, regenerated each time)."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = path + ".part"
  n = 0
  with open(tmp, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
      n += 1
  os.replace(tmp, path)
  return n


def export_system(records: Iterable[AWBRecord], preds: Mapping[str, Mapping[str, Any]],
                  judged: Mapping[str, Mapping[str, Any]] | None, out_prefix: str
                  ) -> dict[str, int]:
  """Writes `{out_prefix}_predictions.jsonl` (and `_judged.jsonl` when judged rows are given) in
  the official shapes; records without a prediction (or judgement) are left out and counted."""
  recs = [r for r in records]
  with_pred = [(r, preds[R.record_key(r)]) for r in recs if R.record_key(r) in preds]
  counts = {"predictions": _write(out_prefix + "_predictions.jsonl",
                                  (prediction_row(r, p) for r, p in with_pred)),
            "no_prediction": len(recs) - len(with_pred)}
  if judged is not None:
    both = [(r, p, judged[R.record_key(r)]) for r, p in with_pred if R.record_key(r) in judged]
    counts["judged"] = _write(out_prefix + "_judged.jsonl",
                              (judged_row(r, p, j) for r, p, j in both))
    counts["not_judged"] = len(with_pred) - len(both)
  return counts


def is_empty_generation(pred: Mapping[str, Any]) -> bool:
  """The official client's test: the model's reply text (`raw`, else the prediction) is ''."""
  raw = pred.get("raw")
  return (raw if isinstance(raw, str) else str(pred.get("prediction", ""))) == ""
