"""Training throughput and MFU of the `small` preset on this machine (the CPU benchmark shape,
docs/benchmark.md).

  python benchmarks/train_step.py [--steps 6] [--batch 8] [--seq 256] [--layers 8]

FLOPs per token come from lwm_jax/model/sizes.py (the trainer's MFU uses the same formula); the
peak is a measured fp32 matmul on CPU (a vendor table on GPU/TPU). Prints a table; writes
benchmarks/results/train_step.json.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import ml_collections  # noqa: E402

from lwm_jax import sharding as shd  # noqa: E402
from lwm_jax.model import sizes  # noqa: E402
from lwm_jax.model.config import get_preset  # noqa: E402
from lwm_jax.train import metrics, optimizer, state, steps, synthetic  # noqa: E402


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=6)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--preset", default="small")
  ap.add_argument("--moe_backend", default="auto")
  args = ap.parse_args()
  cfg = get_preset(args.preset, num_hidden_layers=args.layers, moe_backend=args.moe_backend)
  cfg = optimizer.apply_precision(cfg, "auto")
  oc = ml_collections.ConfigDict(dict(lr=1e-4, warmup_steps=0, decay_steps=0, end_lr_ratio=0.1,
                                      b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0))
  tx, sch = optimizer.make_optimizer(oc, 1000)
  mesh = shd.make_mesh(data=-1)
  g, s, sh = state.create_train_state(cfg, tx, mesh, 0)
  batch = synthetic.synthetic_batch(0, 0, args.batch, args.seq, cfg.vocab_size)
  batch["segment_ids"][:] = 1  # full rows, as the recorded figures assume
  batch["loss_weights"][:] = 1
  f = steps.compile_xent_step(g, tx, sch, steps.StepConfig(), mesh, sh,
                              {k: v.shape for k, v in batch.items()})
  t0 = time.perf_counter()
  s, m = f(s, batch)
  jax.block_until_ready(m["loss"])
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    s, m = f(s, batch)
    jax.block_until_ready(m["loss"])
    times.append(time.perf_counter() - t0)
  peak, src = metrics.peak_flops_per_device()
  peak *= jax.device_count()
  med = statistics.median(times)
  tps = args.batch * args.seq / med
  counts = sizes.count(cfg)
  fpt = counts.train_flops_per_token(cfg, args.seq)
  res = dict(preset=args.preset, layers=args.layers, batch=args.batch, seq=args.seq,
             dtype=cfg.dtype, moe_backend=cfg.moe_backend, backend=jax.default_backend(),
             devices=jax.device_count(), active_params=counts.active_params,
             flops_per_token=fpt, compile_s=compile_s, step_s_median=med, tokens_per_s=tps,
             peak_flops=peak, peak_source=src, mfu=tps * fpt / peak,
             malloc_env={k: os.environ.get(k) for k in ("MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX")})
  print(f"{'preset':<8}{'B x S':>10}{'step s':>9}{'tok/s':>9}{'MFLOP/tok':>11}{'peak GF/s':>11}"
        f"{'MFU':>7}")
  print(f"{args.preset:<8}{f'{args.batch}x{args.seq}':>10}{med:>9.3f}{tps:>9.0f}{fpt / 1e6:>11.1f}"
        f"{peak / 1e9:>11.0f}{100 * tps * fpt / peak:>6.1f}%")
  out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "train_step.json")
  with open(out, "w") as fh:
    json.dump(res, fh, indent=2)
  print("wrote", out)


if __name__ == "__main__":
  main()
