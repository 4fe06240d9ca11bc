"""Does a world model learn to follow simulation instructions from perturbed real trajectories?
The logic of `launch/perturb_experiment.py` (docs/perturbations.md), over a config of
configs/perturb_experiment.py (its fields are documented there).

1. Two copies of the corpus's domains with real perturbations (mcp, search, web), regenerated
   by tools/make_corpus.py: WORKDIR/corpus_perturbed with `perturb_share` (0.5) and
   WORKDIR/corpus_plain with none (the bundled corpus itself carries a quarter). Their episodes
   are the bundled corpus's (same seeds, same worlds, same splits); in the perturbed copy about
   half of them were played under an instruction of the domain's menu
   (`lwm_jax.envs.perturb.corpus_menu()`), so their system prompts carry the instruction and their
   observations show the real misbehaviour; the others are the same as the plain copy's.
2. Two SFT runs from the same start at equal compute (same steps, rows, row length, learning
   rate, seed; only the data differ): `perturbed` on the perturbed copy's training split,
   `plain` on the plain copy's. With `paired` the perturbed run's split also holds the plain
   twin of each of its perturbed episodes (`paired_copy`).
3. Instruction fidelity (evals/fidelity.py) of the start and of both runs, on the same held-out
   episodes (test-split seeds, played for real under each menu perturbation; their actions
   replayed in the world model with and without the instruction), sampled at `temperature`:
   a rate-type instruction ("20% of the calls fail") can only show at its rate when sampled.
4. results.md, results.json and fidelity.png in the run folder (the per-model fidelity reports
   are in WORKDIR/fidelity_<model>/).

The comparison asks one thing: given the instruction, does the `perturbed` model show the asked
behaviour more often than the `plain` one? The "without instruction" rates say how much of it the
model does unprompted.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import ml_collections

from configs import perturb_experiment as perturb_config, stages
from lwm_jax import recipe
from lwm_jax.data import corpus as corpus_lib
from lwm_jax.data.jsonl import iter_jsonl, open_text
from lwm_jax.envs import perturb
from lwm_jax.eval import fidelity
from lwm_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Settings = ml_collections.FrozenConfigDict  # a config of configs/perturb_experiment.py, resolved
THINKING = ("auto", "on", "off")
THINKING_TARGETS = ("", "instruction")


def resolve(config: ml_collections.ConfigDict) -> Settings:
  """`config` (configs/perturb_experiment.py) checked before any work, each error naming its
  field as it is overridden on the command line; `domains` becomes a tuple of names."""
  v = dict(config)
  known = perturb_config.get_config()
  bad_field = recipe.unknown_field(v, known, "configs/perturb_experiment.py")
  if bad_field:
    raise ValueError(bad_field)
  if v["thinking"] not in THINKING:
    raise ValueError(f"--config.thinking: {v['thinking']!r} is not one of {', '.join(THINKING)}")
  if v["thinking_target"] not in THINKING_TARGETS:
    raise ValueError(f"--config.thinking_target: {v['thinking_target']!r} is not '' or "
                     "instruction")
  if v["thinking_target"] == "instruction" and v["thinking"] == "off":
    raise ValueError("--config.thinking_target=instruction needs thinking-mode targets (not "
                     "--config.thinking=off)")
  domains = tuple(d.strip() for d in str(v["domains"]).split(",") if d.strip())
  bad = [d for d in domains if d not in perturb.corpus_menu()]
  if bad:
    raise ValueError(f"--config.domains: '{bad[0]}' has no real perturbations "
                     f"(use {', '.join(perturb.corpus_menu())})")
  try:  # a bad menu fails here, before any work
    perturb.parse_menu(v["menu"], domains, "--config.menu")
  except (ValueError, NotImplementedError) as e:
    text = str(e)
    raise ValueError(text if text.startswith("--config.menu") else f"--config.menu: {text}") \
        from None
  v["domains"] = domains
  return Settings(v)


MODELS = ("start", "plain", "perturbed")


def _corpus_copy(s: Settings, wd: str, domains: list[str], name: str, share: float) -> str:
  """The perturbable domains of the bundled corpus regenerated into WORKDIR/corpus_<name> with
  `share` of their episodes played under a menu perturbation (same seeds, worlds and splits)."""
  out = os.path.join(wd, f"corpus_{name}")
  if s.reuse and os.path.exists(os.path.join(out, "MANIFEST.json")):
    return out
  shutil.rmtree(out, ignore_errors=True)
  with open(os.path.join(s.corpus, "MANIFEST.json")) as f:
    manifest = json.load(f)
  cmd = [sys.executable, os.path.join(ROOT, "tools", "make_corpus.py"),
         f"--per_domain={s.per_domain or manifest['per_domain']}", f"--seed={manifest['seed']}",
         f"--domains={','.join(domains)}", f"--perturb_share={share}",
         *([f"--menu={s.menu}"] if s.menu and share > 0 else []),
         f"--corpus_dir={out}", f"--bench_dir={os.path.join(wd, 'bench_' + name)}"]
  print(f"{name} copy:", " ".join(cmd[1:]), flush=True)
  subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
  return out


def paired_copy(wd: str, domains: list[str], perturbed: str, plain: str) -> tuple[str, dict]:
  """WORKDIR/corpus_paired: per domain, the perturbed copy's training split followed by the plain
  copy's version of each training episode that carries an instruction there (its twin: same id,
  seed and world), and the perturbed copy's validation split. Returns the folder and, per domain,
  how many twins were added. A perturbed episode without a twin is an error (the copies must come
  from the same seeds)."""
  out = os.path.join(wd, "corpus_paired")
  os.makedirs(out, exist_ok=True)
  added = {}
  for d in domains:
    train = [rec for _, rec in iter_jsonl(os.path.join(perturbed, f"{d}_train.jsonl.gz"))]
    wanted = {rec["id"] for rec in train if str(rec.get("simulation_instruction", "")).strip()}
    path = os.path.join(plain, f"{d}_train.jsonl.gz")
    twins = [rec for _, rec in iter_jsonl(path) if rec["id"] in wanted]
    missing = wanted - {rec["id"] for rec in twins}
    if missing:
      raise SystemExit(f"{path}: no plain twin for {len(missing)} perturbed episodes "
                       f"(e.g. {sorted(missing)[0]}); were both copies made from the same seeds?")
    with open_text(os.path.join(out, f"{d}_train.jsonl.gz"), "w") as f:
      for rec in train + twins:
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    shutil.copyfile(os.path.join(perturbed, f"{d}_validation.jsonl.gz"),
                    os.path.join(out, f"{d}_validation.jsonl.gz"))
    added[d] = len(twins)
  return out, added


def _files(folder: str, domains: list[str], split: str) -> str:
  paths = [os.path.join(folder, f"{d}_{split}.jsonl.gz") for d in domains]
  for p in paths:
    if not os.path.exists(p):
      raise SystemExit(f"{p} is missing")
  return ",".join(paths)


def _thinking(s: Settings, start_hf: str) -> bool:
  """SFT targets in thinking mode or not: `thinking`, or the start's own training (auto)."""
  if s.thinking_target == "instruction":
    if s.thinking == "off":
      raise SystemExit("--config.thinking_target=instruction needs thinking-mode targets (not "
                       "--config.thinking=off)")
    return True
  if s.thinking == "auto":
    from lwm_jax.checkpoints import recorded_thinking  # pylint: disable=import-outside-toplevel
    return recorded_thinking(start_hf)
  return s.thinking == "on"


