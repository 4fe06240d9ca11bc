"""What the GSPO updates of each agent-RL run saw: per arm and seed, from the run folders'
`metrics.jsonl` (one train row per update) that `launch/agent_experiment.py` writes.

  python experiments/agent_rl_android/rl_stats.py runs/agent_android_real runs/agent_android_sim

Columns: updates; groups whose G rewards were all equal (filtered: no advantage, no gradient)
out of all groups; updates with nothing left after the filter (`skipped`: the weights do not
move); mean success and reward of the rollouts; held-out success at each evaluation.
"""
import glob
import json
import os
import re
import sys

RUN = re.compile(r"^(real|sim|warmup)_(\d+)$")


def stats(folder: str) -> dict:
  rows = []
  with open(os.path.join(folder, "metrics.jsonl")) as f:
    for n, line in enumerate(f, 1):
      try:
        rows.append(json.loads(line))
      except ValueError as e:
        raise SystemExit(f"{folder}/metrics.jsonl line {n}: not JSON ({e})") from None
  train = [r for r in rows if r.get("split") == "train"]
  evals = [r for r in rows if r.get("split") == "eval"]
  if not train:
    raise SystemExit(f"{folder}/metrics.jsonl: no train rows (the run did not update)")
  mean = lambda key: sum(r[key] for r in train) / len(train)
  groups = max(r["rollout/episodes"] for r in train) / _group_size(folder)  # a running count
  return {"updates": len(train),
          "filtered": sum(r["rollout/zero_variance_groups"] for r in train),
          "groups": groups,
          "skipped": sum(1 for r in train if r.get("skipped")),
          "rollout_success": mean("rollout/success"),
          "reward": mean("rollout/reward_mean"),
          "curve": [(int(r.get("episodes_trained", 0)), r["success"]) for r in evals]}


def _group_size(folder: str) -> int:
  with open(os.path.join(folder, "config.json")) as f:
    try:
      return int(json.load(f)["rl"]["group_size"])
    except (KeyError, TypeError, ValueError) as e:
      raise SystemExit(f"{folder}/config.json: no rl.group_size ({e!r})") from None


def main(folders: list[str]) -> None:
  runs = []
  for top in folders:
    for sub in sorted(glob.glob(os.path.join(top, "*"))):
      m = RUN.match(os.path.basename(sub))
      if m and os.path.isfile(os.path.join(sub, "metrics.jsonl")):
        runs.append((m.group(1), int(m.group(2)), stats(sub)))
  if not runs:
    raise SystemExit(f"no real_N / sim_N / warmup_N run folders with metrics.jsonl in {folders}")
  print("| arm | seed | updates | groups filtered | updates skipped | rollout success | "
        "rollout reward | held-out success at episodes |")
  print("|---|---|---|---|---|---|---|---|")
  for arm, seed, s in sorted(runs):
    curve = ", ".join(f"{e}: {v:.3f}" for e, v in s["curve"])
    print(f"| {arm} | {seed} | {s['updates']} | {s['filtered']:.0f} of {s['groups']:.0f} | "
          f"{s['skipped']} of {s['updates']} | {s['rollout_success']:.3f} | {s['reward']:.3f} | "
          f"{curve} |")


if __name__ == "__main__":
  main(sys.argv[1:] or ["runs/agent_android_real", "runs/agent_android_sim"])
