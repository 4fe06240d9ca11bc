"""The accelerator benchmark (run through benchmarks/accelerator.sh): bf16 train-step MFU of the
`moe_1b` preset (about 1B active parameters) with `ragged_dot` dispatch on the expert-parallel mesh,
and greedy decode tokens/s at batch 1, 8 and 64. docs/benchmark.md describes the figures.

  python benchmarks/accelerator.py [--preset moe_1b] [--batch 8] [--seq 2048] [--steps 5]
      [--decode_batches 1,8,64] [--allow_cpu]

On a machine whose JAX backend is the CPU it prints "no accelerator" and exits 0, unless
`--allow_cpu` (a smoke run of this script with a small preset). Writes
benchmarks/results/accelerator.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time



def train_mfu(cfg, batch_size: int, seq: int, steps: int) -> dict:
  """Median step time of the trainer's compiled step on an all-`expert` mesh, and its MFU."""
  import jax
  import ml_collections
  from lwm_jax import sharding as shd
  from lwm_jax.model import sizes
  from lwm_jax.train import metrics, optimizer, state, steps as steps_lib, synthetic
  oc = ml_collections.ConfigDict(dict(lr=1e-4, warmup_steps=0, decay_steps=0, end_lr_ratio=0.1,
                                      b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0))
  tx, sch = optimizer.make_optimizer(oc, 1000)
  mesh = shd.make_mesh(expert=-1)
  g, s, sh = state.create_train_state(cfg, tx, mesh, 0)
  batch = synthetic.synthetic_batch(0, 0, batch_size, seq, cfg.vocab_size)
  batch["segment_ids"][:] = 1
  batch["loss_weights"][:] = 1
  f = steps_lib.compile_xent_step(g, tx, sch, steps_lib.StepConfig(), mesh, sh,
                                  {k: v.shape for k, v in batch.items()})
  t0 = time.perf_counter()
  s, m = f(s, batch)
  jax.block_until_ready(m["loss"])
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    s, m = f(s, batch)
    jax.block_until_ready(m["loss"])
    times.append(time.perf_counter() - t0)
  peak, src = metrics.peak_flops_per_device()
  peak *= jax.device_count()
  med = statistics.median(times)
  counts = sizes.count(cfg)
  fpt = counts.train_flops_per_token(cfg, seq)
  tps = batch_size * seq / med
  return {"active_params": counts.active_params, "total_params": counts.total_params,
          "batch": batch_size, "seq": seq, "mesh": dict(mesh.shape), "compile_s": compile_s,
          "step_s": times, "step_s_median": med, "tokens_per_s": tps,
          "flops_per_token": fpt, "peak_flops": peak, "peak_source": src, "mfu": tps * fpt / peak,
          "loss": float(m["loss"]), "dropped_tokens": int(m["dropped_tokens"])}


def decode_speed(cfg, batches, prompt_len: int, new: int, repeats: int) -> dict:
  """Greedy decode tokens/s of the sampling engine (bf16 decode weights), prefill included."""
  import numpy as np
  from flax import nnx
  from lwm_jax.model.transformer import Transformer
  from lwm_jax.sampling.engine import Engine
  from lwm_jax.sampling.params import SamplingParams
  model = Transformer(cfg.replace(dtype="bfloat16", param_dtype="bfloat16"), rngs=nnx.Rngs(0))
  eng = Engine(model, chunk_steps=32, max_batch=max(batches), decode_dtype="bfloat16")
  rng = np.random.default_rng(0)
  out = {}
  for b in batches:
    prompts = [rng.integers(0, cfg.vocab_size, prompt_len).tolist() for _ in range(b)]
    sp = [SamplingParams(temperature=0, max_new_tokens=new)] * b
    eng.generate(prompts, sp, [[]] * b)  # compiles
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      res = eng.generate(prompts, sp, [[]] * b)
      times.append(time.perf_counter() - t0)
      assert all(len(r.token_ids) == new for r in res)
    out[b] = {"seconds": times, "tokens_per_s": b * new / statistics.median(times)}
  return {"prompt": prompt_len, "new": new, "decode_layout": eng.decode_layout, "batches": out}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--preset", default="moe_1b")
  ap.add_argument("--layers", type=int, default=0, help="override the preset's layer count")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=2048)
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--decode_batches", default="1,8,64")
  ap.add_argument("--prompt", type=int, default=64)
  ap.add_argument("--new", type=int, default=256)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--allow_cpu", action="store_true", help="run on CPU anyway (a smoke run)")
  ap.add_argument("--out", default="accelerator")
  a = ap.parse_args()
  import jax
  backend = jax.default_backend()
  if backend == "cpu" and not a.allow_cpu:
    print("no accelerator: JAX sees only the CPU; nothing measured")
    return 0
  from common import write_result
  from lwm_jax.model.config import get_preset
  over = {"num_hidden_layers": a.layers} if a.layers else {}
  cfg = get_preset(a.preset, moe_backend="ragged_dot", dtype="bfloat16", **over)
  devices = jax.devices()
  print(f"{len(devices)} x {devices[0].device_kind} ({backend}), preset {a.preset}")
  tr = train_mfu(cfg.replace(param_dtype="float32"), a.batch, a.seq, a.steps)
  print(f"train step bf16, ragged_dot, mesh {tr['mesh']}: {tr['active_params'] / 1e9:.2f}B active "
        f"of {tr['total_params'] / 1e9:.2f}B, {a.batch}x{a.seq} tokens, "
        f"{tr['step_s_median']:.3f} s/step, {tr['tokens_per_s']:.0f} tok/s, "
        f"MFU {100 * tr['mfu']:.1f}% of {tr['peak_flops'] / 1e12:.0f} TFLOP/s ({tr['peak_source']}), "
        f"compile {tr['compile_s']:.0f} s, dropped {tr['dropped_tokens']}")
  batches = [int(x) for x in a.decode_batches.split(",") if x]
  dec = decode_speed(cfg, batches, a.prompt, a.new, a.repeats)
  for b, r in dec["batches"].items():
    print(f"decode bf16 batch {b:>3}: {r['tokens_per_s']:.0f} tok/s "
          f"({a.prompt} + {a.new} tokens, layout {dec['decode_layout']})")
  path = write_result(a.out, {"backend": backend, "devices": len(devices),
                              "device_kind": devices[0].device_kind, "preset": a.preset,
                              "train": tr, "decode": dec})
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
