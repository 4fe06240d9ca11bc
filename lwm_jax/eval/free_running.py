"""Free-running evaluation: the world model writes each held-out observation itself.

For every selected turn of the held-out trajectories (the corpus's test split) the model sees the
system prompt (template variant 0, the evaluation template) and the TRUE history up to the action,
and generates the next observation greedily. The prediction (`parse_prediction`, header removed) is
compared with the real observation by the judge-free metrics of `lwm_jax/textsim.py` (exact
match, token F1, edit similarity), per domain, beside two baselines that need no model:
`copy_previous` (the observation before the action, '' at the first turn) and `empty`.

Caps for CPU runs, each counted in the report:
- `max_turns`: at most this many turns per domain, a seeded sample of all (trajectory, turn)
  pairs (so early and late turns and every trajectory are equally likely);
- `max_new_tokens`: generations cut at the cap are counted (`cut_at_max_new_tokens`);
- a prompt that does not fit the model's context beside `max_new_tokens` loses its oldest history
  turns (counted); one that does not fit even without history is not generated and scores as an
  empty prediction (`unanswered`), so every system is scored on the same turns.

Generation is batched across turns: the cases are sorted by prompt length and sent to the sampler
`batch_size` at a time. `write_report` writes free_running.md, free_running.json and one PNG per
metric (free_running_{metric}.png); `write_predictions` keeps every prediction for inspection.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Mapping, Sequence

from lwm_jax.data import prompts
from lwm_jax.data.reply import parse_prediction
from lwm_jax.data.schema import Trajectory
from lwm_jax.eval import records as R
from lwm_jax.eval import report as report_lib
from lwm_jax.eval import turn_kinds
from lwm_jax.eval.metrics import aggregate_free
from lwm_jax.textsim import FREE_METRICS, free_metrics
from lwm_jax.eval.teacher_forced import world_coverage
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import fit_chat

BASELINES = ("copy_previous", "empty")
EVAL_VARIANT = 0


@dataclasses.dataclass(frozen=True)
class Case:
  """One held-out turn: the chat up to its action and the real observation after it."""
  key: str                       # domain:trajectory id:turn (1-based)
  domain: str
  traj_id: str
  turn: int                      # 0-based index of the turn in its trajectory
  messages: tuple                # system prompt, true history, the action
  truth: str
  previous: str                  # the observation before the action ('' at the first turn)
  # what the real environment reported about the step at collection time (`Turn.env`): the
  # error it reported ("" none) and whether its state changed; None where it was not recorded
  error: str | None = None
  changed: bool | None = None


@dataclasses.dataclass
class Selection:
  cases: list[Case]
  turns_total: dict[str, int]      # per domain: turns in the split
  turns_selected: dict[str, int]   # per domain: turns evaluated (after max_turns)
  trajectories: list[Trajectory]   # those with at least one selected turn
  max_turns: int | None = None

  def describe(self) -> str:
    parts = [f"{report_lib.display(d)} {self.turns_selected.get(d, 0)} of {n}"
             for d, n in self.turns_total.items()]
    cap = f" (at most {self.max_turns} per domain)" if self.max_turns else ""
    return "Turns evaluated" + cap + ": " + ", ".join(parts) + "."


def _order(seed: int, traj_id: str, turn: int) -> int:
  h = hashlib.blake2b(f"{seed}\x1ffree\x1f{traj_id}\x1f{turn}".encode(), digest_size=8).digest()
  return int.from_bytes(h, "big")


def select_cases(trajs: Sequence[Trajectory], max_turns: int | None = None, seed: int = 0,
                 variant: int = EVAL_VARIANT) -> Selection:
  """The turns to evaluate: all of them, or a seeded sample of `max_turns` per domain."""
  if max_turns is not None and max_turns < 1:
    raise ValueError(f"max_turns must be >= 1 (or None for every turn), got {max_turns}")
  by_domain: dict[str, list[tuple[int, Trajectory, int]]] = {}
  for traj in trajs:
    for t in range(len(traj.turns)):
      by_domain.setdefault(traj.domain, []).append((_order(seed, traj.id, t), traj, t))
  doms = report_lib.ordered(by_domain)
  cases, total, chosen, used = [], {}, {}, {}
  for d in doms:
    pairs = by_domain[d]
    total[d] = len(pairs)
    picked = sorted(pairs, key=lambda p: p[0])[:max_turns] if max_turns else pairs
    picked = sorted(picked, key=lambda p: (p[1].id, p[2]))
    chosen[d] = len(picked)
    for _, traj, t in picked:
      used.setdefault(traj.id, traj)
      msgs = prompts.prompt_messages(traj, t, variant)
      facts = traj.turns[t].env or {}
      cases.append(Case(key=f"{d}:{traj.id}:{t + 1}", domain=d, traj_id=traj.id, turn=t,
                        messages=tuple(msgs), truth=traj.turns[t].observation,
                        previous=traj.turns[t - 1].observation if t else "",
                        error=facts.get("error"), changed=facts.get("changed")))
  return Selection(cases, total, chosen, list(used.values()), max_turns)


# --- generation -------------------------------------------------------------------------------
@dataclasses.dataclass
class GenerationStats:
  cases: int = 0
  batches: int = 0
  history_cut: int = 0             # cases whose oldest history turns were dropped to fit
  history_turns_dropped: int = 0
  unanswered: int = 0              # prompts too long even without history: empty prediction
  cut_at_max_new_tokens: int = 0   # generations that stopped at the token cap
  loop_guard: str = "off"          # the simulator's loop guard applied beside (`generate`)
  looped: int = 0                  # greedy replies that were loops
  loop_resamples: int = 0          # draws the guard made again
  loops_cut: int = 0               # replies the guard cut
  max_new_tokens: int = 0
  seconds: float = 0.0


def prompting(stage: str) -> tuple[int, str]:
  """(template variant, reply prefix) that a model of `stage` is evaluated with. An SFT or RL model
  answers the evaluation template (v0) from a bare assistant turn. A CPT model was trained on the
  CPT template (v1) with every observation behind the fixed `**Environment Observation:**` header,
  which carries no loss (docs/recipe.md), so it is prompted in that template with the header
  already written: the reply it learned to write starts after it."""
  if stage == "cpt":
    return prompts.variant_for("cpt", "", 0), prompts.format_observation("")
  return EVAL_VARIANT, ""


def generate(sampler: Any, cases: Sequence[Case], max_new_tokens: int = 256,
             batch_size: int = 8, progress: Any = None, reply_prefix: str = "",
             loop_guard: str = "off") -> tuple[dict[str, dict[str, Any]], GenerationStats]:
  """Greedy predictions of `sampler` (a `lwm_jax.sampling.Sampler`) for every case, batched by
  prompt length: {key: {"prediction", "raw", "finish_reason", "history_dropped"}} and stats.
  `reply_prefix` is written at the start of the assistant's reply before generation (see
  `prompting`); the raw reply recorded includes it. With `loop_guard` ("cut" or "resample", the
  simulator's guard: `lwm_jax.sim.env.guard_loops`), each entry also holds `guarded`, the
  prediction the guarded simulator would give, and `loop_guard`, what the guard did; the
  greedy `prediction` is kept as it is, so one run scores the model with and without it."""
  from lwm_jax.sim import env as sim_env  # pylint: disable=import-outside-toplevel
  if loop_guard not in sim_env.LOOP_GUARDS:
    raise ValueError(f"loop_guard: expected one of {', '.join(sim_env.LOOP_GUARDS)}, "
                     f"got {loop_guard!r}")
  if max_new_tokens < 1 or batch_size < 1:
    raise ValueError(f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens}, "
                     f"{batch_size}")
  t0 = time.time()
  stats = GenerationStats(cases=len(cases), max_new_tokens=max_new_tokens, loop_guard=loop_guard)
  prefix_ids = sampler.tokenizer.encode_content("assistant", reply_prefix) if reply_prefix else []
  budget = int(sampler.engine.context) - max_new_tokens - len(prefix_ids)
  out: dict[str, dict[str, Any]] = {}
  ready = []
  for c in cases:
    msgs, dropped = fit_chat(sampler, c.messages, budget)
    stats.history_cut += int(dropped > 0)
    stats.history_turns_dropped += dropped
    if msgs is None:
      stats.unanswered += 1
      out[c.key] = {"prediction": "", "raw": "", "finish_reason": "unanswered",
                    "history_dropped": dropped}
      continue
    ids = sampler.encode_prompt(msgs)
    ready.append((len(ids) + len(prefix_ids), c, ids + prefix_ids if prefix_ids else msgs,
                  dropped))
  ready.sort(key=lambda r: r[0])
  params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
  for start in range(0, len(ready), batch_size):
    chunk = ready[start:start + batch_size]
    prompts_ = [r[2] for r in chunk]
    gens = sampler.generate(prompts_, params)
    stats.batches += 1
    guarded, loops = (sim_env.guard_loops(sampler, [loop_guard] * len(chunk), prompts_,
                                          [params] * len(chunk), gens)
                      if loop_guard != "off" else (gens, [None] * len(chunk)))
    for (_, c, _, dropped), g, gg, loop in zip(chunk, gens, guarded, loops):
      stats.cut_at_max_new_tokens += int(g.finish_reason == "length")
      raw = reply_prefix + g.text
      out[c.key] = {"prediction": R.clean_prediction(parse_prediction(raw)), "raw": raw,
                    "finish_reason": g.finish_reason, "history_dropped": dropped}
      if loop is not None:
        pred = R.clean_prediction(parse_prediction(reply_prefix + gg.text))
        out[c.key].update(guarded=turn_kinds.cut_loop(pred) if loop["cut"] else pred,
                          loop_guard=loop)
        stats.looped += loop["looped"]
        stats.loop_resamples += loop["resamples"]
        stats.loops_cut += loop["cut"]
    if progress is not None:
      progress(min(start + batch_size, len(ready)), len(ready))
  stats.seconds = round(time.time() - t0, 2)
  return out, stats


def baseline_predictions(cases: Sequence[Case]) -> dict[str, dict[str, str]]:
  """{baseline: {key: prediction}} for copy_previous and empty."""
  return {"copy_previous": {c.key: c.previous for c in cases},
          "empty": {c.key: "" for c in cases}}


# --- scoring and report -----------------------------------------------------------------------
def score(cases: Sequence[Case], predictions: Mapping[str, str]) -> list[dict[str, Any]]:
  """One metric row per case: {"key", "task", "exact", "token_f1", "edit_sim"}."""
  missing = [c.key for c in cases if c.key not in predictions]
  if missing:
    raise ValueError(f"no prediction for {len(missing)} cases (first: {missing[0]})")
  return [{"key": c.key, "task": c.domain, **free_metrics(str(predictions[c.key]), c.truth)}
          for c in cases]


def results(selection: Selection, systems: Mapping[str, Mapping[str, str]],
            generation: Mapping[str, GenerationStats] | None = None,
            train: Sequence[Trajectory] | None = None) -> dict[str, Any]:
  """The table of every system (models first, then the baselines), in the shape
  `lwm_jax.eval.report.plot` draws, plus the selection, the generation counts and the worlds."""
  cases = selection.cases
  names = [n for n in systems if n not in BASELINES]
  base = baseline_predictions(cases)
  table: dict[str, Any] = {}
  for name in names + list(BASELINES):
    preds = systems.get(name, base.get(name))
    entry: dict[str, Any] = {"free": aggregate_free(score(cases, preds)),
                             "kinds": turn_kinds.turn_kinds(cases, preds),
                             "missing_predictions": 0, "judge": None}
    if generation and name in generation:
      entry["generation"] = dataclasses.asdict(generation[name])
    table[name] = entry
  cov = world_coverage(selection.trajectories, train or [])
  worlds = dataclasses.asdict(cov) | {"describe": cov.describe()}
  if train is None:
    worlds["seen_in_train"] = None
    worlds["describe"] = (f"worlds: {cov.worlds} distinct among {cov.trajectories} trajectories "
                          f"({cov.missing} without a world id), not checked against training")
  n_records: dict[str, int] = {}
  for c in cases:
    n_records[c.domain] = n_records.get(c.domain, 0) + 1
  return {"domains": list(n_records), "n_records": n_records, "systems": table,
          "selection": {"turns_total": selection.turns_total,
                        "turns_selected": selection.turns_selected,
                        "max_turns": selection.max_turns, "describe": selection.describe()},
          "worlds": worlds}


def versus(res: Mapping[str, Any], system: str, baseline: str = "copy_previous",
           metric: str = "token_f1") -> dict[str, Any]:
  """`system`'s margin over `baseline` on `metric` (points), per domain and overall, and the
  domains where it is ahead."""
  a = res["systems"][system]["free"][metric]
  b = res["systems"][baseline]["free"][metric]
  margin = {d: a["domains"][d] - b["domains"][d] for d in a["domains"]}
  return {"margin": margin, "overall": a["overall"] - b["overall"],
          "ahead": [d for d, m in margin.items() if m > 0], "domains": len(margin)}


def _table(res: Mapping[str, Any], metric: str) -> list[str]:
  doms = res["domains"]
  lines = ["| System | " + " | ".join(report_lib.display(d) for d in doms)
           + " | **Overall** |", "|:--" + "|:-:" * (len(doms) + 1) + "|"]
  for name, e in res["systems"].items():
    agg = e["free"][metric]
    lines.append(f"| {name} | " + " | ".join(f"{agg['domains'][d]:.2f}" for d in doms)
                 + f" | **{agg['overall']:.2f}** |")
  return lines


def _sentence(text: str) -> str:
  return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def markdown(res: Mapping[str, Any], title: str = "Free-running evaluation") -> str:
  n = res["n_records"]
  lines = [f"# {title}", "",
           "Greedy generation of every selected held-out turn given the true history (system "
           "prompt variant 0). Baselines: `copy_previous` repeats the observation before the "
           "action ('' at the first turn); `empty` predicts nothing. Overall = unweighted mean "
           "of the domains.", "",
           "Turns per domain: " + ", ".join(f"{report_lib.display(d)} {n[d]}"
                                            for d in res["domains"]) + ".",
           res["selection"]["describe"], _sentence(res["worlds"]["describe"])]
  for metric in FREE_METRICS:
    lines += ["", f"## {report_lib.METRIC_TITLES[metric]}", "", *_table(res, metric)]
  lines += turn_kinds.markdown(res)
  models = [s for s in res["systems"] if s not in BASELINES]
  if models:
    lines += ["", "## Token F1 margin over copy-previous (points)", "",
              "| System | " + " | ".join(report_lib.display(d) for d in res["domains"])
              + " | **Overall** | Domains ahead |",
              "|:--" + "|:-:" * (len(res["domains"]) + 2) + "|"]
    for s in models:
      v = versus(res, s)
      lines.append(f"| {s} | " + " | ".join(f"{v['margin'][d]:+.2f}" for d in res["domains"])
                   + f" | **{v['overall']:+.2f}** | {len(v['ahead'])} of {v['domains']} |")
    lines += ["", "## Generation", "",
              "| System | Turns | Batches | History cut | Unanswered | Cut at max_new_tokens "
              "| Seconds |", "|:--|:-:|:-:|:-:|:-:|:-:|:-:|"]
    for s in models:
      g = res["systems"][s].get("generation")
      if g:
        lines.append(f"| {s} | {g['cases']} | {g['batches']} | {g['history_cut']} | "
                     f"{g['unanswered']} | {g['cut_at_max_new_tokens']} (cap "
                     f"{g['max_new_tokens']}) | {g['seconds']:.1f} |")
    for s in models:
      g = res["systems"][s].get("generation") or {}
      if g.get("loop_guard", "off") != "off":
        lines.append(f"\n{s}+{g['loop_guard']}: the simulator's loop guard on the same replies: "
                     f"{g['looped']} of {g['cases']} greedy replies were loops; "
                     f"{g['loop_resamples']} drawn again, {g['loops_cut']} cut.")
  return "\n".join(lines) + "\n"


def write_report(res: Mapping[str, Any], out_dir: str, stem: str = "free_running",
                 title: str = "Free-running evaluation") -> dict[str, str]:
  """Writes {stem}.json, {stem}.md and {stem}_{metric}.png under `out_dir`; returns the paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {"json": os.path.join(out_dir, f"{stem}.json"),
           "markdown": os.path.join(out_dir, f"{stem}.md")}
  with open(paths["json"], "w", encoding="utf-8") as f:
    json.dump(res, f, indent=2)
  with open(paths["markdown"], "w", encoding="utf-8") as f:
    f.write(markdown(res, title))
  for metric in FREE_METRICS:
    p = os.path.join(out_dir, f"{stem}_{metric}.png")
    if report_lib.plot(dict(res), metric, p):
      paths[f"png_{metric}"] = p
  return paths


def write_predictions(cases: Sequence[Case], preds: Mapping[str, Mapping[str, Any]], path: str
                      ) -> None:
  """One JSON row per case: key, domain, trajectory, turn, world, truth and the prediction."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for c in cases:
      row = {"key": c.key, "domain": c.domain, "trajectory": c.traj_id, "turn": c.turn + 1,
             "truth": c.truth, **preds[c.key]}
      f.write(json.dumps(row, ensure_ascii=False) + "\n")

