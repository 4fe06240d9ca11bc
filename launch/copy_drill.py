"""The induction drill: teaches a trained model to copy from its context before more CPT.

  python launch/copy_drill.py --start=data/world_model --out=runs/world_model_drilled
  python launch/copy_drill.py --start=DIR --out=DIR --phases=64:1000,512:700 --lr=1e-3

A small world model trained on trajectories never learns to look text up in its context and write
it out (an `ls` of the initial state's files, a page size named by the simulation instruction);
on the classic induction task (random ids, each segment written twice) it sits on a long plateau
(docs/reproduce.md, "Copying"). Short rows shorten the plateau: the drill trains on rows of 64
ids first (segments of 2-8 ids) and then on rows of 512 (segments of 16-64), loss on every
token, AdamW at a constant learning rate after a 20-step warm-up, a fresh optimizer and the same
row seed in each phase, each phase a run of the one trainer on the induction rows of
lwm_jax/data/drill_sources.py (weight decay on matrices only, as every run of the trainer). Every
`--every` steps (and at a phase's last) it scores 16 held-out rows with that step's checkpoint:
the mean NLL of the first and of the second copies (a model that copies prices the second far
below the first).

The drill overwrites what the start knew about trajectories (random ids are all it sees; with
--train=attention too). A CPT continuation with copy drills in its knowledge text
(`launch/reproduce.py --config.cpt_from=OUT --config.knowledge=search,actions,copy`) keeps the
copying, but 600 steps of it did not bring the shipped world model's skill back
(experiments/copy_drill_cpt600/): this is a tool for experiments, not a step of the recipe that
ships. Writes OUT as a Hugging Face folder with the start's tokenizer.model, OUT/drill.jsonl (one
line per score) and OUT/provenance.json (the command, and the start's provenance).
"""
import json
import os
import shutil
import sys
import tempfile

import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from lwm_jax import hf, run_folder  # pylint: disable=wrong-import-position
from lwm_jax.checkpoints import read_provenance  # pylint: disable=wrong-import-position
from lwm_jax.data.drills import induction_rows, parse_phases, segment_range  # pylint: disable=wrong-import-position
from lwm_jax.train.losses import token_logprobs  # pylint: disable=wrong-import-position


TOKENS_PER_STEP = 8192
WARMUP = 20


