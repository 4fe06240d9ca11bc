"""Decode throughput of our engine vs `transformers` generate, and the server's requests/s.

  python benchmarks/sampling.py                      # small preset, batch 1 and 8, 16 + 128 tokens
  python benchmarks/sampling.py --repeats=1 --clients=32 --decode_moe_backend=""

Both models are the `small` preset with random weights (HF's built from `to_hf_dict`), greedy,
exactly `--new` new tokens after a `--prompt`-token prompt, timed end to end (prefill included)
after one warm-up run; tokens/s = batch * new / seconds (median of --repeats). Then the server
(OpenAI API, same model, a SentencePiece tokenizer trained here) answers `--clients` concurrent
chat requests of `--server_tokens` tokens each, `--server_rounds` times; requests/s is over all.
Writes benchmarks/results/sampling.json.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "17179869184",
              "MALLOC_ARENA_MAX": "1"}


def ours(cfg, batches, prompt_len, new, repeats, backend, chunk):
  import numpy as np
  from flax import nnx
  from benchmarks.common import median_time
  from lwm_jax.model.transformer import Transformer
  from lwm_jax.sampling.engine import Engine
  from lwm_jax.sampling.params import SamplingParams
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  eng = Engine(model, chunk_steps=chunk, decode_moe_backend=backend)
  rng = np.random.default_rng(0)
  out = {}
  for b in batches:
    prompts = [rng.integers(0, cfg.vocab_size, prompt_len).tolist() for _ in range(b)]
    sp = [SamplingParams(temperature=0, max_new_tokens=new)] * b
    def run():
      res = eng.generate(prompts, sp, [[]] * b)
      assert all(len(r.token_ids) == new for r in res)
    out[b] = b * new / median_time(run, repeats, warmup=1)
  return model, out, eng.decode_moe_backend


def hf(cfg, batches, prompt_len, new, repeats):
  import torch
  import transformers
  from benchmarks.common import median_time
  from lwm_jax.model.config import to_hf_dict
  torch.manual_seed(0)
  hcfg = transformers.Qwen3MoeConfig(**{k: v for k, v in to_hf_dict(cfg).items()
                                        if k not in ("architectures", "torch_dtype")})
  model = transformers.Qwen3MoeForCausalLM(hcfg).eval()
  out = {}
  for b in batches:
    ids = torch.randint(0, cfg.vocab_size, (b, prompt_len))
    def run():
      with torch.no_grad():
        res = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, pad_token_id=0)
      assert res.shape[1] == prompt_len + new
    out[b] = b * new / median_time(run, repeats, warmup=1)
  return out, transformers.__version__, torch.__version__


def server(model, clients, rounds, tokens, backend, chunk):
  import openai
  import uvicorn
  from lwm_jax.data.tokenizer import load_tokenizer, train_sentencepiece
  from lwm_jax.sampling.sampler import Sampler
  from lwm_jax.sampling.server import create_app
  words = ("ls cat grep error file directory permission denied output line total bytes "
           "usr bin home root tmp var log config install package failed success").split()
  texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(400)]
  tmp = tempfile.mkdtemp()
  tok = load_tokenizer(train_sentencepiece(texts, 400, os.path.join(tmp, "sp")))
  sampler = Sampler(model, tok, max_batch=clients, chunk_steps=chunk,
                    decode_moe_backend=backend)
  app = create_app(sampler, "bench", max_batch=clients, window_ms=10)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
  threading.Thread(target=srv.run, daemon=True).start()
  while not srv.started:
    time.sleep(0.05)
  client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600)

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
  srv.should_exit = True
  return {"clients": clients, "requests": clients * rounds, "max_tokens": tokens,
          "requests_per_s": clients * rounds / dt, "tokens_per_s": n_tok / dt}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--preset", default="small")
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--prompt", type=int, default=16)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--chunk", type=int, default=32, help="decode steps per jit call")
  ap.add_argument("--decode_moe_backend", default="auto",
                  help="MoE backend for decode steps ('' = the model's own)")
  ap.add_argument("--clients", type=int, default=32)
  ap.add_argument("--server_rounds", type=int, default=2)
  ap.add_argument("--server_tokens", type=int, default=32)
  ap.add_argument("--skip_hf", action="store_true")
  ap.add_argument("--skip_server", action="store_true")
  ap.add_argument("--no_malloc_env", action="store_true")
  a = ap.parse_args()
  if not a.no_malloc_env and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **MALLOC_ENV})
  import torch
  torch.set_num_threads(os.cpu_count() or 1)
  from benchmarks.common import table, write_result
  from lwm_jax.model.config import get_preset
  cfg = get_preset(a.preset)
  batches = [int(x) for x in a.batches.split(",")]
  backend = a.decode_moe_backend or None
  # HF first, before JAX starts its thread pools in this process.
  theirs, tv, pv = ({}, None, None) if a.skip_hf else hf(cfg, batches, a.prompt, a.new, a.repeats)
  model, mine, used = ours(cfg, batches, a.prompt, a.new, a.repeats, backend, a.chunk)
  rows = [{"batch": b, "lwm_jax tok/s": f"{mine[b]:.1f}",
           "HF tok/s": f"{theirs[b]:.1f}" if b in theirs else "-",
           "ratio": f"{mine[b] / theirs[b]:.2f}x" if b in theirs else "-"} for b in batches]
  print(f"decode, preset {a.preset}, prompt {a.prompt} + {a.new} new tokens, greedy, "
        f"decode MoE backend {used}")
  print(table(rows, ["batch", "lwm_jax tok/s", "HF tok/s", "ratio"]))
  srv = None if a.skip_server else server(model, a.clients, a.server_rounds, a.server_tokens,
                                          backend, a.chunk)
  if srv:
    print(f"server: {srv['requests']} chat requests from {srv['clients']} concurrent clients, "
          f"{srv['max_tokens']} tokens each: {srv['requests_per_s']:.2f} requests/s, "
          f"{srv['tokens_per_s']:.1f} tokens/s")
  path = write_result("sampling", {
      "preset": a.preset, "prompt_tokens": a.prompt, "new_tokens": a.new, "repeats": a.repeats,
      "chunk_steps": a.chunk, "decode_moe_backend": used,
      "lwm_jax_tokens_per_s": mine, "hf_tokens_per_s": theirs,
      "ratio": {b: mine[b] / theirs[b] for b in theirs}, "transformers": tv, "torch": pv,
      "server": srv})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
