"""Can the `demo` architecture condition on a distant flag at all, and in how many steps?

The perturbation runs found that no world model here uses the simulation instruction in its
system prompt. This drill isolates that skill from everything else. Each row of S tokens is
random filler with one flag token (A or B, drawn at random) somewhere in its first 48 tokens;
the row ends with a query token Q and one of two fixed 8-token answers: answer X after flag A,
answer Y after flag B. The loss falls on the answer tokens only. A model that ignores the flag
can do no better than ln 2 = 0.693 nats on the first answer token (the other seven follow from
the first); one that reads the flag drives it to 0. Trained from random initialisation with the
reproduction's `demo` model (4 layers, hidden 128), AdamW with warm-up and cosine decay.

  python experiments/perturb_vs_plain/flag_drill.py [STEPS] [EVERY] [LR] [S] [B] [START]

Every EVERY steps it prints the mean NLL of the first answer token on 64 fresh rows, and the
share of those rows whose most likely first answer token is the right one.

A curriculum: comma lists for STEPS and S (e.g. `250,300,200 25 3e-3 256,512,1024 16`) train the
same model phase after phase on rows of each length (a fresh warm-up and cosine decay each
phase); the test rows are those of the phase, and at each phase's end also those of the longest.

START (a Hugging Face checkpoint folder of the same vocabulary, e.g. data/world_model) trains that
model instead of a randomly initialised one: does a model pre-trained on the corpus learn the
drill as fast as a fresh one?

Each phase is a run of the one trainer on `data.drills.kind = "flag"` rows
(`lwm_jax.data.drills.flag_rows`), scored at its checkpoints (lwm_jax/train/scored_run.py):
AdamW without clipping, cosine decay to 0, weight decay 0.1 on the weight matrices only (the
trainer's rule; the runs recorded here before 2026-12-07 decayed every parameter).
"""
import json
import os
import sys
import tempfile

import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import stages
from lwm_jax import hf
from lwm_jax.data import drill_sources, drills
from lwm_jax.train import scored_run

PHASE_STEPS = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "300").split(",")]
EVERY = int(sys.argv[2]) if len(sys.argv) > 2 else 25
LR = float(sys.argv[3]) if len(sys.argv) > 3 else 3e-3
LENGTHS = [int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "256").split(",")]
B, V = int(sys.argv[5]) if len(sys.argv) > 5 else 32, 2048
START = sys.argv[6] if len(sys.argv) > 6 else ""
if len(PHASE_STEPS) != len(LENGTHS):
  raise SystemExit(f"{len(PHASE_STEPS)} step counts for {len(LENGTHS)} row lengths")
if START and hf.read_config(START).vocab_size != V:
  raise SystemExit(f"{START}: vocabulary {hf.read_config(START).vocab_size}, the drill uses {V}")


def config(steps: int, S: int, init_from: str):
  c = stages.STAGE_CONFIGS["cpt"].get_config("demo")  # the reproduction's model, as configured
  c.model.update(vocab_size=V, max_position_embeddings=max(LENGTHS))
  c.seed = 0
  c.train.update(num_steps=steps, batch_size=B, seq_len=S, log_every=EVERY, eval_every=0,
                 aux_loss_coef=0.0, precision="float32", progress=False)
  c.optim.update(lr=LR, warmup_steps=min(20, steps // 2), grad_clip=0.0, b2=0.999,
                 weight_decay=0.1, end_lr_ratio=0.0)
  c.checkpoint.update(every=EVERY, keep=steps // EVERY + 2, use_async=False)
  c.data.source = "drills"
  c.data.drills = drill_sources.default_config()
  c.data.drills.kind = "flag"
  c.init_from_hf = init_from
  c.export_hf = True
  return c


_nll = nnx.jit(lambda m, toks: m(toks).logits)


def first_answer(model, S: int) -> dict:
  """NLL of the first answer token on 64 fixed test rows of length S, and the share right."""
  test, _ = drills.flag_rows(np.random.default_rng(123), 64, S, V)
  at = S - drills.FLAG_ANSWER_LEN - 1  # the query's position predicts the first answer token
  logits = np.asarray(_nll(model, jnp.asarray(test))[:, at], np.float64)
  logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  want = test[:, at + 1]
  return {"rows": S, "first_answer_nll": round(float(-logp[np.arange(64), want].mean()), 4),
          "first_answer_right": round(float((logits.argmax(-1) == want).mean()), 3)}


def main():
  log = lambda rec: print(json.dumps(rec), flush=True)
  init_from = START
  with tempfile.TemporaryDirectory() as tmp:
    for phase, (steps, S) in enumerate(zip(PHASE_STEPS, LENGTHS)):
      summary = scored_run.train_and_score(
          config(steps, S, init_from), os.path.join(tmp, f"phase{phase}"),
          lambda m, S=S: first_answer(m, S), log, extra={"phase": phase})
      init_from = summary["export_hf"]
      if len(LENGTHS) > 1 and S != max(LENGTHS):
        log({"phase": phase, "step": steps,
             **first_answer(hf.load_pretrained(init_from, dtype="float32"), max(LENGTHS))})


if __name__ == "__main__":
  main()
