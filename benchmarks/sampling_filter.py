"""Cost of top-k / top-p / min-p filtering per decode step: the whole-row sort (the reference)
against the bisection over float bit patterns that the sampler uses
(`lwm_jax.sampling.logits._filter_logits`).

  python benchmarks/sampling_filter.py [--vocab 151936] [--batches 1,8,32] [--repeats 20]

Random logits of Qwen's vocabulary size; each setting is a Qwen-style request (top_k 20, top_p
0.95), top-p alone (0.9) and min-p alone (0.05). Times are medians of `--repeats` calls of the
jitted filter after a warm-up, interleaved; writes benchmarks/results/sampling_filter.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


SETTINGS = {"top_k=20,top_p=0.95": (20, 0.95, 0.0), "top_p=0.9": (0, 0.9, 0.0),
            "min_p=0.05": (0, 1.0, 0.05)}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--vocab", type=int, default=151936)
  ap.add_argument("--batches", default="1,8,32")
  ap.add_argument("--repeats", type=int, default=20)
  args = ap.parse_args()
  import jax
  import jax.numpy as jnp
  import numpy as np
  from lwm_jax.sampling import logits as L
  f = jax.jit(L._filter_logits, static_argnames="method")  # pylint: disable=protected-access
  rows = []
  for b in [int(x) for x in args.batches.split(",")]:
    # a peaked, language-model-like row: a few likely tokens over a long tail
    x = jnp.asarray(np.random.default_rng(0).standard_t(3, (b, args.vocab)).astype(np.float32) * 2)
    for name, (k, p, m) in SETTINGS.items():
      a = (x, jnp.full((b,), k, jnp.int32), jnp.full((b,), p, jnp.float32),
           jnp.full((b,), m, jnp.float32))
      runs = {"sort": lambda: f(*a, method="sort").block_until_ready(),
              "bisect": lambda: f(*a, method="bisect").block_until_ready()}
      same = bool(np.array_equal(np.asarray(runs["sort"]()), np.asarray(runs["bisect"]())))
      times = {n: [] for n in runs}
      for _ in range(args.repeats):
        for n, run in runs.items():
          t0 = time.perf_counter()
          run()
          times[n].append(time.perf_counter() - t0)
      med = {n: statistics.median(t) * 1e3 for n, t in times.items()}
      rows.append({"batch": b, "setting": name, "sort_ms": round(med["sort"], 3),
                   "bisect_ms": round(med["bisect"], 3),
                   "speedup": round(med["sort"] / med["bisect"], 1),
                   "same_result": same, "raw_ms": {n: [round(t * 1e3, 3) for t in v]
                                                    for n, v in times.items()}})
      print(f"batch {b:3d} {name:22s} sort {med['sort']:9.2f} ms  bisect {med['bisect']:8.2f} ms  "
            f"x{med['sort'] / med['bisect']:.1f}  same {same}", flush=True)
  out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sampling_filter.json")
  with open(out, "w") as fh:
    json.dump({"vocab": args.vocab, "method": "bisect", "rows": rows}, fh, indent=1)
  print("wrote", out)


if __name__ == "__main__":
  main()
