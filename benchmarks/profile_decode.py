"""Where the time of decoding goes on CPU: XLA's per-op trace of the engine's decode steps.

  python benchmarks/profile_decode.py [--preset small] [--batch 32] [--prompt 16] [--new 128]
      [--chunk 32] [--dtype float32] [--top 25] [--out profile_decode_b32]

The engine (`lwm_jax.sampling.engine.Engine`, decode layout and MoE backend as `auto` picks
them) generates `--new` greedy tokens for `--batch` random prompts of the `--preset` model with
random weights, as `benchmarks/sampling.py` times it; one warm-up, one untraced and `--runs` traced
generations. The per-op events are summed per op and divided by the decode steps (`--new`), so
the table reads as time per decode step (prefill, 16 tokens, is a small part of it; its ops that
share a name with a decode op are counted with that op). Op descriptions (output shape, the ops
a fusion holds) come from the compiled decode module, dumped by XLA to a temporary folder.
Writes benchmarks/results/<out>.json.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time


from profile_step import TRACE_FLAG, describe, summarize, trace_ops


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--preset", default="small")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--prompt", type=int, default=16)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--chunk", type=int, default=32, help="decode steps per jit call")
  ap.add_argument("--dtype", default="float32", help="the decode copy's weight dtype")
  ap.add_argument("--runs", type=int, default=2)
  ap.add_argument("--top", type=int, default=25)
  ap.add_argument("--out", default="")
  a = ap.parse_args()
  dump = tempfile.mkdtemp(prefix="xla_dump_")
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), TRACE_FLAG,
                                      f"--xla_dump_to={dump}", "--xla_dump_hlo_as_text"]).strip()
  import numpy as np
  from flax import nnx
  from common import write_result
  from lwm_jax.model.config import get_preset
  from lwm_jax.model.transformer import Transformer
  from lwm_jax.sampling.engine import Engine
  from lwm_jax.sampling.params import SamplingParams
  model = Transformer(get_preset(a.preset), rngs=nnx.Rngs(0))
  eng = Engine(model, chunk_steps=a.chunk, decode_dtype=None if a.dtype == "float32" else a.dtype)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, model.cfg.vocab_size, a.prompt).tolist() for _ in range(a.batch)]
  sp = [SamplingParams(temperature=0, max_new_tokens=a.new)] * a.batch

  def run():
    res = eng.generate(prompts, sp, [[]] * a.batch)
    assert all(len(r.token_ids) == a.new for r in res)
  run()  # warm-up (compiles)
  t0 = time.perf_counter()
  run()
  untraced = time.perf_counter() - t0
  per_op, traced = trace_ops(run, a.runs)
  texts = sorted(glob.glob(os.path.join(dump, "*_decode*after_optimizations.txt")))
  if not texts:
    sys.exit(f"error: XLA dumped no decode module to {dump}")
  hlo = open(max(texts, key=os.path.getsize)).read()
  what = {name: describe(hlo, name) for name in per_op}
  steps = a.runs * a.new
  summary = summarize(per_op, what, steps, a.top)
  print(f"{a.preset} decode, batch {a.batch}, {a.prompt} + {a.new} tokens, {a.dtype}, layout "
        f"{eng.decode_layout}: {a.batch * a.new / untraced:.1f} tok/s untraced "
        f"({1e3 * untraced / a.new:.2f} ms per step), {1e3 * traced / a.new:.2f} ms per step "
        f"traced; per-op events sum to {summary.total / steps:.2f} ms per step")
  summary.print_tables()
  write_result(a.out or f"profile_decode_b{a.batch}", {
      "preset": a.preset, "batch": a.batch, "prompt": a.prompt, "new": a.new, "dtype": a.dtype,
      "decode_layout": eng.decode_layout, "tokens_per_s_untraced": a.batch * a.new / untraced,
      "ms_per_step_untraced": 1e3 * untraced / a.new, "ms_per_step_traced": 1e3 * traced / a.new,
      **summary.results()})


if __name__ == "__main__":
  main()
