"""Can the `demo` architecture learn to copy at all, and in how many steps? Trains it from random
initialisation on the induction task alone: rows of 512 tokens made of random-token segments of
16-64 tokens, each written twice; loss on every token. Prints the mean NLL of first and second
copies on fresh rows every EVERY steps (the loss of a second copy drops towards 0 once the model
copies; uniform guessing costs ln(vocab)).

  [ROW=512] python experiments/copy_drills_random/alone.py [STEPS] [EVERY] [LR] [ALPHABET] [ARCH]

ALPHABET (default: the whole 2,048-token vocabulary) draws the segments from the first ALPHABET
ordinary ids only, a smaller and easier version of the task. ARCH `hybrid` swaps the demo's
attention layers for Qwen3.5's hybrid stack at the same width (see HYBRID below); default `demo`.
"""
import os, sys, time, json, shutil
import numpy as np, jax, jax.numpy as jnp, optax
from flax import nnx
from lwm_jax import hf
from lwm_jax.data.drills import induction_rows, segment_range
from lwm_jax.model.transformer import Transformer
from lwm_jax.train import run_config as rc
from configs import stages

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 400
EVERY = int(sys.argv[2]) if len(sys.argv) > 2 else 50
LR = float(sys.argv[3]) if len(sys.argv) > 3 else 3e-3
V = 2048
# ROW (environment): tokens per row, 512 by default; shorter rows keep the tokens per step
# (B x ROW = 8,192) and scale the segment lengths with the row (16-64 at 512).
S = int(os.environ.get("ROW", 512))
B = 8192 // S
SEG = segment_range(S)
ALPHABET = int(sys.argv[4]) if len(sys.argv) > 4 else V - 3
_c = stages.STAGE_CONFIGS["cpt"].get_config("demo")  # the reproduction's model, as configured
_c.model.vocab_size, _c.model.max_position_embeddings, _c.train.seq_len = V, S, S
ARCH = sys.argv[5] if len(sys.argv) > 5 else "demo"
# the demo's width with Qwen3.5-MoE layers: Gated DeltaNet (short causal conv + delta rule) in
# layers 1-3, full attention in layer 4, a shared expert beside the routed ones
HYBRID = dict(model_type="qwen3_5_moe_text", full_attention_interval=4, partial_rotary_factor=0.5,
              shared_expert_intermediate_size=128, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)
if ARCH == "hybrid":
  _c.model.update(HYBRID)
elif ARCH != "demo":
  raise SystemExit(f"ARCH must be demo or hybrid, not {ARCH!r}")
cfg = rc.validate_config(_c)


def rows(rng, n):
  return induction_rows(rng, n, S, ALPHABET, SEG)


# INIT (environment): an HF checkpoint folder to start from (e.g. data/world_model) instead of
# random initialisation; its vocabulary and width replace the configured ones.
INIT = os.environ.get("INIT")
SAVE, SAVE_EVERY = os.environ.get("SAVE"), int(os.environ.get("SAVE_EVERY", 250))
if INIT:
  model = hf.load_pretrained(INIT, dtype="float32")
else:
  model = Transformer(cfg, rngs=nnx.Rngs(0))
WARM = min(20, STEPS // 2)
# SCHEDULE=constant (environment) holds LR after the warm-up instead of the cosine decay
sched = (optax.join_schedules([optax.linear_schedule(0, LR, WARM), optax.constant_schedule(LR)], [WARM])
         if os.environ.get("SCHEDULE") == "constant"
         else optax.warmup_cosine_decay_schedule(0, LR, WARM, max(STEPS, 2 * WARM + 1)))
opt = nnx.Optimizer(model, optax.adamw(sched, weight_decay=0.1), wrt=nnx.Param)


def nll(model, toks):
  lp = jax.nn.log_softmax(model(toks).logits.astype(jnp.float32), -1)
  return -jnp.take_along_axis(lp[:, :-1], toks[:, 1:, None], -1)[..., 0]


@nnx.jit
def step(model, opt, toks):
  loss, g = nnx.value_and_grad(lambda m: nll(m, toks).mean())(model)
  opt.update(model, g)
  return loss


@nnx.jit
def score(model, toks):
  return nll(model, toks)


rng = np.random.default_rng(0)
test, sec = rows(np.random.default_rng(123), 16)
t0 = time.time()
for s in range(1, STEPS + 1):
  loss = step(model, opt, jnp.asarray(rows(rng, B)[0]))
  if s % EVERY == 0 or s == 1:
    n = np.asarray(score(model, jnp.asarray(test)))
    m = sec[:, 1:]
    print(json.dumps({"step": s, "train_loss": round(float(loss), 3),
                      "first": round(float(n[~m].mean()), 3), "second": round(float(n[m].mean()), 3),
                      "s": round(time.time() - t0)}), flush=True)
  if SAVE and (s % SAVE_EVERY == 0 or s == STEPS):
    # SAVE (environment): a folder for the model in HF layout (with INIT's tokenizer.model) every
    # SAVE_EVERY steps and at the end, for probe.py or a CPT that continues from it
    hf.save_pretrained(model, SAVE)
    if INIT and os.path.isfile(os.path.join(INIT, "tokenizer.model")):
      shutil.copy(os.path.join(INIT, "tokenizer.model"), SAVE)
