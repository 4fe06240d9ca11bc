"""The command line of `evals/free_running.py`: free-running evaluation of trained world
models on a corpus's test split, beside the copy-previous and empty baselines (the evaluation `launch/reproduce.py` runs, for any checkpoint).

  python evals/free_running.py --model=sft=data/world_model [--model=cpt=runs/r/cpt_it:cpt]
      [--corpus=data/corpus] [--split=test] [--max_turns=20] [--seed=0] [--max_new_tokens=320]
      [--batch=32] [--loop_guard=cut|resample] --out=runs/free_running

`--split=validation` scores the validation split instead: choose settings there, so that the
test split's figures stay a held-out measurement.

Each `--model` is NAME=DIR or NAME=DIR:STAGE, where DIR is a run folder (its checkpoints) or a
Hugging Face folder with its tokenizer.model, and STAGE (`sft` by default, or `cpt`, `rl`) picks
how it is prompted (`lwm_jax.eval.free_running.prompting`). `--max_turns` turns per domain are a
seeded sample (the same turns for the same seed as the reproduction's; 0: every turn). Each
turn is generated greedily from the true history. Writes free_running.md / .json / PNGs and
predictions/NAME.jsonl under `--out`, and prints the tables.
"""
from __future__ import annotations

import argparse
import os

# the repository's bundled corpus, when this package runs from a checkout (`pip install -e .`)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STAGES = ("sft", "cpt", "rl")


def parse_model(spec: str) -> tuple[str, str, str]:
  """NAME=DIR[:STAGE] -> (name, folder, stage); a bad spec is an error naming it."""
  name, sep, rest = spec.partition("=")
  if not sep or not name or not rest:
    raise SystemExit(f"--model {spec!r}: expected NAME=DIR or NAME=DIR:STAGE")
  folder, stage = rest, "sft"
  head, colon, tail = rest.rpartition(":")
  if colon and tail in STAGES:
    folder, stage = head, tail
  if not os.path.isdir(folder):
    raise SystemExit(f"--model {spec!r}: {folder} is not a folder")
  return name, folder, stage


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", action="append", required=True, help="NAME=DIR[:STAGE], repeatable")
  ap.add_argument("--corpus", default=os.path.join(ROOT, "data", "corpus"))
  ap.add_argument("--split", default="test", choices=("test", "validation"),
                  help="held-out split to score (validation: for choosing settings)")
  ap.add_argument("--max_turns", type=int, default=20, help="turns per domain (0: all)")
  ap.add_argument("--seed", type=int, default=0, help="seed of the turn sample")
  ap.add_argument("--max_new_tokens", type=int, default=320)
  ap.add_argument("--batch", type=int, default=32, help="turns generated together")
  ap.add_argument("--loop_guard", default="off", choices=("off", "cut", "resample"),
                  help="also score each model as the simulator with this loop guard gives it "
                       "(system NAME+GUARD; the greedy replies are shared)")
  ap.add_argument("--out", required=True, help="folder for the report and the predictions")
  a = ap.parse_args(argv)
  models = [parse_model(m) for m in a.model]
  names = [m[0] for m in models]
  if len(set(names)) != len(names):
    raise SystemExit(f"--model: names must differ, got {', '.join(names)}")
  if a.max_turns < 0:
    raise SystemExit(f"--max_turns must be >= 0 (0: every turn), got {a.max_turns}")
  from lwm_jax.data import splits  # pylint: disable=import-outside-toplevel
  from lwm_jax.eval import free_running as fr  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  held, train = splits.read_split(a.corpus, a.split), splits.read_split(a.corpus, "train")
  if not held:
    raise SystemExit(f"--corpus: no {a.corpus}/*_{a.split}.jsonl.gz")
  selection = fr.select_cases(held, a.max_turns or None, a.seed, fr.EVAL_VARIANT)
  print(selection.describe(), flush=True)
  preds, gen = {}, {}
  for name, folder, stage in models:
    variant, prefix = fr.prompting(stage)
    cases = fr.select_cases(held, a.max_turns or None, a.seed, variant).cases
    sampler = Sampler.from_checkpoint(folder)
    done = lambda i, n, name=name: print(f"\r  {name}: {i}/{n} turns", end="", flush=True)
    p, gen[name] = fr.generate(sampler, cases, a.max_new_tokens, a.batch, progress=done,
                               reply_prefix=prefix, loop_guard=a.loop_guard)
    print(flush=True)
    fr.write_predictions(cases, p, os.path.join(a.out, "predictions", f"{name}.jsonl"))
    preds[name] = {k: v["prediction"] for k, v in p.items()}
    if a.loop_guard != "off":
      preds[f"{name}+{a.loop_guard}"] = {k: v.get("guarded", v["prediction"]) for k, v in p.items()}
  res = fr.results(selection, preds, gen, train=train or None)
  res["models"] = {name: {"folder": folder, "stage": stage} for name, folder, stage in models}
  paths = fr.write_report(res, a.out,
                          title=f"Free-running evaluation ({a.corpus}, {a.split} split)")
  with open(paths["markdown"], encoding="utf-8") as f:
    print(f.read())
  for name in names:
    v = fr.versus(res, name)
    print(f"{name}: token F1 {v['overall']:+.2f} points over copy-previous, ahead in "
          f"{len(v['ahead'])} of {v['domains']} domains")
  print(f"report: {paths['markdown']}")


if __name__ == "__main__":
  main()
