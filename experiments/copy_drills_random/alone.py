"""Can the `demo` architecture learn to copy at all, and in how many steps? Trains it from random
initialisation on the induction task alone: rows of 512 tokens made of random-token segments of
16-64 tokens, each written twice; loss on every token. Prints the mean NLL of first and second
copies on fresh rows every EVERY steps (the loss of a second copy drops towards 0 once the model
copies; uniform guessing costs ln(vocab)).

  [ROW=512] python experiments/copy_drills_random/alone.py [STEPS] [EVERY] [LR] [ALPHABET] [ARCH]

ALPHABET (default: the whole 2,048-token vocabulary) draws the segments from the first ALPHABET
ordinary ids only, a smaller and easier version of the task. ARCH `hybrid` swaps the demo's
attention layers for Qwen3.5's hybrid stack at the same width (see HYBRID below); default `demo`.

Trained by the one trainer (`data.drills.kind = "induction"`, lwm_jax/train/scored_run.py): AdamW
without clipping, 20 warm-up steps then cosine decay to 0 (SCHEDULE=constant holds the rate),
weight decay 0.1 on the weight matrices only (the trainer's rule; the runs recorded here before
2026-12-07 decayed every parameter, norms and embeddings too). Environment: INIT (an HF folder to
start from instead of random initialisation; its vocabulary and width replace the configured
ones), SAVE (write the trained model there as an HF folder, with INIT's tokenizer.model), WORKDIR
(the run's checkpoints; default a temporary folder).
"""
import json
import os
import shutil
import sys
import tempfile

import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import stages
from lwm_jax.data import drill_sources
from lwm_jax.data.drills import induction_rows, segment_range
from lwm_jax.train import scored_run
from lwm_jax.train.losses import token_logprobs

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 400
EVERY = int(sys.argv[2]) if len(sys.argv) > 2 else 50
LR = float(sys.argv[3]) if len(sys.argv) > 3 else 3e-3
V = 2048
# ROW (environment): tokens per row, 512 by default; shorter rows keep the tokens per step
# (B x ROW = 8,192) and scale the segment lengths with the row (16-64 at 512).
S = int(os.environ.get("ROW", 512))
B = 8192 // S
ALPHABET = int(sys.argv[4]) if len(sys.argv) > 4 else V - 3
ARCH = sys.argv[5] if len(sys.argv) > 5 else "demo"
# the demo's width with Qwen3.5-MoE layers: Gated DeltaNet (short causal conv + delta rule) in
# layers 1-3, full attention in layer 4, a shared expert beside the routed ones
HYBRID = dict(model_type="qwen3_5_moe_text", full_attention_interval=4, partial_rotary_factor=0.5,
              shared_expert_intermediate_size=128, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)
if ARCH not in ("demo", "hybrid"):
  raise SystemExit(f"ARCH must be demo or hybrid, not {ARCH!r}")
INIT, SAVE = os.environ.get("INIT"), os.environ.get("SAVE")


def config():
  c = stages.STAGE_CONFIGS["cpt"].get_config("demo")  # the reproduction's model, as configured
  c.model.update(vocab_size=V, max_position_embeddings=S)
  if ARCH == "hybrid":
    c.model.update(HYBRID)
  warm = min(20, STEPS // 2)
  c.seed = 0
  c.train.update(num_steps=STEPS, batch_size=B, seq_len=S, log_every=EVERY, eval_every=0,
                 aux_loss_coef=0.0, precision="float32", progress=False)
  c.optim.update(lr=LR, warmup_steps=warm, grad_clip=0.0, b2=0.999, weight_decay=0.1,
                 end_lr_ratio=1.0 if os.environ.get("SCHEDULE") == "constant" else 0.0)
  c.checkpoint.update(every=EVERY, keep=STEPS // EVERY + 2, use_async=False)
  c.data.source = "drills"
  c.data.drills = drill_sources.default_config()
  c.data.drills.update(kind="induction", alphabet=ALPHABET)
  c.init_from_hf = INIT or ""
  c.export_hf = bool(SAVE)
  return c


def main():
  test, second = induction_rows(np.random.default_rng(123), 16, S, ALPHABET, segment_range(S))
  nll = nnx.jit(lambda m, toks: -token_logprobs(m(toks).logits[:, :-1], toks[:, 1:])[0])
  m2 = second[:, 1:]

  def score(model) -> dict:
    n = np.asarray(nll(model, jnp.asarray(test)))
    return {"first": round(float(n[~m2].mean()), 3), "second": round(float(n[m2].mean()), 3)}

  log = lambda rec: print(json.dumps(rec), flush=True)
  workdir = os.environ.get("WORKDIR")
  with tempfile.TemporaryDirectory() as tmp:
    summary = scored_run.train_and_score(config(), workdir or os.path.join(tmp, "run"), score, log)
    if SAVE:
      if os.path.exists(SAVE):
        shutil.rmtree(SAVE)
      shutil.copytree(summary["export_hf"], SAVE)
      if INIT and os.path.isfile(os.path.join(INIT, "tokenizer.model")):
        shutil.copy(os.path.join(INIT, "tokenizer.model"), SAVE)


if __name__ == "__main__":
  main()
