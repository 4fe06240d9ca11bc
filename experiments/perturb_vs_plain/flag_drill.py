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
"""
import sys, time, json
import numpy as np, jax, jax.numpy as jnp, optax
from flax import nnx
from lwm_jax.model.transformer import Transformer
from lwm_jax.train import run_config as rc
from configs import stages

PHASE_STEPS = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "300").split(",")]
EVERY = int(sys.argv[2]) if len(sys.argv) > 2 else 25
LR = float(sys.argv[3]) if len(sys.argv) > 3 else 3e-3
LENGTHS = [int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "256").split(",")]
B, V = int(sys.argv[5]) if len(sys.argv) > 5 else 32, 2048
START = sys.argv[6] if len(sys.argv) > 6 else ""
if len(PHASE_STEPS) != len(LENGTHS):
  raise SystemExit(f"{len(PHASE_STEPS)} step counts for {len(LENGTHS)} row lengths")
FLAG_A, FLAG_B, QUERY, FIRST_FILLER = 3, 4, 5, 16
_c = stages.STAGE_CONFIGS["cpt"].get_config("demo")  # the reproduction's model, as configured
_c.model.vocab_size, _c.model.max_position_embeddings = V, max(LENGTHS)
_c.train.seq_len = max(LENGTHS)
cfg = rc.validate_config(_c)
_answers = np.random.default_rng(7).choice(np.arange(FIRST_FILLER, V), 16, replace=False)
ANSWER = {FLAG_A: _answers[:8], FLAG_B: _answers[8:]}  # X and Y share no token


def rows(rng, n, S):
  """Tokens [n, S] and the loss weights (1 on the answer tokens)."""
  toks = rng.integers(FIRST_FILLER, V, (n, S)).astype(np.int32)
  weight = np.zeros((n, S), np.float32)
  for r in range(n):
    flag = FLAG_A if rng.random() < 0.5 else FLAG_B
    toks[r, rng.integers(0, 48)] = flag
    toks[r, S - 9] = QUERY
    toks[r, S - 8:] = ANSWER[flag]
    weight[r, S - 8:] = 1.0
  return toks, weight


if START:
  from lwm_jax import hf
  model = hf.load_pretrained(START, dtype="float32")
  if model.cfg.vocab_size != V:
    raise SystemExit(f"{START}: vocabulary {model.cfg.vocab_size}, the drill uses {V}")
else:
  model = Transformer(cfg, rngs=nnx.Rngs(0))


def optimizer(steps):
  warm = min(20, steps // 2)
  return nnx.Optimizer(model, optax.adamw(optax.warmup_cosine_decay_schedule(
      0, LR, warm, max(steps, 2 * warm + 1)), weight_decay=0.1), wrt=nnx.Param)


def nll(model, toks):
  lp = jax.nn.log_softmax(model(toks).logits.astype(jnp.float32), -1)
  return -jnp.take_along_axis(lp[:, :-1], toks[:, 1:, None], -1)[..., 0], lp


@nnx.jit
def step(model, opt, toks, weight):
  def loss_fn(m):
    n, _ = nll(m, toks)
    w = weight[:, 1:]
    return (n * w).sum() / w.sum()
  loss, g = nnx.value_and_grad(loss_fn)(model)
  opt.update(model, g)
  return loss


@nnx.jit
def first_answer(model, toks):
  """NLL of the first answer token and whether it is the argmax (predicted at the query)."""
  n, lp = nll(model, toks)
  at = toks.shape[1] - 9  # the query's position predicts the first answer token
  return n[:, at], jnp.argmax(lp[:, at], -1) == toks[:, at + 1]


def report(s, loss, S, t0, phase):
  test, _ = rows(np.random.default_rng(123), 64, S)
  n, right = first_answer(model, jnp.asarray(test))
  print(json.dumps({"phase": phase, "rows": S, "step": s,
                    **({"loss": round(float(loss), 4)} if loss is not None else {}),
                    "first_answer_nll": round(float(np.mean(n)), 4),
                    "first_answer_right": round(float(np.mean(right)), 3),
                    "s": round(time.time() - t0)}), flush=True)


rng = np.random.default_rng(0)
t0 = time.time()
for phase, (steps, S) in enumerate(zip(PHASE_STEPS, LENGTHS)):
  opt = optimizer(steps)
  for s in range(1, steps + 1):
    t, w = rows(rng, B, S)
    loss = step(model, opt, jnp.asarray(t), jnp.asarray(w))
    if s % EVERY == 0 or s == 1:
      report(s, loss, S, t0, phase)
  if len(LENGTHS) > 1 and S != max(LENGTHS):
    report(steps, None, max(LENGTHS), t0, phase)
