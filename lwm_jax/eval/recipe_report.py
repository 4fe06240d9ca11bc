"""report.md and report.json of launch/reproduce.py: settings, stages, verdict, ablations and the
free-running table, from what the run measured (docs/reproduce.md explains how to read them)."""
from __future__ import annotations

import json
import math
import os
from typing import Any

from lwm_jax.eval import free_running
from lwm_jax.eval.metrics import bench_domains
from lwm_jax.eval.report import display

METRICS = (("token_f1", "Token F1"), ("edit_sim", "Edit similarity"), ("exact", "Exact match"))


def verdict(res: dict[str, Any], system: str, rows: dict[str, Any]) -> dict[str, Any]:
  """Whether `system` beats copy-previous on token F1: per domain margins, domains ahead, the
  overall margin, and for each domain short of it the margin and the generations cut at the cap."""
  v = free_running.versus(res, system)
  cut = rows.get(system, {}).get("cut_per_domain", {})
  n = res["n_records"]
  short = [{"domain": d, "margin": m, "cut_at_max_new_tokens": cut.get(d, 0), "turns": n[d]}
           for d, m in v["margin"].items() if m <= 0]
  return {"system": system, "domains_ahead": len(v["ahead"]), "domains": v["domains"],
          "overall_margin": v["overall"], "beats_overall": v["overall"] > 0,
          "margins": v["margin"], "short": short}


def build(header: dict[str, Any], rows: dict[str, Any], res: dict[str, Any],
          pairs: list[tuple[str, str, str]], seconds: float, paths: dict[str, str],
          simulated: dict[str, Any] | None = None) -> dict[str, Any]:
  main_sft = next((n for n, r in rows.items() if r["main"] and r["stage"] == "sft"), None)
  ablations = []
  for what, a, b in pairs:
    for name in (a, b):
      e = res["systems"][name]["free"]
      ablations.append({"ablation": what, "run": name, "main": rows[name]["main"],
                        **{m: e[m]["overall"] for m, _ in METRICS},
                        "domains_ahead": len(free_running.versus(res, name)["ahead"]),
                        "tokens": rows[name]["data"].get("tokens"),
                        "steps": rows[name]["steps"]})
  return {**header, "seconds": seconds, "stages": rows, "free_running": res,
          "verdict": verdict(res, main_sft, rows) if main_sft else None,
          "ablations": ablations, "simulated_episode": simulated, "files": paths}


def _f(v: Any, fmt: str = ".3f") -> str:
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return "-"
  return format(v, fmt)


def _thinking_cell(r: dict[str, Any]) -> str:
  """The SFT/RL run's thinking switch, and `+ history loss` when its SFT loss covered every
  observation of the sample (--sft_loss=history)."""
  if r["stage"] == "cpt":
    return "-"
  return r["thinking"] + (" + history loss" if r.get("sft_loss") == "history" else "")


def _stage_table(rows: dict[str, Any]) -> list[str]:
  out = ["| Run | Stage | From | Masking | Thinking | Steps | Rows x tokens | Tokens trained | "
         "Loss tokens | Knowledge tokens | Train loss first -> last | Validation loss | "
         "Tokens/s | Seconds |", "|:--" + "|:-:" * 13 + "|"]
  for name, r in rows.items():
    d = r["data"]
    ev = (r.get("eval") or {}).get("loss")
    drill = f" (+{d['drill_tokens']} of the copy drill)" if d.get("drill_tokens") else ""
    out.append(f"| {name}{' (main)' if r['main'] else ''} | {r['stage']} | {r['from']} | "
               f"{r['masking'] if r['stage'] == 'cpt' else '-'} | "
               f"{_thinking_cell(r)} | {r['steps']} | "
               f"{r['batch']} x {r['seq_len']} | {d.get('tokens', '-')} | "
               f"{d.get('loss_tokens', '-')} | {d.get('knowledge_tokens', '-')}{drill} | "
               f"{_f(r['loss_first'])} -> {_f(r['loss_last'])} | {_f(ev)} | "
               f"{_f(r['tokens_per_s'], '.0f')} | {_f(r['seconds'], '.0f')} |")
  reused = [f"{n} (copied from {r['reused_from']}, where it trained)" for n, r in rows.items()
            if r.get("reused_from")]
  if reused:
    out += ["", "Reused with `--reuse_from`, not trained in this run (its seconds are the original "
            "run's): " + "; ".join(reused) + "."]
  return out


