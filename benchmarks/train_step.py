"""A full training step (forward, backward, AdamW with clipping) of ours beside Hugging Face's on the
same machine, same config and same weights (docs/benchmark.md).

  python benchmarks/train_step.py [--rounds 4] [--batch 8] [--seq 256] [--layers 8]
      [--moe_backends tiled,blocked] [--xent_chunk 512] [--no_hf]

Ours is the trainer's compiled step (`steps.compile_xent_step`) once per MoE backend; with
`--xent_chunk N` also the same compiled step with `StepConfig(xent_chunk=N)` (the trainer's
`train.xent_chunk`: the loss taken N rows at a time with its gradients in the same pass, no
[B*S, V] logits). HF's is `transformers`' Qwen3-MoE (torch CPU, the
model loaded from our HF export) with torch's AdamW (same betas, eps, weight decay on matrices
only, global-norm clip 1.0) and its load-balancing loss at the same coefficient. The runs
interleave (every round times every system once) so that a shared machine's slow phases hit all
alike; the table has medians, ratios to HF, MFU against the fp32 matmul peak measured before and
after (the higher one), the dropped-assignment count, and the loss of the last step (every system
takes the same steps from the same weights on the same batch, so these agree closely; HF's
includes its 0.001 x load-balancing term, ours is the cross-entropy alone). Raw times go to
benchmarks/results/train_step.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "17179869184",
              "MALLOC_ARENA_MAX": "1"}
OPTIM = dict(lr=1e-4, warmup_steps=0, decay_steps=0, end_lr_ratio=0.1, b1=0.9, b2=0.95, eps=1e-8,
             weight_decay=0.1, grad_clip=1.0)


def our_runner(cfg, batch, seed=0, xent_chunk=0):
  """The trainer's step for `cfg` (with `xent_chunk` > 0, its chunked cross-entropy, as
  `train.xent_chunk` sets it); returns (run, last metrics getter, graphdef, params)."""
  import jax
  import ml_collections
  from lwm_jax import sharding as shd
  from lwm_jax.train import optimizer, state, steps
  tx, sch = optimizer.make_optimizer(ml_collections.ConfigDict(OPTIM), 1000)
  mesh = shd.make_mesh(data=-1)
  g, s, sh = state.create_train_state(cfg, tx, mesh, seed)
  params0 = jax.tree.map(lambda x: x.copy(), s.params)
  f = steps.compile_xent_step(g, tx, sch, steps.StepConfig(xent_chunk=xent_chunk), mesh, sh,
                              {k: v.shape for k, v in batch.items()})
  box = {"s": s, "m": None}

  def run():
    box["s"], box["m"] = f(box["s"], batch)
    jax.block_until_ready(box["m"]["loss"])
  run.compiled_text = lambda: f.lower(box["s"], batch).compile().as_text()  # for profile_step.py
  return run, lambda: box["m"], g, params0


def hf_runner(cfg, graphdef, params, tokens):
  """transformers' model on our weights with torch AdamW; returns (run, loss getter, versions)."""
  import numpy as np
  import torch
  import transformers
  from flax import nnx
  from lwm_jax.hf import save_pretrained
  folder = tempfile.mkdtemp()
  save_pretrained(nnx.merge(graphdef, params), folder)
  torch.manual_seed(0)
  hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
  hf.config.output_router_logits = True
  hf.config.router_aux_loss_coef = 0.001
  decay = [q for q in hf.parameters() if q.ndim >= 2]
  rest = [q for q in hf.parameters() if q.ndim < 2]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                           {"params": rest, "weight_decay": 0.0}], lr=OPTIM["lr"],
                          betas=(OPTIM["b1"], OPTIM["b2"]), eps=OPTIM["eps"])
  ids = torch.from_numpy(np.asarray(tokens, np.int64))
  box = {"loss": None}

  def run():
    opt.zero_grad(set_to_none=True)
    out = hf(input_ids=ids, labels=ids, output_router_logits=True)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(hf.parameters(), OPTIM["grad_clip"])
    opt.step()
    box["loss"] = float(out.loss.detach())
  return run, lambda: box["loss"], (transformers.__version__, torch.__version__)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=4)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--preset", default="small")
  ap.add_argument("--moe_backends", default="tiled,blocked")
  ap.add_argument("--xent_chunk", type=int, default=0,
                  help="also time the chunked cross-entropy variant with this many columns")
  ap.add_argument("--no_hf", action="store_true")
  ap.add_argument("--out", default="train_step")
  ap.add_argument("--no_malloc_env", action="store_true")
  a = ap.parse_args()
  if not a.no_malloc_env and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **MALLOC_ENV})
  import jax
  from common import matmul_peak_gflops, table, write_result
  from lwm_jax.model import sizes
  from lwm_jax.model.config import get_preset
  from lwm_jax.train import optimizer, synthetic
  peak_before = matmul_peak_gflops()
  base = optimizer.apply_precision(get_preset(a.preset, num_hidden_layers=a.layers), "auto")
  batch = synthetic.synthetic_batch(0, 0, a.batch, a.seq, base.vocab_size)
  batch["segment_ids"][:] = 1  # full rows
  batch["loss_weights"][:] = 1
  runners, metrics, first = {}, {}, None
  for backend in [b for b in a.moe_backends.split(",") if b]:
    run, get, g, p0 = our_runner(base.replace(moe_backend=backend), batch)
    runners[f"lwm_jax {backend}"], metrics[f"lwm_jax {backend}"] = run, get
    first = first or (backend, g, p0)
  if a.xent_chunk:
    backend = first[0]
    name = f"lwm_jax {backend} + chunked xent {a.xent_chunk}"
    runners[name], metrics[name], _, _ = our_runner(base.replace(moe_backend=backend), batch,
                                                    xent_chunk=a.xent_chunk)
  versions = None
  if not a.no_hf:
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    runners["HF transformers + torch AdamW"], metrics["HF transformers + torch AdamW"], versions = (
        hf_runner(base, first[1], first[2], batch["tokens"]))
  t0 = time.perf_counter()
  compile_s = {}
  for k, run in runners.items():  # warm-up: compiles ours
    t = time.perf_counter()
    run()
    compile_s[k] = time.perf_counter() - t
    print(f"warm-up {k}: {compile_s[k]:.1f} s", flush=True)
  times = {k: [] for k in runners}
  for r in range(a.rounds):
    for k, run in runners.items():
      t = time.perf_counter()
      run()
      times[k].append(time.perf_counter() - t)
      print(f"round {r} {k}: {times[k][-1]:.2f} s", flush=True)
  peak_after = matmul_peak_gflops()
  peak = max(peak_before, peak_after)
  counts = sizes.count(base)
  fpt = counts.train_flops_per_token(base, a.seq)
  n_tok = a.batch * a.seq
  med = {k: statistics.median(v) for k, v in times.items()}
  hf_key = next((k for k in med if k.startswith("HF")), None)
  rows = []
  for k, t in med.items():
    m = metrics[k]()
    dropped = int(m["dropped_tokens"]) if isinstance(m, dict) else 0
    loss = float(m["loss"]) if isinstance(m, dict) else float(m)
    rows.append({"system": k, "step s": f"{t:.3f}", "tokens/s": f"{n_tok / t:.0f}",
                 "last loss": f"{loss:.4f}",
                 "MFU %": f"{100 * n_tok / t * fpt / (peak * 1e9):.1f}", "dropped": dropped,
                 "vs HF": f"{med[hf_key] / t:.2f}x" if hf_key else "-"})
  print(f"preset={a.preset} layers={a.layers} batch={a.batch}x{a.seq} fp32, full step with AdamW, "
        f"{fpt / 1e6:.1f} MFLOP/token, matmul peak {peak_before:.0f} / {peak_after:.0f} GFLOP/s "
        f"(before / after), {a.rounds} interleaved rounds, {time.perf_counter() - t0:.0f} s")
  print(table(rows, ["system", "step s", "tokens/s", "MFU %", "dropped", "last loss", "vs HF"]))
  path = write_result(a.out, {
      "preset": a.preset, "layers": a.layers, "batch": a.batch, "seq": a.seq, "dtype": base.dtype,
      "backend": jax.default_backend(), "active_params": counts.active_params,
      "train_flops_per_token": fpt, "peak_gflops_before": peak_before,
      "peak_gflops_after": peak_after, "load_average": os.getloadavg(), "rows": rows,
      "median_step_s": med, "step_s_per_round": times, "first_call_s": compile_s,
      "transformers_torch": versions, "optimizer": OPTIM})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
