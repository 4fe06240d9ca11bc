"""Scoring a run directory and reporting it: markdown tables, a JSON file and bar charts.

The markdown follows the layout of the paper's Table 5: one row per system (the model(s) and the
baselines), one column per domain in the order MCP, Search, Terminal, SWE, Android, Web, OS, then
the overall. Judge scores come with their excluded counts; the judge-free metrics get a table each.
A line under the sample counts says which worlds the records cover (their `world` field, written by
tools/make_corpus.py) and, when the training worlds are given, how many of them training has seen.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable

from lwm_jax import domains as domains_lib
from lwm_jax.data.bench_records import AWBRecord
from lwm_jax.eval import inference as A
from lwm_jax.eval import records as R
from lwm_jax.eval import turn_kinds
from lwm_jax.eval.metrics import aggregate, aggregate_free
from lwm_jax.textsim import FREE_METRICS, free_metrics



def display(domain: str) -> str:
  """A domain's table heading: its record's `display`, else the name itself (a result may carry
  a domain this installation does not register)."""
  return domains_lib.get_domain(domain).display if domains_lib.is_domain(domain) else domain


def ordered(names: Iterable[str]) -> list[str]:
  """`names` in the registry's order (the benchmark's columns), unregistered ones last, sorted."""
  names = set(names)
  known = domains_lib.names()
  return [d for d in known if d in names] + sorted(d for d in names if d not in known)

METRIC_TITLES = {"judge": "Judge score: five-dimension rubric mean, 0-100",
                 "exact": "Exact match, %", "token_f1": "Token F1, %",
                 "edit_sim": "Edit similarity, %"}


def world_coverage(records: Iterable[AWBRecord], train_worlds: set[str] | None = None
                   ) -> dict[str, Any]:
  """Distinct worlds of the records per domain (their `world` field), records without one, and
  with `train_worlds` how many of the worlds training has seen (else None)."""
  per: dict[str, set[str]] = {}
  missing = 0
  for r in records:
    w = r.extra.get("world")
    if isinstance(w, str) and w:
      per.setdefault(R.domain(r), set()).add(w)
    else:
      missing += 1
  every = set().union(*per.values()) if per else set()
  return {"worlds": {d: len(v) for d, v in per.items()}, "total": len(every),
          "records_without_world": missing,
          "seen_in_train": None if train_worlds is None else len(every & train_worlds)}


def coverage_line(cov: dict[str, Any]) -> str:
  """The report's sentence on which worlds the records cover."""
  if not cov["total"]:
    return ("Worlds: the records carry no world id, so this report cannot say whether their "
            "worlds were seen in training.")
  text = (f"Worlds: {cov['total']} distinct (" + ", ".join(
      f"{display(d)} {n}" for d, n in cov["worlds"].items()) + ")")
  if cov["seen_in_train"] is None:
    text += ("; not checked against a training corpus (the bundled mini benchmark comes from the "
             "corpus's test split, whose worlds tools/make_corpus.py keeps out of training)")
  elif cov["seen_in_train"] == 0:
    text += "; none of them seen in training"
  else:
    text += (f"; {cov['seen_in_train']} of them seen in training (seen worlds, new episodes: "
             "those samples measure recall of a known world, not generalisation)")
  if cov["records_without_world"]:
    text += f"; {cov['records_without_world']} records carry no world id"
  return text + "."


def score_run(records: Iterable[AWBRecord], out_dir: str, row_format: str = "auto",
              train_worlds: set[str] | None = None) -> dict[str, Any]:
  """Judge-free metrics of every predictions file and the aggregate of every judged file.

  Files may be ours or the official client's (`row_format`: auto, ours, official); nothing is
  written. `train_worlds` (world ids of the training data) lets the report count the records'
  worlds that training has seen."""
  recs = list(records)
  by_key = {R.record_key(r): r for r in recs}
  truths = {k: R.ground_truth(r) for k, r in by_key.items()}
  n_records: dict[str, int] = {}
  for r in recs:
    n_records[R.domain(r)] = n_records.get(R.domain(r), 0) + 1
  systems: dict[str, Any] = {}
  for name in A.list_systems(out_dir, A.PRED_DIR):
    preds = A.load_predictions(A.predictions_path(out_dir, name), row_format)
    rows, missing, cases = [], 0, []
    for key, truth in truths.items():
      if truth is None:
        continue
      if key not in preds:
        missing += 1
        continue
      rows.append({"task": by_key[key].task, **free_metrics(str(preds[key]["prediction"]), truth)})
      cases.append(turn_kinds.case_of_record(by_key[key], key, truth))
    entry: dict[str, Any] = {"free": aggregate_free(rows), "missing_predictions": missing,
                             "judge": None,
                             "kinds": turn_kinds.turn_kinds(
                                 cases, {c.key: str(preds[c.key]["prediction"]) for c in cases})}
    judged_file = A.judged_path(out_dir, name)
    if os.path.exists(judged_file):
      judged = [row for k, row in A.load_judged(judged_file, row_format).items() if k in by_key]
      entry["judge"] = aggregate(judged)
      entry["judge"]["not_judged"] = sum(1 for k, t in truths.items()
                                         if t is not None and k in preds) - len(judged)
    systems[name] = entry
  domains = ordered(n_records)
  return {"domains": domains, "n_records": n_records, "systems": systems,
          "worlds": world_coverage(recs, train_worlds)}