def _config(s: Settings, name: str, folder: str, domains: list[str], wd: str, start: tuple):
  start_hf, sp, vocab, context = start
  c = stages.stage_config("sft", preset=s.preset, vocab=vocab, steps=s.sft_steps,
                          batch=s.sft_batch, seq_len=s.sft_seq_len,
                          workdir=os.path.join(wd, name), tokenizer=sp,
                          train=_files(folder, domains, "train"),
                          valid=_files(folder, domains, "validation"), init_from_hf=start_hf,
                          export_hf=True, context=context, thinking=_thinking(s, start_hf),
                          thinking_target=s.thinking_target)
  c.data.pipeline.long_prompts = s.long_prompts
  return c


def instruction_visible(c, per_domain: int = 200) -> dict[str, dict[str, int]]:
  """Per domain, of the first `per_domain` training trajectories that carry a simulation
  instruction: how many SFT samples (rendered as the run's pipeline renders them, in rows of
  train.seq_len) keep the instruction's text whole. An over-long sample loses its oldest history
  first and then the system prompt's tail, where the instruction section sits, so a short row
  can hide the instruction from training altogether."""
  from lwm_jax.data import lengths, pipeline  # pylint: disable=import-outside-toplevel
  from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  from lwm_jax.train.sources import data_config  # pylint: disable=import-outside-toplevel
  tok = tok_lib.load_tokenizer(c.data.tokenizer)
  cfg = data_config(c)
  src = pipeline.load_source(cfg)
  pool = pipeline.demo_pool(cfg, src) if cfg.get("long_prompts") else None
  out: dict[str, dict[str, int]] = {}
  for t in src:
    if not t.simulation_instruction.strip():
      continue
    d = out.setdefault(t.domain, {"samples": 0, "kept": 0, "dropped": 0})
    if d["samples"] + d["dropped"] >= per_domain:
      continue
    sample = pipeline.sft_sample(t, tok, cfg, pool)
    if sample is lengths.DROPPED:
      d["dropped"] += 1
      continue
    d["samples"] += 1
    d["kept"] += t.simulation_instruction.strip()[-60:] in tok.decode(
        [int(x) for x in sample["tokens"]])
  return out


