"""The figures of an RL write-up, generated from its result files, so text and files cannot drift.

  python experiments/figures.py gspo experiments/gspo_vs_sft/from_world_model [--write=README.md]
  python experiments/figures.py agent experiments/agent_rl_android/seeds [--write=README.md]

`gspo DIR` reads DIR/results.json and DIR/curves.csv (launch/rl_experiment.py) and prints: the
start folder and its sha256 (or that the run did not record it), the evaluation table, and what
the GSPO updates saw. The rollout figures of curves.csv repeat on each of a rollout's mini-batch
rows (4 updates per rollout), so they are counted ONCE per rollout here: zero-variance groups,
rollouts, reward; the clip and ratio figures are per update.

`agent DIR` reads DIR/results.json (launch/agent_experiment.py, its own runs and the merged
ones) and prints the per-arm table with each run's own recorded settings (learning rate, RL
episodes, eval cadence) and start folders, and flags runs that predate these records.

`--write=FILE` replaces the block between `<!-- figures:begin -->` and `<!-- figures:end -->` in
FILE with the output (FILE relative to DIR; `--block=NAME` for `<!-- figures:begin NAME -->`); tests/test_experiment_figures.py checks that every
write-up's block equals what this script prints from its folder.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys

END = "<!-- figures:end -->"


def begin(name: str = "") -> str:
  """The opening marker of a figures block (`name` tells several blocks of one page apart)."""
  return f"<!-- figures:begin {name} -->" if name else "<!-- figures:begin -->"


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise SystemExit(f"{path}: cannot read ({e})") from None


def _float(v: str) -> float | None:
  try:
    return float(v) if v not in ("", None) else None
  except ValueError:
    return None


def _start_line(rec: dict | None, fallback: str) -> str:
  if rec and rec.get("sha256"):
    return f"`{rec['path']}` (sha256 `{rec['sha256'][:16]}`)"
  return (f"`{fallback}`, sha256 not recorded (the run predates issue 64; that folder has been "
          "replaced since, so the start cannot be checked)")


def gspo(folder: str) -> str:
  res = _read_json(os.path.join(folder, "results.json"))
  with open(os.path.join(folder, "curves.csv")) as f:
    rows = list(csv.DictReader(f))
  upd = int(res.get("settings", {}).get("gspo", {}).get("rl", {}).get("updates_per_batch", 4))
  train = [r for r in rows if _float(r.get("loss")) is not None]
  rollouts = [train[i] for i in range(0, len(train), upd)]  # the first row of each rollout
  zv = [int(_float(r["rollout/zero_variance_groups"]) or 0) for r in rollouts]
  later = [r for i, r in enumerate(train) if i % upd]
  clip_acts = sum(1 for r in train if (_float(r["clip_frac"]) or 0) > 0)
  first_ratio = [_float(r["ratio_mean"]) for r in rollouts]
  lo = min(_float(r["ratio_min"]) for r in later) if later else float("nan")
  hi = max(_float(r["ratio_max"]) for r in later) if later else float("nan")
  held = [(int(float(r["step"])), _float(r["heldout/reward_mean"])) for r in rows
          if _float(r.get("heldout/reward_mean")) is not None]
  lines = [f"Start: {_start_line(res.get('start_folder'), res.get('start', '?'))}.",
           f"GSPO: {res['rl_steps']} updates = {len(rollouts)} rollouts of {upd} updates; "
           f"reward `{res['reward']}`, at most {res['max_new_tokens']} reply tokens; "
           f"{res['generated_tokens']:.0f} reply tokens generated; SFT control "
           f"{res['control_steps']} steps (~{res['control_target_tokens']:.0f} target tokens); "
           f"{res['gspo_seconds']:.0f} s of GSPO, {res['seconds']:.0f} s in all.", "",
           "| model | reward (0-25) | reward rule | reward reference | token F1 | edit sim | "
           "parses |", "|---|---|---|---|---|---|---|"]
  for name, m in res["table"].items():
    lines.append(f"| {name} | {m['reward_mean']:.2f} | {m.get('reward_rule', 0):.2f} | "
                 f"{m.get('reward_reference', 0):.2f} | {m['token_f1']:.4f} | "
                 f"{m['edit_sim']:.4f} | {m['parses']:.2f} |")
  lines += ["",
            f"- zero-variance groups, counted once per rollout: {sum(zv)} over {len(rollouts)} "
            f"rollouts (in rollouts {', '.join(str(i + 1) for i, z in enumerate(zv) if z) or 'none'})",
            f"- first update of each rollout: ratio {min(first_ratio):.6f}-{max(first_ratio):.6f}; "
            f"later updates: ratio {lo:.3f}-{hi:.3f}",
            f"- the clip acted on {clip_acts} of {len(train)} updates",
            "- held-out greedy reward (curve prompts) at steps "
            + ", ".join(f"{s}: {v:.2f}" for s, v in held)]
  return "\n".join(lines)


def _own_runs(res: dict) -> dict[str, list[dict]]:
  arms: dict[str, list[dict]] = {}
  for src in [res.get("runs", {})] + list(res.get("merged", {}).values()):
    for arm, rs in src.items():
      for i, r in enumerate(rs):
        key = (arm, r.get("seed", i))
        if all((arm, x.get("seed")) != key for x in arms.get(arm, [])):
          arms.setdefault(arm, []).append(dict(r, seed=r.get("seed", i)))
  return arms


def agent(folder: str) -> str:
  res = _read_json(os.path.join(folder, "results.json"))
  meta = res.get("meta", {})
  lines = [f"Domain `{meta.get('domain', '?')}`; world model "
           f"{_start_line({'path': meta.get('world_model'), 'sha256': meta.get('world_model_sha256')}, meta.get('world_model', '?'))}.",
           "", "| arm | seed | BC seed | success | mean credit | zero-shot | RL episodes | RL lr | "
           "eval every | start sha256 |", "|---|---|---|---|---|---|---|---|---|---|"]
  unrecorded = 0
  for arm, rs in _own_runs(res).items():
    for r in sorted(rs, key=lambda r: r["seed"]):
      st = r.get("settings")
      if not st:
        unrecorded += 1
      zs = r.get("zero_shot", {}).get("success") if r.get("zero_shot") else None
      start = r.get("start") or r.get("bc_start") or {}
      sha = start.get("sha256", "") or ("fresh model" if start.get("note", "").startswith(
          "a fresh model") else "")
      name = arm
      if arm == "warmup" and not r.get("zero_shot") and not st:
        name = "bc_from_wm (recorded as 'warmup')"  # the old arm: BC from the world model
      lines.append(
          f"| {name} | {r['seed']} | {r.get('bc_seed', r['seed'])} | {r['success']:.3f} | "
          f"{r['credit']:.3f} | {'-' if zs is None else f'{zs:.3f}'} | "
          f"{r.get('episodes', 0)} | {st['rl_lr'] if st else 'not recorded'} | "
          f"{st['eval_every'] if st else 'not recorded'} | {sha[:16] or 'not recorded'} |")
  if unrecorded:
    budget = meta.get("budget")
    lines += ["", f"{unrecorded} run(s) predate per-run records (issue 64): their own learning "
              "rate, episodes and eval cadence are not in the file; the write-up's commands "
              "give them."
              + (f" The file's `meta.budget` ({budget.get('rl_lr')} lr, "
                 f"{budget.get('episodes')} episodes, eval every {budget.get('eval_every')}) "
                 "is that of the run that wrote the file, not necessarily of these runs."
                 if isinstance(budget, dict) else "")]
  return "\n".join(lines)


KINDS = {"gspo": gspo, "agent": agent}


def write_block(path: str, text: str, name: str = "") -> None:
  with open(path) as f:
    doc = f.read()
  b = begin(name)
  if b not in doc:
    raise SystemExit(f"{path}: no {b} ... {END} block to replace")
  head, rest = doc.split(b, 1)
  _, tail = rest.split(END, 1)
  with open(path, "w") as f:
    f.write(f"{head}{b}\n{text}\n{END}{tail}")


def block_of(path: str, name: str = "") -> str | None:
  with open(path) as f:
    doc = f.read()
  if begin(name) not in doc:
    return None
  return doc.split(begin(name), 1)[1].split(END, 1)[0].strip("\n")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("kind", choices=sorted(KINDS))
  ap.add_argument("folder")
  ap.add_argument("--write", default="", help="a write-up whose figures block is replaced "
                  "(a path relative to FOLDER)")
  ap.add_argument("--block", default="", help="the block's name, for a page with several")
  a = ap.parse_args()
  text = KINDS[a.kind](a.folder)
  if a.write:
    write_block(os.path.join(a.folder, a.write), text, a.block)
  print(text)


if __name__ == "__main__":
  sys.exit(main())