def _cell(v: float | None) -> str:
  return "-" if v is None else f"{v:.2f}"


def _table(results: dict[str, Any], metric: str) -> str | None:
  doms = results["domains"]
  head = "| System | " + " | ".join(display(d) for d in doms) + " | **Overall** |"
  lines = [head, "|:--" + "|:-:" * (len(doms) + 1) + "|"]
  any_row = False
  for name, entry in results["systems"].items():
    if metric == "judge":
      agg = entry["judge"]
      if agg is None:
        continue
      cells = []
      for d in doms:
        ex = agg["excluded"].get(d, 0)
        cells.append(_cell(agg["domains"].get(d)) + (f" ({ex} excl.)" if ex else ""))
    else:
      agg = entry["free"][metric]
      cells = [_cell(agg["domains"].get(d)) for d in doms]
    any_row = True
    overall = f"**{_cell(agg['overall'])}**"
    if metric == "judge" and agg["overall"] is not None and agg.get("partial"):
      overall += f" ({agg['n_domains']} of 7 domains)"
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {overall} |")
  return "\n".join(lines) if any_row else None


def markdown_report(results: dict[str, Any]) -> str:
  n = results["n_records"]
  parts = ["# AgentWorldBench results", "",
           "Samples per domain: " + ", ".join(f"{display(d)} {n[d]}"
                                             for d in results["domains"]) + ".",
           *([coverage_line(results["worlds"])] if "worlds" in results else []),
           "Baselines: `copy_previous` repeats the observation before the action; `empty` predicts "
           "nothing. Overall = unweighted mean of the domains present (the paper's table)."]
  for metric in ("judge", *FREE_METRICS):
    table = _table(results, metric)
    if table:
      parts += ["", f"## {METRIC_TITLES[metric]}", "", table]
  parts += turn_kinds.markdown(results)
  overall = _overall_table(results)
  if overall:
    parts += ["", "## Judge overall, two ways", "",
              "Mean of domains: the unweighted mean of the domain scores (the paper's table). "
              "Pooled: the mean over all scored samples, as the official client's `score` step "
              "prints it. An overall over fewer than seven domains is flagged.", "", overall]
  notes = []
  for name, e in results["systems"].items():
    if e["missing_predictions"]:
      notes.append(f"- {name}: {e['missing_predictions']} samples without a prediction "
                   "(inference failed; rerun `infer` to retry), left out of every metric.")
    if e["judge"] and e["judge"].get("not_judged"):
      notes.append(f"- {name}: {e['judge']['not_judged']} predictions not judged yet "
                   "(judge call failed; rerun `judge`).")
  if notes:
    parts += ["", "## Notes", "", *notes]
  return "\n".join(parts) + "\n"


def _overall_table(results: dict[str, Any]) -> str | None:
  lines = ["| System | Mean of domains | Domains | Pooled (official client) | Scored samples |",
           "|:--|:-:|:-:|:-:|:-:|"]
  for name, entry in results["systems"].items():
    agg = entry["judge"]
    if agg is None:
      continue
    n = agg.get("n_domains", len(agg["domains"]))
    flag = f"{n} of 7" + (" (partial)" if agg.get("partial", n < 7) else "")
    lines.append(f"| {name} | {_cell(agg['overall'])} | {flag} | "
                 f"{_cell(agg.get('pooled_overall'))} | {sum(agg['counts'].values())} |")
  return "\n".join(lines) if len(lines) > 2 else None


def plot(results: dict[str, Any], metric: str, path: str) -> bool:
  """One figure per metric, one bar chart per domain (and the overall), a bar per system."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names, aggs = [], []
  for name, e in results["systems"].items():
    agg = e["judge"] if metric == "judge" else e["free"][metric]
    if agg is not None:
      names.append(name)
      aggs.append(agg)
  if not names:
    return False
  panels = results["domains"] + ["overall"]
  cols = min(4, len(panels))
  rows = (len(panels) + cols - 1) // cols
  fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
  colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(names))]
  for ax, panel in zip(axes.flat, panels):
    vals = [(a["overall"] if panel == "overall" else a["domains"].get(panel)) or 0.0
            for a in aggs]
    ax.bar(range(len(names)), vals, color=colors)
    ax.set_title(display(panel) if domains_lib.is_domain(panel) else panel.capitalize(), fontsize=10)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, 100)
    for i, v in enumerate(vals):
      ax.text(i, v + 1, f"{v:.1f}", ha="center", fontsize=7)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  fig.suptitle(METRIC_TITLES[metric], fontsize=11)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def write_report(results: dict[str, Any], out_dir: str) -> dict[str, str]:
  """Writes scores.json, scores.md and scores_{metric}.png; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {"json": os.path.join(out_dir, "scores.json"),
           "markdown": os.path.join(out_dir, "scores.md")}
  with open(paths["json"], "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2, sort_keys=False)
  with open(paths["markdown"], "w", encoding="utf-8") as f:
    f.write(markdown_report(results))
  for metric in ("judge", *FREE_METRICS):
    p = os.path.join(out_dir, f"scores_{metric}.png")
    if plot(results, metric, p):
      paths[f"png_{metric}"] = p
  return paths
