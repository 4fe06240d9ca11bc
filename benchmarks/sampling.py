"""Decode throughput of our engine vs `transformers` generate, and the server's requests/s.

  python benchmarks/sampling.py                      # small preset, batch 1, 8 and 32, 16 + 128 tokens
  python benchmarks/sampling.py --repeats=1 --skip_server --dtypes=float32

Both models are the `small` preset with the same random weights (HF's built from ours with
`to_hf_dict` and the HF export), greedy, exactly `--new` new tokens after a `--prompt`-token prompt,
timed end to end (prefill included) after one warm-up run; tokens/s = batch * new / seconds
(median of --repeats). The runs interleave: every round times every system once, so that the
machine's slower and faster phases (it is shared) reach all of them alike. Each side runs at each of `--dtypes`: for us that is the decode copy's
weight dtype (`Engine(decode_dtype=...)`, float32 = exact), for HF the whole model's
(`model.to(dtype)`). The ratio compares each of ours with HF's fastest. The batch-1 memory floor is the bytes of weights
one step must read (every weight but the embedding table and the unchosen experts) over the read
bandwidth XLA reaches here (a jitted sum over 256 MB): the tokens/s no batch-1 decoder can beat
on this machine. Then the server (OpenAI
API, same model, a SentencePiece tokenizer trained here, decode dtype `--server_dtype`) answers
`--clients` concurrent chat requests of `--server_tokens` tokens each, `--server_rounds` times.
`--continuous` also times the continuous engine (as many slots as the largest batch, a cache as
long as the static engine's for these rows) in the same rounds. Writes
benchmarks/results/sampling.json (or `--out`).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time


MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "17179869184",
              "MALLOC_ARENA_MAX": "1"}


def our_runners(model, batches, prompt_len, new, chunk, dtypes, engine="static"):
  """{(dtype, batch): run} for our engine (static, or continuous with as many slots as the
  largest batch), one engine per decode dtype."""
  import numpy as np
  from lwm_jax.sampling.continuous import ContinuousEngine
  from lwm_jax.sampling.engine import Engine
  from lwm_jax.sampling.params import SamplingParams
  runners, layout = {}, None
  for dt in dtypes:
    kw = dict(chunk_steps=chunk, decode_dtype=None if dt == "float32" else dt)
    if engine == "continuous":  # the cache as long as the static engine's for these rows
      eng = ContinuousEngine(model, num_slots=max(batches), **kw,
                             cache_len=min(model.cfg.max_position_embeddings,
                                           1 << (prompt_len + new - 1).bit_length()))
    else:
      eng = Engine(model, **kw)
    layout = eng.decode_layout
    rng = np.random.default_rng(0)
    for b in batches:
      prompts = [rng.integers(0, model.cfg.vocab_size, prompt_len).tolist() for _ in range(b)]
      sp = [SamplingParams(temperature=0, max_new_tokens=new)] * b
      def run(eng=eng, prompts=prompts, sp=sp, b=b):
        res = eng.generate(prompts, sp, [[]] * b)
        assert all(len(r.token_ids) == new for r in res)
      runners[dt, b] = run
  return runners, layout


def hf_runners(model, batches, prompt_len, new, dtypes):
  """{(dtype, batch): run} for `transformers` generate on the same weights (loaded from our
  export), one HF model per dtype."""
  import torch
  import transformers
  from lwm_jax.hf import save_pretrained
  folder = tempfile.mkdtemp()
  save_pretrained(model, folder)
  torch.manual_seed(0)
  runners = {}
  for dt in dtypes:
    hmodel = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, dt)).eval()
    for b in batches:
      ids = torch.randint(0, model.cfg.vocab_size, (b, prompt_len))
      def run(hmodel=hmodel, ids=ids):
        with torch.no_grad():
          res = hmodel.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                min_new_tokens=new, do_sample=False, pad_token_id=0)
        assert res.shape[1] == prompt_len + new
      runners[dt, b] = run
  return runners, transformers.__version__, torch.__version__


def read_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
  """Bytes per second XLA reads here: the median time of a jitted sum over a `megabytes` fp32
  array (far larger than the caches), the way a decode step streams its weights."""
  import jax
  import jax.numpy as jnp
  from common import median_time
  x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  return x.nbytes / median_time(lambda: total(x).block_until_ready(), repeats)


def weight_bytes_per_token(model, itemsize: int) -> int:
  """Bytes of weights one batch-1 decode step must read: every parameter except the embedding
  table (one row of it) and the experts a token does not choose (k of E are read), the output
  head in full (the embedding itself when tied). Norms and routers are counted too."""
  import jax
  from flax import nnx
  cfg = model.cfg
  total = sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  d, e, k = cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok
  moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
  experts = moe_layers * e * 3 * d * cfg.moe_intermediate_size
  touched = total - (experts * (e - k) // e if e else 0)
  if not cfg.tie_word_embeddings:
    touched -= cfg.vocab_size * d - d
  return touched * itemsize


def interleaved(runners: dict, repeats: int) -> dict:
  """Median seconds per runner, each warmed up once and then timed once per round, all runners
  in every round: a slower or faster phase of a shared machine hits every system alike."""
  import statistics
  for run in runners.values():
    run()
  times = {k: [] for k in runners}
  for _ in range(repeats):
    for k, run in runners.items():
      t = time.perf_counter()
      run()
      times[k].append(time.perf_counter() - t)
  return {k: statistics.median(v) for k, v in times.items()}, times


def server(model, clients, rounds, tokens, dtype, chunk):
  import openai
  from lwm_jax.data.tokenizer import load_tokenizer, train_sentencepiece
  from lwm_jax.sampling.background import BackgroundServer
  from lwm_jax.sampling.sampler import Sampler
  from lwm_jax.sampling.server import create_app
  words = ("ls cat grep error file directory permission denied output line total bytes "
           "usr bin home root tmp var log config install package failed success").split()
  texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(400)]
  tmp = tempfile.mkdtemp()
  tok = load_tokenizer(train_sentencepiece(texts, 400, os.path.join(tmp, "sp")))
  # Every batch padded to `clients` rows: one compiled shape per prompt/cache bucket, so the
  # warm-up round compiles what the timed rounds run.
  sampler = Sampler(model, tok, max_batch=clients, min_batch_bucket=clients, chunk_steps=chunk,
                    decode_dtype=None if dtype == "float32" else dtype)
  app = create_app(sampler, "bench", max_batch=clients, window_ms=10)
  srv = BackgroundServer(app)
  client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", timeout=600)

  def ask(i):
    r = client.chat.completions.create(
        model="bench", messages=[{"role": "user", "content": f"ls /tmp/{i} | grep error"}],
        temperature=0.6, seed=i, max_tokens=tokens, extra_body={"ignore_eos": True})
    return r.usage.completion_tokens

  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    list(pool.map(ask, range(clients)))  # warm-up: compiles
    t = time.perf_counter()
    n_tok = sum(pool.map(ask, range(clients * rounds)))
    dt = time.perf_counter() - t
  srv.close()
  return {"clients": clients, "requests": clients * rounds, "max_tokens": tokens,
          "requests_per_s": clients * rounds / dt, "tokens_per_s": n_tok / dt}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--preset", default="small")
  ap.add_argument("--batches", default="1,8,32")
  ap.add_argument("--prompt", type=int, default=16)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--chunk", type=int, default=32, help="decode steps per jit call")
  ap.add_argument("--dtypes", default="float32,bfloat16",
                  help="decode weight dtypes to run on both sides")
  ap.add_argument("--clients", type=int, default=32)
  ap.add_argument("--server_rounds", type=int, default=2)
  ap.add_argument("--server_tokens", type=int, default=32)
  ap.add_argument("--server_dtype", default="bfloat16")
  ap.add_argument("--skip_hf", action="store_true")
  ap.add_argument("--skip_server", action="store_true")
  ap.add_argument("--continuous", action="store_true",
                  help="also time the continuous engine (sampling/continuous.py) beside the static")
  ap.add_argument("--out", default="sampling", help="result file name under benchmarks/results")
  ap.add_argument("--no_malloc_env", action="store_true")
  a = ap.parse_args()
  if not a.no_malloc_env and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **MALLOC_ENV})
  from flax import nnx
  if not a.skip_hf:
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
  from common import table, write_result
  from lwm_jax.model.config import get_preset
  from lwm_jax.model.transformer import Transformer
  model = Transformer(get_preset(a.preset), rngs=nnx.Rngs(0))
  batches = [int(x) for x in a.batches.split(",")]
  dtypes = [x for x in a.dtypes.split(",") if x]
  runners, layout = our_runners(model, batches, a.prompt, a.new, a.chunk, dtypes)
  runners = {("lwm_jax",) + k: v for k, v in runners.items()}
  if a.continuous:
    cont, _ = our_runners(model, batches, a.prompt, a.new, a.chunk, dtypes, "continuous")
    runners.update({("continuous",) + k: v for k, v in cont.items()})
  tv = pv = None
  if not a.skip_hf:
    hf_runs, tv, pv = hf_runners(model, batches, a.prompt, a.new, dtypes)
    runners.update({("hf",) + k: v for k, v in hf_runs.items()})
  secs, rounds = interleaved(runners, a.repeats)
  tps = {k: k[2] * a.new / v for k, v in secs.items()}
  mine = {dt: {b: tps["lwm_jax", dt, b] for b in batches} for dt in dtypes}
  theirs = {} if a.skip_hf else {dt: {b: tps["hf", dt, b] for b in batches} for dt in dtypes}
  best_hf = {b: max(theirs[dt][b] for dt in theirs) for b in batches} if theirs else {}
  rows = []
  for b in batches:
    for dt in dtypes:
      rows.append({"batch": b, "weights": dt, "lwm_jax tok/s": f"{mine[dt][b]:.1f}",
                   "HF tok/s": f"{theirs[dt][b]:.1f}" if theirs else "-",
                   "ours / HF's fastest": f"{mine[dt][b] / best_hf[b]:.2f}x" if theirs else "-"})
  cont = {}
  if a.continuous:
    cont = {dt: {b: tps["continuous", dt, b] for b in batches} for dt in dtypes}
    for r in rows:
      c = cont[r["weights"]][r["batch"]]
      r["continuous tok/s"] = f"{c:.1f}"
      r["continuous / static"] = f"{c / mine[r['weights']][r['batch']]:.2f}x"
  print(f"decode, preset {a.preset}, prompt {a.prompt} + {a.new} new tokens, greedy, "
        f"decode layout {layout}")
  print(table(rows, ["batch", "weights", "lwm_jax tok/s", "HF tok/s", "ours / HF's fastest"]
              + (["continuous tok/s", "continuous / static"] if a.continuous else [])))
  bw = read_bandwidth()
  floor = {}
  for dt in dtypes:
    nbytes = weight_bytes_per_token(model, 2 if dt == "bfloat16" else 4)
    floor[dt] = {"weight_bytes_per_token": nbytes, "floor_tokens_per_s": bw / nbytes}
    if 1 in batches:
      floor[dt]["batch1_over_floor"] = floor[dt]["floor_tokens_per_s"] / mine[dt][1]
    print(f"batch-1 memory floor ({dt} weights): {nbytes / 1e6:.1f} MB read per token at "
          f"{bw / 1e9:.1f} GB/s (XLA's read of a 256 MB array) = {bw / nbytes:.1f} tok/s"
          + (f"; ours is {floor[dt]['batch1_over_floor']:.2f}x below it" if 1 in batches else ""))
  srv = None if a.skip_server else server(model, a.clients, a.server_rounds, a.server_tokens,
                                          a.server_dtype, a.chunk)
  if srv:
    print(f"server ({a.server_dtype} decode weights): {srv['requests']} chat requests from "
          f"{srv['clients']} concurrent clients, {srv['max_tokens']} tokens each: "
          f"{srv['requests_per_s']:.2f} requests/s, {srv['tokens_per_s']:.1f} tokens/s")
  path = write_result(a.out, {
      "continuous_tokens_per_s": cont, "command": "python " + " ".join(sys.argv),
      "preset": a.preset, "prompt_tokens": a.prompt, "new_tokens": a.new, "repeats": a.repeats,
      "chunk_steps": a.chunk, "decode_layout": layout,
      "read_bandwidth_bytes_per_s": bw, "batch1_memory_floor": floor,
      "lwm_jax_tokens_per_s": mine, "hf_tokens_per_s": theirs,
      "ratio_to_hf_fastest": {dt: {b: mine[dt][b] / best_hf[b] for b in best_hf} for dt in mine},
      "seconds_per_round": {"/".join(map(str, k)): v for k, v in rounds.items()},
      "transformers": tv, "torch": pv, "server_dtype": a.server_dtype, "server": srv})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
