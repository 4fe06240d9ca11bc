"""AgentWorldBench scoring: the judge aggregate and judge-free text metrics.

Judge aggregate. A judged record is `{"task": domain, "id": ..., "scores": {dimension: 1-5}}`. A
dimension is valid when it is a real number (not a bool) in [1, 5]; a sample's score is the mean of
its valid dimensions; a sample with none (judge failed, scores missing or all out of range) is
excluded and counted, never scored 0. Domain score = (mean of sample scores - 1) / 4 * 100; the
overall is the unweighted mean of the domains that have at least one scored sample (the paper's
table), reported with the number of domains in it and flagged when that is fewer than the
benchmark's seven. The official client's `score` step prints another overall, the mean over all
scored samples pooled across domains; it is reported beside ours as `pooled_overall`. Rows judged
in the official style (`judge_style: official`, or read from the client's files) are scored by the
client's rules instead: a dimension counts unless it is 0 (a -2 or a JSON true, which is 1, is
averaged in), and a sample's total is the mean of its dimensions above 0.

Judge-free metrics (exact, token F1, edit similarity) live in `lwm_jax/textsim.py`; this module
aggregates them per domain.
"""
from __future__ import annotations

import collections
from typing import Any, Iterable, Mapping

from lwm_jax import domains as domains_lib
from lwm_jax.judge import DIMENSIONS, valid_score
from lwm_jax.textsim import FREE_METRICS



def bench_domains() -> tuple[str, ...]:
  """The benchmark's domains, from the domain registry (`lwm_jax.domains`): a result without one
  of them is `partial`."""
  return domains_lib.bench_domains()


def domain_of(task: str) -> str:
  """The domain named by a record's `task` ('agentworldbench/mcp' -> 'mcp')."""
  return task.rsplit("/", 1)[-1]


def sample_score(scores: Mapping[str, Any] | None) -> float | None:
  """Mean of a sample's valid dimensions, None when it has none."""
  if not isinstance(scores, Mapping):
    return None
  vals = [v for v in (valid_score(scores.get(d)) for d in DIMENSIONS) if v is not None]
  return sum(vals) / len(vals) if vals else None


def _official_int(v: Any) -> int | None:
  """A dimension as the official client stores it (an int; JSON true/false are 1/0), or None."""
  if isinstance(v, bool):
    return int(v)
  return v if isinstance(v, int) else None


def official_sample_score(scores: Mapping[str, Any] | None) -> float | None:
  """The official client's per-sample total: the mean of the dimensions above 0 (None when none
  is; such a sample enters the dimension means but not the totals)."""
  if not isinstance(scores, Mapping):
    return None
  vals = [v for v in (_official_int(scores.get(d)) for d in DIMENSIONS) if v is not None and v > 0]
  return sum(vals) / len(vals) if vals else None


def _is_official(rec: Mapping[str, Any]) -> bool:
  return rec.get("judge_style") == "official" or rec.get("source") == "official"


def to_percent(mean_1_to_5: float) -> float:
  return (mean_1_to_5 - 1.0) / 4.0 * 100.0


def aggregate(judged_records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
  """Per-domain and overall scores (0-100) of judged records, with sample and excluded counts.

  Returns {"domains": {domain: score}, "overall": score or None, "counts": {domain: scored n},
  "excluded": {domain: n}, "dimensions": {domain: {dimension: score}}, "n_domains": domains in
  the overall, "partial": True when a benchmark domain of the registry has no score,
  "pooled_overall": the official
  client's mean over all scored samples, or None}. A domain whose samples were all excluded
  appears in counts/excluded but not in domains, and does not enter either overall.
  """
  per_domain: dict[str, list[float]] = collections.defaultdict(list)
  per_dim: dict[str, dict[str, list[float]]] = collections.defaultdict(
      lambda: collections.defaultdict(list))
  excluded: dict[str, int] = collections.defaultdict(int)
  for i, rec in enumerate(judged_records):
    if "task" not in rec:
      raise ValueError(f"judged record {i} (id {rec.get('id')!r}) has no 'task'")
    dom = domain_of(str(rec["task"]))
    scores = rec.get("scores")
    if _is_official(rec):
      # The official client's rules: a judged sample's dimensions enter their means unless 0
      # (its invalid mark; -2 counts), its total (the mean of dimensions above 0) the domain's
      # unless it has none.
      if not isinstance(scores, Mapping) or rec.get("failed"):
        excluded[dom] += 1
        continue
      for d in DIMENSIONS:
        v = _official_int(scores.get(d))
        if v:
          per_dim[dom][d].append(float(v))
      s = official_sample_score(scores)
      if s is None:
        excluded[dom] += 1
      else:
        per_domain[dom].append(s)
      continue
    s = sample_score(scores)
    if s is None:
      excluded[dom] += 1
      continue
    per_domain[dom].append(s)
    for d in DIMENSIONS:
      v = valid_score(scores.get(d))
      if v is not None:
        per_dim[dom][d].append(v)
  all_domains = sorted(set(per_domain) | set(excluded))
  domains = {d: to_percent(sum(v) / len(v)) for d, v in per_domain.items()}
  overall = sum(domains.values()) / len(domains) if domains else None
  pooled = [v for vals in per_domain.values() for v in vals]
  return {
      "domains": {d: domains[d] for d in all_domains if d in domains},
      "overall": overall,
      "counts": {d: len(per_domain.get(d, [])) for d in all_domains},
      "excluded": {d: excluded.get(d, 0) for d in all_domains},
      "dimensions": {d: {k: to_percent(sum(v) / len(v)) for k, v in per_dim[d].items()}
                     for d in all_domains if d in per_dim},
      "n_domains": len(domains),
      "partial": any(d not in domains for d in bench_domains()),
      "pooled_overall": to_percent(sum(pooled) / len(pooled)) if pooled else None,
  }


# ---------------------------------------------------------------------------- judge-free metrics


def aggregate_free(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
  """Per-domain means (in percent) of judge-free metric rows `{"task", "exact", "token_f1",
  "edit_sim"}`; the overall is the unweighted mean of domains, as for the judge."""
  sums: dict[str, dict[str, list[float]]] = collections.defaultdict(
      lambda: collections.defaultdict(list))
  for r in rows:
    dom = domain_of(str(r["task"]))
    for k in FREE_METRICS:
      sums[dom][k].append(float(r[k]))
  out: dict[str, Any] = {"counts": {d: len(v["exact"]) for d, v in sorted(sums.items())}}
  for k in FREE_METRICS:
    doms = {d: 100.0 * sum(v[k]) / len(v[k]) for d, v in sorted(sums.items())}
    out[k] = {"domains": doms, "overall": sum(doms.values()) / len(doms) if doms else None}
  return out
