"""The induction drill: teaches a trained model to copy from its context before more CPT.

  python launch/copy_drill.py --start=data/world_model --out=runs/world_model_drilled
  python launch/copy_drill.py --start=DIR --out=DIR --phases=64:1000,512:700 --lr=1e-3

A small world model trained on trajectories never learns to look text up in its context and write
it out (an `ls` of the initial state's files, a page size named by the simulation instruction);
on the classic induction task (random ids, each segment written twice) it sits on a long plateau
(docs/reproduce.md, "Copying"). Short rows shorten the plateau: the drill trains on rows of 64
ids first (segments of 2-8 ids) and then on rows of 512 (segments of 16-64), loss on every
token, AdamW at a constant learning rate after a 20-step warm-up, a fresh optimizer and the same
row seed in each phase. Every `--every` steps it scores 16 held-out rows: the mean NLL of the
first and of the second copies (a model that copies prices the second far below the first).

The drill overwrites what the start knew about trajectories (random ids are all it sees; with
--train=attention too). A CPT continuation with copy drills in its knowledge text
(`launch/reproduce.py --cpt_from=OUT --knowledge=search,actions,copy`) keeps the copying, but
600 steps of it did not bring the shipped world model's skill back
(experiments/copy_drill_cpt600/): this is a tool for experiments, not a step of the recipe that
ships. Writes OUT as a Hugging Face folder with the start's tokenizer.model, OUT/drill.jsonl (one
line per score) and OUT/provenance.json (the command, and the start's provenance).
"""
import json
import os
import shutil
import sys
import time

import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import nnx

from lwm_jax import hf, run_folder  # pylint: disable=wrong-import-position
from lwm_jax.checkpoints import read_provenance  # pylint: disable=wrong-import-position
from lwm_jax.data.drills import induction_rows, segment_range  # pylint: disable=wrong-import-position
from lwm_jax.train.losses import token_logprobs  # pylint: disable=wrong-import-position


TOKENS_PER_STEP = 8192
WARMUP = 20


def parse_phases(text: str) -> list[tuple[int, int]]:
  """'64:1000,512:400' -> [(64, 1000), (512, 400)], each row a divisor of 8,192 and >= 8."""
  phases = []
  for part in text.split(","):
    try:
      row, steps = (int(x) for x in part.split(":"))
    except ValueError:
      raise SystemExit(f"--phases: {part!r} is not ROW:STEPS") from None
    if row < 8 or TOKENS_PER_STEP % row or steps < 1:
      raise SystemExit(f"--phases: {part!r}: ROW must divide {TOKENS_PER_STEP} and be >= 8, "
                       "STEPS >= 1")
    phases.append((row, steps))
  return phases


def drill(model, row: int, steps: int, lr: float, every: int, log, train: str = "all") -> None:
  """One phase on `model` (in place): fresh AdamW, rows of `row` ids, the same seeds each phase;
  `train` = "attention" changes only the parameters under a layer's `self_attn`."""
  vocab, seg = model.cfg.vocab_size, segment_range(row)
  warm = min(WARMUP, steps // 2)
  sched = optax.join_schedules([optax.linear_schedule(0.0, lr, warm), optax.constant_schedule(lr)],
                               [warm])
  wrt = nnx.Param if train == "all" else nnx.All(nnx.Param, nnx.PathContains("self_attn"))
  opt = nnx.Optimizer(model, optax.adamw(sched, weight_decay=0.1), wrt=wrt)

  def nll(m, toks):
    return -token_logprobs(m(toks).logits[:, :-1], toks[:, 1:])[0]

  @nnx.jit
  def step(m, o, toks):
    loss, g = nnx.value_and_grad(lambda m: nll(m, toks).mean(), argnums=nnx.DiffState(0, wrt))(m)
    o.update(m, g)
    return loss

  score = nnx.jit(nll)
  rows = lambda rng, n: induction_rows(rng, n, row, vocab - 3, seg)  # noqa: E731
  rng, (test, second) = np.random.default_rng(0), rows(np.random.default_rng(123), 16)
  t0 = time.time()
  for s in range(1, steps + 1):
    loss = step(model, opt, jnp.asarray(rows(rng, TOKENS_PER_STEP // row)[0]))
    if s % every == 0 or s in (1, steps):
      n, m = np.asarray(score(model, jnp.asarray(test))), second[:, 1:]
      log({"row": row, "step": s, "train_loss": round(float(loss), 3),
           "first": round(float(n[~m].mean()), 3), "second": round(float(n[m].mean()), 3),
           "s": round(time.time() - t0)})


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  phases = parse_phases(FLAGS.phases)
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
