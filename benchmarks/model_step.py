"""Forward+backward tokens/s and MFU of a model preset, per MoE backend, beside HF transformers.

  python benchmarks/model_step.py --preset=small --batch=8 --seq=256 [--backends=tiled,blocked]
      [--xent_chunk=512] [--norm_backwards=xla,written]
  python benchmarks/model_step.py --preset=small_hybrid --batch=1 --seq=2048 --out=model_step_hybrid
Prints a table and writes benchmarks/results/model_step.json. HF transformers (torch CPU) runs in
the same process when installed (`pip install -e .[hf]`); the ratio column compares with it. The
systems interleave (every round times each once; the machine may be shared), the table has medians
and the JSON every round's time.
"""
from __future__ import annotations

import os
import statistics
import time


from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import common
from lwm_jax.model import sizes
from lwm_jax.model.config import get_preset, to_hf_dict
from lwm_jax.model.transformer import Transformer
from lwm_jax.train import losses

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "small", "model preset")
flags.DEFINE_integer("batch", 8, "batch size")
flags.DEFINE_integer("seq", 256, "sequence length")
flags.DEFINE_integer("steps", 5, "interleaved rounds (median)")
flags.DEFINE_list("backends", ["tiled", "blocked", "sorted", "capacity", "dense", "ragged_dot"],
                  "MoE backends")
flags.DEFINE_integer("xent_chunk", 0, "also time the first backend with the loss taken this many "
                     "tokens at a time (`losses.chunked_cross_entropy_sums`, the trainer's "
                     "`train.xent_chunk`)")
flags.DEFINE_list("norm_backwards", [], "also time the --xent_chunk runner (the first backend's "
                  "when no chunk) under each of these model.norm_backward forms (auto|xla|written)")
flags.DEFINE_bool("hf", True, "also time HF transformers (torch) when installed")
flags.DEFINE_string("out", "model_step", "result name under benchmarks/results/")


def jax_runner(cfg, tokens, xent_chunk=0):
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss(params, tokens):
    m = nnx.merge(graphdef, params, rest)
    if xent_chunk:
      out = m(tokens, return_hidden=True)
      ones = jnp.ones(tokens.shape, jnp.int32)
      s = losses.chunked_cross_entropy_sums(out.logits, m.head_DxV(), tokens, ones, ones,
                                            chunk=xent_chunk)
      nll = s["loss"] / s["weight"]
    else:
      out = m(tokens)
      logp = jax.nn.log_softmax(out.logits[:, :-1])
      nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()
    return nll + cfg.router_aux_loss_coef * out.aux_loss, out.dropped_tokens

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  run = lambda: jax.block_until_ready(step(params, tokens))
  (_, dropped), _ = run()
  return run, int(dropped)


def hf_runner(cfg, tokens_np):
  try:
    import torch
    import transformers
  except ImportError:
    return None
  torch.manual_seed(0)
  torch.set_num_threads(os.cpu_count())
  kw = {k: v for k, v in to_hf_dict(cfg).items() if k not in ("architectures", "torch_dtype")}
  if cfg.is_hybrid:
    hf_cfg = transformers.Qwen3_5MoeTextConfig(**kw)
    model_cls = transformers.Qwen3_5MoeForCausalLM
  else:
    hf_cfg = transformers.Qwen3MoeConfig(**kw)
    model_cls = transformers.Qwen3MoeForCausalLM
  hf_cfg.output_router_logits = True
  model = model_cls(hf_cfg).float().train()
  ids = torch.from_numpy(np.asarray(tokens_np, np.int64))

  def run():
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
  return run


def main(_):
  peak = common.matmul_peak_gflops()
  base = get_preset(FLAGS.preset)
  flops = sizes.count(base).train_flops_per_token(base, FLAGS.seq)
  tokens = jax.random.randint(jax.random.key(0), (FLAGS.batch, FLAGS.seq), 0, base.vocab_size)
  n_tok = FLAGS.batch * FLAGS.seq
  runners, dropped = {}, {}
  for backend in FLAGS.backends:
    runners[f"lwm_jax {backend}"], dropped[f"lwm_jax {backend}"] = jax_runner(
        base.replace(moe_backend=backend), tokens)
  first = f"lwm_jax {FLAGS.backends[0]}"
  if FLAGS.xent_chunk:
    first = f"{first} + chunked xent {FLAGS.xent_chunk}"
    runners[first], dropped[first] = jax_runner(base.replace(moe_backend=FLAGS.backends[0]), tokens,
                                                FLAGS.xent_chunk)
  for form in FLAGS.norm_backwards:
    name = f"{first} + norms {form}"
    runners[name], dropped[name] = jax_runner(
        base.replace(moe_backend=FLAGS.backends[0], norm_backward=form).validate(), tokens,
        FLAGS.xent_chunk)
  if FLAGS.hf:
    run = hf_runner(base, np.asarray(tokens))
    if run is not None:
      run()  # warm-up
      runners["HF transformers (torch)"], dropped["HF transformers (torch)"] = run, 0
  times = {k: [] for k in runners}
  for r in range(FLAGS.steps):
    for k, run in runners.items():
      if r and k.endswith("ragged_dot") and jax.default_backend() == "cpu":
        continue  # ~20x slower than the others on CPU: one round tells
      t0 = time.perf_counter()
      run()
      times[k].append(time.perf_counter() - t0)
  rows = []
  for k, ts in times.items():
    t = statistics.median(ts)
    rows.append({"system": k, "tokens/s": round(n_tok / t, 1),
                 "MFU %": round(100 * n_tok / t * flops / (peak * 1e9), 1),
                 "step s": round(t, 3), "dropped": dropped[k]})
  hf = next((r for r in rows if r["system"].startswith("HF")), None)
  for r in rows:
    r["vs HF"] = f"{r['tokens/s'] / hf['tokens/s']:.2f}x" if hf else "-"
  print(f"preset={FLAGS.preset} batch={FLAGS.batch}x{FLAGS.seq} fwd+bwd fp32, "
        f"{flops / 1e6:.1f} MFLOP/token, measured matmul peak {peak:.0f} GFLOP/s")
  print(common.table(rows, ["system", "tokens/s", "MFU %", "step s", "dropped", "vs HF"]))
  path = common.write_result(FLAGS.out, {
      "preset": FLAGS.preset, "batch": FLAGS.batch, "seq": FLAGS.seq, "peak_gflops": peak,
      "train_flops_per_token": flops, "rows": rows, "step_s_per_round": times,
      "norm_backward_default": base.norm_backward, "written_norms_by_default": base.written_norms,
      "load_average": os.getloadavg()})
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
