"""The first listing-drill stage (configs/world_model.py:cs1) trained two ways at the same seed:
the old path (experiments/made_up_names/listing_drill.py as of commit e7b63f9, with its own
stateful train step) and the new one (the drill mixture of lwm_jax/data/drill_sources.py trained by
the one trainer). Writes each path's loss per step to OUT/parity_<path>.json; `--path=compare`
reads both and writes OUT/parity.json and OUT/parity.md.

  git archive e7b63f9 | tar -x -C /tmp/old65 && ln -s $PWD/runs /tmp/old65/runs
  python experiments/made_up_names/drill_parity.py --path=old --old_root=/tmp/old65 --steps=80
  python experiments/made_up_names/drill_parity.py --path=new --steps=80
  python experiments/made_up_names/drill_parity.py --path=compare

The old script is run unchanged, its `train_step` wrapped to record each step's loss (it prints
every tenth) and its final save replaced by a stop (the episode play after training is not part
of the comparison). Both read the same tour files (--train) and start from the same model. The
loss compared is what each optimises: the weighted cross-entropy plus 0.001 x the MoE
auxiliary loss (the trainer logs the two apart).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
TOURS = ("runs/listing_usual_tour/terminal_train.jsonl.gz,"
         "runs/listing_madeup_tour/terminal_train.jsonl.gz")
CS1 = ["--batch=8", "--lr=1e-3", "--mix_share=0.25", "--copy_share=0.5", "--copy_short=64"]


class _Stop(Exception):
  pass


def run_old(old_root: str, steps: int, train: str, start: str, out: str) -> dict:
  """The old script, unchanged, with each step's loss recorded."""
  sys.path.insert(0, os.path.join(old_root, "experiments", "made_up_names"))
  os.chdir(old_root)  # its held-out files are relative paths under runs/
  import listing_drill  # pylint: disable=import-outside-toplevel
  assert listing_drill.ROOT == os.path.abspath(old_root), listing_drill.ROOT
  import lwm_jax  # pylint: disable=import-outside-toplevel
  assert lwm_jax.__file__.startswith(os.path.abspath(old_root)), lwm_jax.__file__
  losses, inner = [], listing_drill.train_step

  def recorded(*a, **k):
    loss = inner(*a, **k)
    losses.append(float(loss))
    return loss

  def stop(*_a, **_k):
    raise _Stop()

  listing_drill.train_step, listing_drill.save = recorded, stop
  sys.argv = ["listing_drill.py", f"--train={train}", f"--start={start}", f"--out={out}",
              f"--steps={steps}", f"--every={steps}", *CS1]
  t0 = time.time()
  try:
    listing_drill.main()
  except _Stop:
    pass
  with open(os.path.join(out, "log.jsonl")) as f:
    held = [json.loads(line) for line in f]
  return {"path": "old", "script": "experiments/made_up_names/listing_drill.py @ e7b63f9",
          "command": " ".join(sys.argv), "seconds": round(time.time() - t0, 1),
          "loss": losses, "held_out": held}


def run_new(steps: int, train: str, start: str, out: str) -> dict:
  """configs/world_model.py:cs1 through the trainer, `steps` steps, every step logged."""
  sys.path.insert(0, ROOT)
  from configs import world_model  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  stage = world_model.get_config("cs1").cs1
  c = stage.config
  c.init_from_hf, c.data.tokenizer = start, os.path.join(start, "tokenizer.model")
  c.data.drills.listing, c.data.drills.mix = train, os.path.join(ROOT, "data", "corpus")
  c.train.update(num_steps=steps, log_every=1, progress=False)
  c.export_hf = False
  t0 = time.time()
  summary = trainer.train(c, out)
  res = {"path": "new", "config": "configs/world_model.py:cs1",
         "seconds": round(time.time() - t0, 1),
         "overrides": {"train.num_steps": steps, "data.drills.listing": train,
                       "init_from_hf": start}}
  return dict(res, **_objective(out, summary["losses"]))