def _train(s: Settings, name: str, folder: str, domains: list[str], wd: str, start: tuple) -> dict:
  run_wd = os.path.join(wd, name)
  hf = os.path.join(run_wd, "hf")
  if s.reuse and os.path.exists(os.path.join(hf, "config.json")):
    return _earlier_summary(name, wd, hf)
  shutil.rmtree(run_wd, ignore_errors=True)
  c = _config(s, name, folder, domains, wd, start)
  c.train.progress = False
  t0 = time.time()
  out = trainer.train(c, run_wd)
  rows = [r for _, r in iter_jsonl(os.path.join(run_wd, "metrics.jsonl"))]
  train_rows = [r for r in rows if r.get("split") == "train"]
  valid = [r for r in rows if r.get("split") == "eval"]
  summary = {"export_hf": out["export_hf"], "seconds": round(time.time() - t0, 1),
             "steps": s.sft_steps, "data": folder,
             "loss_first": train_rows[0].get("loss") if train_rows else None,
             "loss_last": train_rows[-1].get("loss") if train_rows else None,
             "validation_loss": valid[-1].get("loss") if valid else None,
             # loss tokens per step, logged every few steps: their mean times the steps
             "loss_tokens": s.sft_steps * sum(r.get("loss_weight", 0.0) for r in train_rows)
                            / max(len(train_rows), 1)}
  print(f"{name}: {summary}", flush=True)
  with open(os.path.join(run_wd, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  return summary


def _earlier_summary(name: str, wd: str, hf: str) -> dict:
  """A kept run's training summary (its summary.json, else the earlier results.json), marked
  reused; without either only the export is known."""
  for path, pick in ((os.path.join(wd, name, "summary.json"), lambda d: d),
                     (os.path.join(wd, "results.json"), lambda d: d.get("runs", {}).get(name))):
    if os.path.exists(path):
      with open(path) as f:
        got = pick(json.load(f))
      if got and "loss_tokens" in got:
        return {**got, "export_hf": hf, "reused": True}
  return {"export_hf": hf, "reused": True}


def _fidelity(s: Settings, name: str, hf: str, sp: str, domains: list[str],
              specs: dict[str, list[str]], wd: str, thinking: bool) -> dict:
  """evals/fidelity.py on one model: both parts (with `thinking_target`, the trained runs only
  the free-running one), or with `reuse` only what its kept report lacks (a report made before
  the likelihood part existed gains it)."""
  from lwm_jax.sampling.sampler import Sampler  # pylint: disable=import-outside-toplevel
  likelihood = name == "start" or not s.thinking_target  # see thinking_target
  out = os.path.join(wd, f"fidelity_{name}")
  path = os.path.join(out, "fidelity.json")
  kept = None
  if s.reuse and os.path.exists(path):
    with open(path) as f:
      kept = json.load(f)
    if kept.get("likelihood") or not likelihood:
      return kept
  sampler = Sampler.from_checkpoint(hf, tokenizer=sp, max_batch=max(4, s.batch))
  parts = ("likelihood",) if kept else fidelity.PARTS if likelihood else ("generate",)
  report = fidelity.run(sampler, domains=domains, specs=specs,
                        corpus_dir=s.corpus, episodes=s.episodes,
                        max_turns=s.max_turns, max_tokens=s.max_tokens,
                        batch=s.batch, checkpoint=hf, temperature=s.temperature,
                        parts=parts, thinking=thinking)
  if kept:
    kept["seconds"]["likelihood"] = report["seconds"]["likelihood"]
    report = {**kept, "likelihood": report["likelihood"],
              "likelihood_thinking": report["likelihood_thinking"]}
  os.makedirs(out, exist_ok=True)
  with open(path, "w") as f:
    json.dump(report, f, indent=1, sort_keys=True)
  with open(os.path.join(out, "fidelity.md"), "w") as f:
    f.write(fidelity.markdown(report))
  print(f"fidelity of {name}: {report['seconds']}", flush=True)
  return report


def compare(reports: dict[str, dict]) -> tuple[list[dict], dict[str, dict]]:
  """Rows (domain, spec, check) with each model's rates with and without the instruction, and
  per model the mean over the checks that applied (each check weighs the same)."""
  rows: dict[tuple, dict] = {}
  for model, rep in reports.items():
    # reports made with plain twins rate the checks on the departing turns too (evals/fidelity.py)
    twins = any("departing" in c for r in rep["rows"] for c in r["checks"].values())
    for r in rep["rows"]:
      for check, c in r["checks"].items():
        row = rows.setdefault((r["domain"], r["spec"], check),
                              {"domain": r["domain"], "spec": r["spec"], "check": check,
                               "turns": c["turns"], "real": c["real"], "target": c["target"]})
        row[model] = {"with": c["with_instruction"], "without": c["without_instruction"]}
        d = c.get("departing") if check != "errors" else c  # an error rate counts every call
        if twins and d and d["turns"]:
          row[model]["departing"] = {"turns": d["turns"], "with": d["with_instruction"],
                                     "without": d["without_instruction"]}
      sim = r["similarity_to_real"]["with"]
      rows[(r["domain"], r["spec"], "similarity")] = rows.get(
          (r["domain"], r["spec"], "similarity"), {"domain": r["domain"], "spec": r["spec"]})
      rows[(r["domain"], r["spec"], "similarity")][model] = sim
  checks = [r for k, r in rows.items() if k[2] != "similarity"]
  means = {}
  for model in reports:
    got = [r[model] for r in checks if r.get(model) and r[model]["with"] is not None
           and r[model]["without"] is not None]
    sims = [r[model] for k, r in rows.items() if k[2] == "similarity" and r.get(model)]
    dep = [g["departing"] for g in got if g.get("departing")
           and None not in (g["departing"]["with"], g["departing"]["without"])]
    means[model] = {"checks": len(got),
                    "with": sum(g["with"] for g in got) / max(len(got), 1),
                    "without": sum(g["without"] for g in got) / max(len(got), 1),
                    "departing": {"checks": len(dep),
                                  "with": sum(g["with"] for g in dep) / max(len(dep), 1),
                                  "without": sum(g["without"] for g in dep) / max(len(dep), 1)},
                    "edit_sim_with": sum(s["edit_sim"] for s in sims) / max(len(sims), 1),
                    "token_f1_with": sum(s["token_f1"] for s in sims) / max(len(sims), 1)}
  return checks, means


def compare_likelihood(reports: dict[str, dict]) -> dict[str, Any]:
  """Each model's teacher-forced instruction gain (nats per token; fidelity.likelihood): pooled
  over every turn of every perturbed episode, pooled over the turns that show the instructed
  behaviour, and per (domain, spec, check) on those turns."""
  rows: dict[tuple, dict] = {}
  pooled: dict[str, dict] = {}
  for model, rep in reports.items():
    acc = {"all": [0, 0.0, 0.0], "shown": [0, 0.0, 0.0]}
    for r in rep.get("likelihood") or []:
      for scope, cells in (("all", [r["all"]]), ("shown", list(r["checks"].values()))):
        for c in cells:
          if c["tokens"]:
            a = acc[scope]
            a[0] += c["tokens"]
            a[1] += c["nll_with"] * c["tokens"]
            a[2] += c["nll_without"] * c["tokens"]
      for check, c in r["checks"].items():
        rows.setdefault((r["domain"], r["spec"], check),
                        {"domain": r["domain"], "spec": r["spec"], "check": check,
                         "turns": c["turns"], "tokens": c["tokens"]})[model] = c["gain"]
    if acc["all"][0]:
      pooled[model] = {scope: {"tokens": a[0], "nll_with": a[1] / a[0],
                               "nll_without": a[2] / a[0], "gain": (a[2] - a[1]) / a[0]}
                       for scope, a in acc.items() if a[0]}
  return {"pooled": pooled, "checks": list(rows.values())}


def _copy_size(settings: dict) -> str:
  n = settings.get("per_domain")
  return f" (copies of {n} trajectories per domain)" if n else ""


def _drawn_text(settings: dict) -> str:
  menu = settings.get("menu")
  return f"a perturbation of `{menu}`" if menu else "a menu perturbation"


def _twins_text(settings: dict) -> str:
  twins = settings.get("paired_twins")
  if not twins:
    return ""
  return (" plus the plain twin of each of its perturbed training episodes (same seed and world, "
          "played without the instruction: "
          + ", ".join(f"{d} {n}" for d, n in twins.items()) + ")")


def _thinking_text(settings: dict) -> str:
  if not settings.get("thinking", True):
    return "no thinking"
  text = "thinking"
  if settings.get("thinking_target") == "instruction":
    text += ", the think block restating the simulation instruction"
  if settings.get("long_prompts") is False:
    text += ", short prompt forms only"
  return text


def _pct(x) -> str:
  return "-" if x is None else f"{100 * x:.1f}"


def _visible_line(settings: dict) -> list[str]:
  vis = settings.get("instruction_visible")
  if not vis:
    return []
  parts = [f"{d} {100 * v['kept'] / max(v['samples'], 1):.0f}% of {v['samples']}"
           + (f" ({v['dropped']} dropped as over-long)" if v["dropped"] else "")
           for d, v in vis.items()]
  return [f"Training samples of the perturbed run whose {settings['sft_seq_len']}-token row keeps "
          f"the whole simulation instruction: {'; '.join(parts)}.", ""]


def markdown(checks: list[dict], means: dict[str, dict], runs: dict, settings: dict,
             gains: dict[str, Any] | None = None) -> str:
  models = list(means)
  lines = ["# Perturbed vs plain training: instruction fidelity", "",
           f"Command: `{settings['command']}`", "",
           f"Start: `{settings['start']}`. Both runs: {settings['sft_steps']} SFT steps of "
           f"{settings['sft_batch']} x {settings['sft_seq_len']} tokens from the start "
           f"({_thinking_text(settings)}), on the "
           f"training split of {', '.join(settings['domains'])}"
           f"{_copy_size(settings)}; `perturbed` on a copy with "
           f"{settings['perturb_share']:g} of the episodes played under {_drawn_text(settings)}"
           f"{_twins_text(settings)}, `plain` on a copy without perturbations. Fidelity: "
           f"{settings['episodes']} held-out episodes per domain and perturbation, at most "
           f"{settings['max_turns']} turns, {settings['max_tokens']} new tokens per observation, "
           f"temperature {settings['temperature']:g}.", "",
           *_visible_line(settings),
           "| run | loss tokens | train loss first -> last | validation loss | seconds |",
           "|---|---|---|---|---|"]
  for name, r in runs.items():
    if "loss_tokens" not in r:
      lines.append(f"| {name} | (reused) | | | |")
      continue
    lines.append(f"| {name}{' (kept from an earlier run)' if r.get('reused') else ''} | "
                 f"{r['loss_tokens']:.0f} | {r['loss_first']:.3f} -> "
                 f"{r['loss_last']:.3f} | "
                 f"{r['validation_loss'] if r['validation_loss'] is None else round(r['validation_loss'], 3)}"
                 f" | {r['seconds']:.0f} |")
  lines += ["", "## Mean over the checks (each (domain, perturbation, check) weighs the same)", "",
            "| model | checks | shows it WITH the instruction, % | without, % | lift, points | "
            "edit sim to real (with), % | token F1 to real (with), % |",
            "|---|---|---|---|---|---|---|"]
  for m in models:
    x = means[m]
    lines.append(f"| {m} | {x['checks']} | {_pct(x['with'])} | {_pct(x['without'])} | "
                 f"{100 * (x['with'] - x['without']):+.1f} | {_pct(x['edit_sim_with'])} | "
                 f"{_pct(x['token_f1_with'])} |")
  if any(means[m]["departing"]["checks"] for m in models):
    lines += ["", "The same on the departing turns only (where the perturbation changed the real "
              "observation, evals/fidelity.py; the error rate over every call as above):", "",
              "| model | checks | WITH the instruction, % | without, % | lift, points |",
              "|---|---|---|---|---|"]
    for m in models:
      x = means[m]["departing"]
      lines.append(f"| {m} | {x['checks']} | {_pct(x['with'])} | {_pct(x['without'])} | "
                   f"{100 * (x['with'] - x['without']):+.1f} |")
  lines += ["", "## Per check (% of the turns where the check applies: with / without the "
            "instruction)", "",
            "| domain | perturbation | check | turns | real | target | "
            + " | ".join(models) + " |", "|---|---|---|---|---|---|" + "---|" * len(models)]
  for r in checks:
    cells = " | ".join(f"{_pct(r[m]['with'])} / {_pct(r[m]['without'])}" if r.get(m) else "-"
                       for m in models)
    lines.append(f"| {r['domain']} | `{r['spec']}` | {r['check']} | {r['turns']} | "
                 f"{_pct(r['real'])} | {_pct(r['target'])} | {cells} |")
  if gains and gains["pooled"]:
    lines += ["", "## Teacher-forced: does the instruction help predict the real observation?", "",
              "Negative log-likelihood (nats per observation token) of the real perturbed "
              "observations of the same held-out episodes, with the instruction in the system "
              "prompt and without it; gain = without - with (positive: the model reads the "
              "instruction). `shown`: only the turns whose real observation shows the "
              "instructed behaviour.", "",
              "| model | scope | tokens | NLL with | NLL without | gain |", "|---|---|---|---|---|---|"]
    for m, by_scope in gains["pooled"].items():
      for scope, x in by_scope.items():
        lines.append(f"| {m} | {scope} | {x['tokens']} | {x['nll_with']:.4f} | "
                     f"{x['nll_without']:.4f} | {x['gain']:+.4f} |")
    shown = list(gains["pooled"])
    lines += ["", "Gain per check (nats per token, turns that show the behaviour):", "",
              "| domain | perturbation | check | turns | tokens | " + " | ".join(shown) + " |",
              "|---|---|---|---|---|" + "---|" * len(shown)]
    for r in gains["checks"]:
      cells = " | ".join("-" if r.get(m) is None else f"{r[m]:+.3f}" for m in shown)
      lines.append(f"| {r['domain']} | `{r['spec']}` | {r['check']} | {r['turns']} | "
                   f"{r['tokens']} | {cells} |")
  return "\n".join(lines) + "\n"


def plot(checks: list[dict], models: list[str], path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  shown = [r for r in checks if any(r.get(m) and r[m]["with"] is not None for m in models)]
  labels = [f"{r['domain']} {r['check']}: {r['spec'][:34]}" for r in shown]
  fig, ax = plt.subplots(figsize=(max(8, 0.8 * len(shown)), 6))
  width = 0.8 / (len(models) + 1)
  for i, m in enumerate(models):
    ys = [100 * (r[m]["with"] or 0) if r.get(m) else 0 for r in shown]
    ax.bar([k + i * width for k in range(len(shown))], ys, width, label=f"{m} (with instruction)")
  ax.bar([k + len(models) * width for k in range(len(shown))],
         [100 * (r["real"] or 0) for r in shown], width, label="real environment", color="grey")
  ax.set_xticks([k + 0.4 for k in range(len(shown))], labels, fontsize=7, rotation=35, ha="right")
  ax.set_ylabel("% of turns showing the instructed behaviour")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def run(config: ml_collections.ConfigDict, command: str = "") -> dict:
  """The whole experiment of `config` (configs/perturb_experiment.py); every setting is checked
  before the run folder is made. `command` is recorded in the results as how they were made.
  Returns what results.json holds."""
  t0 = time.time()
  s = recipe.settings(config, resolve)
  domains = list(s.domains)
  specs = perturb.parse_menu(s.menu, domains, "--config.menu")
  wd = os.path.abspath(s.workdir)
  os.makedirs(wd, exist_ok=True)
  start = corpus_lib.given_start(s.start)
  copy = _corpus_copy(s, wd, domains, "perturbed", s.perturb_share)
  # the bundled corpus carries perturbations itself (a quarter of these domains' episodes), so
  # the control is regenerated without any
  plain = _corpus_copy(s, wd, domains, "plain", 0.0)
  copy_trained, twins = paired_copy(wd, domains, copy, plain) if s.paired else (copy, None)
  runs = {"plain": _train(s, "plain", plain, domains, wd, start),
          "perturbed": _train(s, "perturbed", copy_trained, domains, wd, start)}
  hf = {"start": start[0], **{k: v["export_hf"] for k, v in runs.items()}}
  reports = {m: _fidelity(s, m, hf[m], start[1], domains, specs, wd,
                          None if m == "start" else _thinking(s, start[0]))
             for m in MODELS}
  checks, means = compare(reports)
  gains = compare_likelihood(reports)
  settings = {"command": command,
              "start": s.start, "domains": domains, "perturb_share": s.perturb_share,
              "sft_steps": s.sft_steps, "sft_batch": s.sft_batch,
              "per_domain": s.per_domain or None, "thinking": _thinking(s, start[0]),
              "thinking_target": s.thinking_target or None,
              "long_prompts": s.long_prompts,
              "sft_seq_len": s.sft_seq_len, "episodes": s.episodes,
              "max_turns": s.max_turns, "max_tokens": s.max_tokens,
              "temperature": s.temperature, "paired_twins": twins,
              "menu": s.menu or None}
  with open(os.path.join(copy, "MANIFEST.json")) as f:
    settings["perturbed_counts"] = {d: v.get("perturbed", {}) for d, v in
                                    json.load(f)["domains"].items()}
  settings["instruction_visible"] = instruction_visible(
      _config(s, "perturbed", copy_trained, domains, wd, start))
  text = markdown(checks, means, runs, settings, gains)
  with open(os.path.join(wd, "results.md"), "w") as f:
    f.write(text)
  results = {"settings": settings, "runs": runs, "means": means, "checks": checks,
             "likelihood": gains, "seconds": round(time.time() - t0, 1)}
  with open(os.path.join(wd, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  plot(checks, list(MODELS), os.path.join(wd, "fidelity.png"))
  print(text)
  print(f"done in {time.time() - t0:.0f} s: {wd}/results.md, {wd}/fidelity.png")
  return results
