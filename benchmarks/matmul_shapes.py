"""The single products behind a `small` decode step and a train step, in XLA and in torch.

  python benchmarks/matmul_shapes.py [--repeats 20] [--out matmul_shapes]

Decoding multiplies a few rows by each weight matrix (the output head [32000, 512], all experts'
gate/up rows [8192, 512], their down columns [512, 4096]); training multiplies tiles of 128 rows
and whole [2048, 512] activations. For each shape and row count this times, on this machine:
XLA (jitted `x @ w.T` for a weight stored [out, in], contracted along its contiguous dim as in
`layers.rows_matmul`, without that helper's two-row padding of one bf16 row) in fp32 and bf16, and, when torch is installed, torch's `x @ w.T` in fp32 and bf16 (what HF's generate
runs). The table gives GFLOP/s and the weight's read rate in GB/s, so a reader can tell whether a
product is bound by its bytes or by arithmetic, and which precision has hardware support here
(e.g. AVX512-BF16 doubles bf16 products for torch). Medians of --repeats; each timed call runs
ten products of the same weight with different rows, so that dispatch does not dominate; a weight
that fits in the cache (the 8 and 16 MB expert matrices) is then read faster than in a decode
step, which streams about 280 MB of weights once. Writes benchmarks/results/<out>.json.
"""
from __future__ import annotations

import argparse
import os


# (weight [out, in], rows): decode shapes at batch 1, 8, 32, then training shapes
SHAPES = [((32000, 512), 1), ((32000, 512), 8), ((32000, 512), 32),
          ((8192, 512), 1), ((8192, 512), 8), ((8192, 512), 32),
          ((512, 4096), 1), ((512, 4096), 8), ((512, 4096), 32),
          ((256, 512), 128), ((512, 256), 128), ((512, 512), 2048), ((32000, 512), 512)]
INNER = 10  # products per timed call


def xla_timer(out_in, rows, dtype_name):
  import jax
  import jax.numpy as jnp
  dt = getattr(jnp, dtype_name)
  w = jax.random.normal(jax.random.key(0), out_in, jnp.float32).astype(dt)
  # INNER different row blocks, so that XLA cannot fold the products into one
  x = jax.random.normal(jax.random.key(1), (INNER, rows, out_in[1]), jnp.float32).astype(dt)
  f = jax.jit(lambda x, w: sum(jax.lax.dot_general(
      x[i], w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
      for i in range(INNER)))
  return lambda: f(x, w).block_until_ready()


def torch_timer(out_in, rows, dtype_name):
  import torch
  dt = getattr(torch, dtype_name)
  w = torch.randn(*out_in).to(dt)
  x = torch.randn(INNER, rows, out_in[1]).to(dt)

  def run():
    with torch.no_grad():
      for i in range(INNER):
        x[i] @ w.T
  return run


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeats", type=int, default=20)
  ap.add_argument("--out", default="matmul_shapes")
  a = ap.parse_args()
  from common import median_time, table, write_result
  systems = [("xla", xla_timer)]
  try:
    import torch
    torch.set_num_threads(os.cpu_count())
    systems.append(("torch", torch_timer))
  except ImportError:
    print("torch is not installed: XLA only")
  rows = []
  for out_in, n in SHAPES:
    row = {"weight [out, in]": f"{out_in[0]}x{out_in[1]}", "rows": n}
    for name, make in systems:
      for dt in ("float32", "bfloat16"):
        s = median_time(make(out_in, n, dt), a.repeats) / INNER
        flops = 2 * out_in[0] * out_in[1] * n
        nbytes = out_in[0] * out_in[1] * (4 if dt == "float32" else 2)
        row[f"{name} {dt[:4]} GFLOP/s"] = round(flops / s / 1e9, 1)
        row[f"{name} {dt[:4]} GB/s"] = round(nbytes / s / 1e9, 1)
    rows.append(row)
    print(row, flush=True)
  cols = list(rows[0])
  print(table(rows, cols))
  print(f"wrote {write_result(a.out, {'rows': rows, 'inner_products_per_call': INNER})}")


if __name__ == "__main__":
  main()
