"""Teacher-forced scores of a trained world model, per split and domain: the observation body and
the reply format.

  python evals/teacher_forced.py --model=data/world_model [--corpus=data/corpus]
      [--splits=train,test] [--per_domain=20] [--stage=sft] [--out=runs/teacher_forced]

For each split and domain, one seeded target turn of each of `--per_domain` trajectories is
rendered as the stage renders it (`lwm_jax.eval.teacher_forced`) and the model reads it once:
"body" is the argmax accuracy on the observation's own tokens beside copy-previous, "format"
the argmax accuracy and the mean probability of the reply's fixed scaffolding (in thinking mode
`<think></think>`, the `<predicted_observation>` tags and the end marker). A body score close on
the train and test splits with a format probability far below 1 says the model has not learned
its reply format, which greedy decoding then shows (a second thinking block, a missing tag).
A sample keeps its whole history, so one longer than `--max_len` tokens (default: the model's
context) is skipped; the table counts them. Writes `teacher_forced.json` (with `--out`) and
prints the table.
"""
from __future__ import annotations

import argparse
import json
import os



def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", required=True, help="a Hugging Face folder with tokenizer.model")
  ap.add_argument("--corpus", default="data/corpus")
  ap.add_argument("--splits", default="train,test")
  ap.add_argument("--per_domain", type=int, default=20, help="trajectories per split and domain")
  ap.add_argument("--stage", default="sft", choices=("sft", "cpt"))
  ap.add_argument("--thinking", default="auto", choices=("auto", "on", "off"),
                  help="SFT targets in thinking mode or not (auto: the setting recorded in the "
                  "model's provenance.json, else on)")
  ap.add_argument("--max_len", type=int, default=0, help="longest sample (0: the model's context)")
  ap.add_argument("--out", default="")
  a = ap.parse_args(argv)
  from lwm_jax.data import schema, splits  # pylint: disable=import-outside-toplevel
  from lwm_jax.eval.teacher_forced import observation_accuracy  # pylint: disable=C0415
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  from lwm_jax.checkpoints import recorded_thinking  # pylint: disable=import-outside-toplevel
  thinking = recorded_thinking(a.model) if a.thinking == "auto" else a.thinking == "on"
  print(f"SFT targets rendered {'in thinking mode' if thinking else 'without thinking'}")
  sampler = Sampler.from_checkpoint(a.model)
  max_len = a.max_len or int(sampler.cfg.max_position_embeddings)
  rows = []
  for split in a.splits.split(","):
    files = splits.split_files(a.corpus, split)
    if not files:
      raise SystemExit(f"--splits: no {a.corpus}/*_{split}.jsonl.gz")
    by_domain: dict[str, list] = {}
    for path in files:
      for t in schema.read_jsonl(path):
        if len(by_domain.setdefault(t.domain, [])) < a.per_domain:
          by_domain[t.domain].append(t)
    for domain, trajs in sorted(by_domain.items()):
      acc = observation_accuracy(sampler.model, sampler.tokenizer, trajs, stage=a.stage,
                                 max_len=max_len, thinking=thinking)
      rows.append({"split": split, "domain": domain, "samples": acc.samples,
                   "skipped_longer_than_max_len": len(trajs) - acc.samples,
                   "body": acc.model, "copy_previous": acc.copy_previous, "tokens": acc.tokens,
                   "format": acc.scaffold, "format_prob": acc.scaffold_prob,
                   "format_tokens": acc.scaffold_tokens})
  print(f"samples longer than {max_len} tokens (the whole history is kept) are skipped and counted")
  print(f"{'split':>10} | {'domain':>9} | samples (skipped) | body | copy prev | format | "
        "format prob")
  for r in rows:
    kept = f"{r['samples']} ({r['skipped_longer_than_max_len']})"
    print(f"{r['split']:>10} | {r['domain']:>9} | {kept:>17} | {r['body']:.3f} | "
          f"{r['copy_previous']:9.3f} | {r['format']:6.3f} | {r['format_prob']:.3f}")
  if a.out:
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "teacher_forced.json"), "w") as f:
      json.dump({"model": a.model, "stage": a.stage, "max_len": max_len, "rows": rows}, f,
                indent=1)


if __name__ == "__main__":
  main()
