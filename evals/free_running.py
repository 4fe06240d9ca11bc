"""Free-running evaluation of trained world models on a corpus's test split, beside the
copy-previous and empty baselines (the evaluation `launch/reproduce.py` runs, for any checkpoint).

  python evals/free_running.py --model=sft=data/world_model [--model=cpt=runs/r/cpt_it:cpt]
      [--corpus=data/corpus] [--split=test] [--max_turns=20] [--seed=0] [--max_new_tokens=320]
      [--batch=32] --out=runs/free_running

`--split=validation` scores the validation split instead: choose settings there, so that the
test split's figures stay a held-out measurement.

Each `--model` is NAME=DIR or NAME=DIR:STAGE, where DIR is a run folder (its checkpoints) or a
Hugging Face folder with its tokenizer.model, and STAGE (`sft` by default, or `cpt`, `rl`) picks
how it is prompted (`lwm_jax.eval.free_running.prompting`). `--max_turns` turns per domain are a
seeded sample (the same turns for the same seed as the reproduction's; 0: every turn). Each
turn is generated greedily from the true history. Writes free_running.md / .json / PNGs and
predictions/NAME.jsonl under `--out`, and prints the tables.
"""
from lwm_jax.eval.free_running_cli import main

if __name__ == "__main__":
  main()