def _objective(workdir: str, losses: list) -> dict:
  """The trainer logs the cross-entropy (`loss`) and the MoE auxiliary loss apart; the old
  script's loss is their sum as optimised, cross-entropy + aux_loss_coef * aux_loss (0.001,
  the model's router_aux_loss_coef and the old script's StepConfig default)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = {r["step"]: r for r in map(json.loads, f) if r.get("split", "train") == "train"}
  aux = [rows[i + 1]["aux_loss"] for i in range(len(losses))]
  return {"xent": losses, "aux_loss": aux,
          "loss": [x + 0.001 * a for x, a in zip(losses, aux)]}


def compare(out: str) -> None:
  runs = {}
  for p in ("old", "new"):
    with open(os.path.join(out, f"parity_{p}.json")) as f:
      runs[p] = json.load(f)
  if "xent" not in runs["new"]:  # written before the aux term was added: read it now
    runs["new"].update(_objective(os.path.join(out, "new"), runs["new"]["loss"]))
  old, new = runs["old"]["loss"], runs["new"]["loss"]
  n = min(len(old), len(new))
  diff = [abs(a - b) for a, b in zip(old[:n], new[:n])]
  rel = [d / max(abs(a), 1e-9) for d, a in zip(diff, old)]
  # noise: how much the loss moves from one step to the next (different rows each step)
  step_noise = sorted(abs(old[i + 1] - old[i]) for i in range(n - 1))
  res = {"steps": n, "max_abs_diff": max(diff), "mean_abs_diff": sum(diff) / n,
         "max_rel_diff": max(rel), "median_step_to_step_change": step_noise[len(step_noise) // 2],
         "old": runs["old"], "new": runs["new"],
         "git_commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], text=True,
                                      capture_output=True).stdout.strip()}
  with open(os.path.join(out, "parity.json"), "w") as f:
    json.dump(res, f, indent=1)
  rows = "\n".join(f"| {i + 1} | {old[i]:.4f} | {new[i]:.4f} | {diff[i]:.2e} |"
                   for i in range(n) if i < 10 or (i + 1) % 10 == 0)
  with open(os.path.join(out, "parity.md"), "w") as f:
    f.write(f"| step | old path loss | new path loss | abs diff |\n|---|---|---|---|\n{rows}\n\n"
            f"{n} steps: max abs diff {res['max_abs_diff']:.2e}, mean {res['mean_abs_diff']:.2e}"
            f" (max relative {res['max_rel_diff']:.2e}); the median change of the loss from one "
            f"step to the next is {res['median_step_to_step_change']:.3f}.\n")
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot(range(1, n + 1), old[:n], label="old: listing_drill.py (own train step)", lw=2)
  ax.plot(range(1, n + 1), new[:n], "--", label="new: configs/world_model.py:cs1 (trainer)")
  ax.set(xlabel="step", ylabel="training loss (xent + 0.001 aux)",
         title="listing drill cs1, seed 0: old path and new")
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out, "parity.png"), dpi=100)
  print(open(os.path.join(out, "parity.md")).read())


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--path", choices=("old", "new", "compare"), required=True)
  ap.add_argument("--old_root", default="/tmp/old65", help="a checkout of commit e7b63f9")
  ap.add_argument("--steps", type=int, default=80)
  ap.add_argument("--train", default=",".join(os.path.join(ROOT, p) for p in TOURS.split(",")))
  ap.add_argument("--start", default=os.path.join(ROOT, "data", "world_model"))
  ap.add_argument("--out", default=os.path.join(ROOT, "runs", "drill_parity"))
  args = ap.parse_args()
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  if args.path == "compare":
    compare(out)
    return
  start = os.path.abspath(args.start)
  if args.path == "old":
    res = run_old(os.path.abspath(args.old_root), args.steps, args.train, start,
                  os.path.join(out, "old"))
  else:
    res = run_new(args.steps, args.train, start, os.path.join(out, "new"))
  with open(os.path.join(out, f"parity_{args.path}.json"), "w") as f:
    json.dump(res, f, indent=1)
  print(json.dumps({k: v for k, v in res.items() if k not in ("loss", "held_out")}))


if __name__ == "__main__":
  main()