def _verdict_lines(v: dict[str, Any] | None) -> list[str]:
  if v is None:
    return ["No SFT run: nothing to compare with copy-previous."]
  ok = v["domains_ahead"] >= 5 and v["beats_overall"]
  lines = [f"The SFT model `{v['system']}` beats copy-previous on token F1 in "
           f"{v['domains_ahead']} of {v['domains']} domains (of the benchmark's "
           f"{len(bench_domains())}) and {'' if v['beats_overall'] else 'does NOT beat it '}overall "
           f"({v['overall_margin']:+.2f} points). The goal (at least 5 domains and overall): "
           f"{'met' if ok else 'NOT met'}."]
  if v["short"]:
    lines += ["", "Domains where it does not beat copy-previous (margin in token-F1 points; "
              "generations cut at the token cap can explain part of a gap):", ""]
    for x in v["short"]:
      lines.append(f"- {display(x['domain'])}: {x['margin']:+.2f} points; "
                   f"{x['cut_at_max_new_tokens']} of {x['turns']} generations cut at "
                   "max_new_tokens")
  return lines


def _ablation_table(ablations: list[dict[str, Any]]) -> list[str]:
  if not ablations:
    return ["No ablation in this run (--ablations=masking,thinking,sft_loss adds them)."]
  out = ["| Ablation | Run | " + " | ".join(t for _, t in METRICS) + " | Domains ahead of "
         "copy-previous | Steps | Tokens trained |", "|:--|:--" + "|:-:" * (len(METRICS) + 3) + "|"]
  for a in ablations:
    out.append(f"| {a['ablation']} | {a['run']}{' (main)' if a['main'] else ''} | "
               + " | ".join(_f(a[m], ".2f") for m, _ in METRICS)
               + f" | {a['domains_ahead']} | {a['steps']} | {_f(a['tokens'], 'd')} |")
  return out


def _simulated_lines(sim: dict[str, Any] | None) -> list[str]:
  if not sim:
    return []
  every = sim.get("all_terminal_test_episodes")
  every_line = ([f"Over every held-out terminal episode's first three turns ({every['episodes']} "
                 f"episodes): mean {every['mean']:.3f}, median {every['median']:.3f}, "
                 f"{every['at_least_0.6']} at 0.6 or more."] if every else [])
  return ["## Simulated terminal episodes", "",
          f"`{sim['model']}` plays the environment of test trajectory `{sim['trajectory']}` (the "
          "demo's episode: the most knowable one, `episodes_lib.demo_episode`) for "
          f"{sim['turns']} turns (greedy, its own earlier answers as history): mean edit "
          f"similarity {sim['mean_edit_similarity']:.3f} to the real observations (per turn: "
          + ", ".join(f"{x:.3f}" for x in sim["edit_similarity"]) + ").", "", *every_line, "",
          "```", sim.get("transcript", ""), "```", ""]


def _masking_line(m: dict[str, Any] | None) -> str:
  if not m:
    return ""
  return (f"Loss masking (`--masking=it`) keeps {m['kept']} of the training split's {m['turns']} "
          "observation turns in the CPT loss (turn classes: "
          + ", ".join(f"{k} {v}" for k, v in m["classes"].items())
          + "); `--masking=full` keeps all of them.")