def drill_config(row: int, steps: int, lr: float, every: int, train: str = "all"):
  """The trainer's config of one phase: induction rows of `row` ids (`data.drills.kind =
  "induction"`), TOKENS_PER_STEP ids a step, loss on every token (no MoE auxiliary loss), AdamW
  without clipping at a constant rate `lr` after a linear warm-up of min(WARMUP, steps // 2)
  steps, a checkpoint every `every` steps (scored afterwards); `train` = "attention" changes only
  the parameters under a layer's `self_attn`."""
  from configs import common  # pylint: disable=import-outside-toplevel
  from lwm_jax.data import drill_sources  # pylint: disable=import-outside-toplevel
  c = common.get_stage_config("cpt", "tiny")
  c.train.update(num_steps=steps, batch_size=TOKENS_PER_STEP // row, seq_len=row,
                 log_every=every, eval_every=0, aux_loss_coef=0.0, precision="float32",
                 progress=False)
  c.optim.update(lr=lr, warmup_steps=min(WARMUP, steps // 2), end_lr_ratio=1.0, b2=0.999,
                 grad_clip=0.0)
  c.optim.trainable = "" if train == "all" else "self_attn"
  c.checkpoint.update(every=every, keep=steps // every + 2, use_async=False)
  c.data.source = "drills"
  c.data.drills = drill_sources.default_config()
  c.data.drills.kind = "induction"
  c.export_hf = True
  return c


def drill(model, row: int, steps: int, lr: float, every: int, log, train: str = "all") -> None:
  """One phase on `model` (in place), trained by the one trainer (lwm_jax/train/trainer.py)
  from a fresh optimizer, rows of `row` ids, the same row seed each phase. Logs, at every
  `every`-th step and the last, the step's training loss and the held-out scores of its
  checkpoint."""
  from lwm_jax.train import scored_run  # pylint: disable=import-outside-toplevel
  vocab = model.cfg.vocab_size
  test, second = induction_rows(np.random.default_rng(123), 16, row, vocab - 3,
                                segment_range(row))
  nll = nnx.jit(lambda m, toks: -token_logprobs(m(toks).logits[:, :-1], toks[:, 1:])[0])
  s = second[:, 1:]

  def score(m) -> dict:
    n = np.asarray(nll(m, jnp.asarray(test)))
    return {"first": round(float(n[~s].mean()), 3), "second": round(float(n[s].mean()), 3)}

  with tempfile.TemporaryDirectory() as tmp:
    start, wd = os.path.join(tmp, "start"), os.path.join(tmp, "run")
    hf.save_pretrained(model, start)
    c = drill_config(row, steps, lr, every, train)
    c.init_from_hf = start
    c.model = type(c.model)(model.cfg.to_dict())  # the start's architecture (checked before)
    summary = scored_run.train_and_score(c, wd, score, log, extra={"row": row})
    trained = hf.load_pretrained(summary["export_hf"], dtype="float32")
  nnx.update(model, nnx.state(trained))


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  phases = parse_phases(FLAGS.phases, TOKENS_PER_STEP)
  sp = os.path.join(FLAGS.start, "tokenizer.model")
  if not os.path.isfile(os.path.join(FLAGS.start, "config.json")) or not os.path.isfile(sp):
    raise SystemExit(f"--start: {FLAGS.start} needs config.json and tokenizer.model")
  if os.path.realpath(FLAGS.out) == os.path.realpath(FLAGS.start):
    raise SystemExit("--out must not be --start (the drill replaces --out)")
  try:
    run_folder.check(FLAGS.out, "--out", FLAGS.overwrite)
    model = hf.load_pretrained(FLAGS.start, dtype="float32")
    run_folder.prepare(FLAGS.out, "--out", FLAGS.overwrite)
  except (ValueError, hf.CheckpointError) as e:
    raise SystemExit(str(e)) from None
  scores = []
  with open(os.path.join(FLAGS.out, "drill.jsonl"), "w") as f:
    def log(rec):
      scores.append(rec)
      print(json.dumps(rec), flush=True)
      f.write(json.dumps(rec) + "\n")
      f.flush()
    for row, steps in phases:
      drill(model, row, steps, FLAGS.lr, FLAGS.every, log, FLAGS.train)
  hf.save_pretrained(model, FLAGS.out)
  shutil.copy(sp, FLAGS.out)
  write_provenance(FLAGS.out, "launch/copy_drill.py " + " ".join(sys.argv[1:]), FLAGS.start,
                   {"phases": phases, "lr": FLAGS.lr, "train": FLAGS.train,
                    "last_score": scores[-1]})
  hf.write_checksums(FLAGS.out)  # with the tokenizer and provenance added after the export


def write_provenance(out: str, command: str, start: str, drill_info: dict) -> None:
  """OUT/provenance.json: the command, the drill's settings and last score, and the start's own
  provenance.json under `drill_from` (so a CPT that continues from OUT, and ships, keeps the
  whole chain of runs)."""
  earlier = read_provenance(start)
  with open(os.path.join(out, "provenance.json"), "w") as f:
    json.dump({"made_by": command, "drill": drill_info,
               "drill_from": {"folder": start, "provenance": earlier}}, f, indent=1)


def define_flags() -> None:
  """The command line's flags, defined only when this file runs as a script (tests import it)."""
  flags.DEFINE_string("start", None, "Hugging Face folder of the model to drill (with tokenizer.model)")
  flags.DEFINE_string("out", None, "output Hugging Face folder (replaced when this program made "
                      "it, else refused unless --overwrite)")
  flags.DEFINE_bool("overwrite", False, "replace --out even when this program did not make it")
  flags.DEFINE_string("phases", "64:1000,512:400,512:300", "ROW:STEPS,...: rows of ROW ids for "
                      "STEPS steps per phase, 8,192 ids a step; segments scale with the row "
                      "(16-64 ids at 512)")
  flags.DEFINE_float("lr", 1e-3, "AdamW learning rate after the warm-up")
  flags.DEFINE_enum("train", "all", ["all", "attention"], "which weights the drill changes: all, "
                    "or the attention layers' only (the experts, norms and embeddings, where much of "
                    "what the start knows lives, stay as they are)")
  flags.DEFINE_integer("every", 50, "score the held-out rows every this many steps")
  flags.mark_flags_as_required(["start", "out"])


if __name__ == "__main__":
  define_flags()
  app.run(main)