def markdown(rep: dict[str, Any]) -> str:
  s, c = rep["settings"], rep["corpus"]
  know = rep.get("knowledge")
  know_line = (f"Knowledge text: {know['documents']} documents ({', '.join(s['knowledge'])}), "
               f"{know['characters']} characters, at {s['knowledge_share']:.0%} of CPT tokens "
               "(full loss)." if know else "Knowledge text: none.")
  free_md = free_running.markdown(rep["free_running"]).split("\n", 2)[2]
  free_md = free_md.replace("\n## ", "\n### ")
  lines = [f"# Reproduction of the recipe (budget `{s['budget']}`)", "",
           f"Command: `{rep['command']}`", "",
           f"Corpus: `{c['folder']}` (sha256 `{c['sha256'][:16]}`), {c['train_trajectories']} "
           f"training and {c['test_trajectories']} test trajectories.",
           f"Model preset `{s['preset']}`, vocabulary {s['vocab']}, context "
           f"{max(s['seq_len'], s.get('sft_seq_len') or 0)} tokens; CPT {s['cpt_steps']} steps "
           f"of {s['batch']} x {s['seq_len']} (masking `{s['masking']}`), SFT {s['sft_steps']} "
           f"steps of {s.get('sft_batch') or s['batch']} x {s.get('sft_seq_len') or s['seq_len']} "
           f"(thinking `{s['thinking']}`, loss on "
           f"{'every observation' if s.get('sft_loss') == 'history' else 'the target turn'})"
           + (f", GSPO {s['rl_steps']} steps" if s["rl"] else "") + ".", know_line,
           f"Evaluation: greedy, at most {s['eval_max_new_tokens']} new tokens per turn, "
           + (f"at most {s['eval_max_turns']} turn(s) per domain" if s["eval_max_turns"]
              else "every turn")
           + f", {s['eval_batch']} turns per batch.",
           _masking_line(rep.get("masking")),
           f"Total time: {rep['seconds']:.0f} s"
           + (" (runs copied with `--reuse_from` not counted)" if any(
               r.get("reused_from") for r in rep["stages"].values()) else "") + ".",
           "", "## Verdict", "",
           *_verdict_lines(rep["verdict"]), "", "## Stages", "", *_stage_table(rep["stages"]),
           "", "Each run's resolved config is its `config.json` (and `plan.json` holds them all); "
           "its loss curve is its `loss.png`.", "",
           "## Ablations (equal compute: same model, steps, batch and sequence length)", "",
           *_ablation_table(rep["ablations"]), "", "## Free-running evaluation (test split)", "",
           free_md.strip(), "", *_simulated_lines(rep.get("simulated_episode")), "## Files", "",
           "- `free_running.md`, `free_running.json`: the evaluation table alone",
           "- " + ", ".join(f"`{os.path.basename(p)}`" for k, p in rep["files"].items()
                            if k.startswith("png")) + ": one chart per metric",
           "- `predictions/<run>.jsonl`: every prediction beside the real observation",
           "- `<run>/config.json`, `<run>/loss.png`, `<run>/metrics.jsonl`: each training run"]
  return "\n".join(lines) + "\n"


def write(rep: dict[str, Any], out_dir: str) -> dict[str, str]:
  paths = {"json": os.path.join(out_dir, "report.json"),
           "markdown": os.path.join(out_dir, "report.md")}
  with open(paths["json"], "w", encoding="utf-8") as f:
    json.dump(rep, f, indent=2, default=str)
  with open(paths["markdown"], "w", encoding="utf-8") as f:
    f.write(markdown(rep))
  return paths


def summary(rep: dict[str, Any]) -> str:
  """The verdict and ablation lines for the console."""
  lines = ["", *_verdict_lines(rep["verdict"])]
  for a in rep["ablations"]:
    lines.append(f"{a['ablation']}: {a['run']} token F1 {a['token_f1']:.2f}, edit similarity "
                 f"{a['edit_sim']:.2f}")
  return "\n".join(lines)
