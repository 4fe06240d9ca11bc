"""Latency of the OpenAI server under concurrent requests, without and with the start-up warm-up.

  python benchmarks/server_latency.py --preset=tiny --clients=32 --rounds=2

A fresh server (a model of `--preset` with random weights, a SentencePiece tokenizer trained here)
gets `--rounds` rounds of `--clients` concurrent chat requests (prompts of varied lengths,
`--max_tokens` tokens each). Each request's latency is recorded and p50 / p90 / p99 reported per
round: once on a cold server (shapes compile while requests wait) and once on a server whose
engine ran `server.warmup` first (its duration reported), each in its own process (compilations
are cached per process). Results go to
benchmarks/results/server_latency.json (or `--out`). With an older lwm_jax on PYTHONPATH that has
no warm-up, only the cold server is measured.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time


WORDS = ("ls cat grep error file directory permission denied output line total bytes usr bin "
         "home root tmp var log config install package failed success").split()


def _pct(xs: list[float], q: float) -> float:
  xs = sorted(xs)
  return xs[min(len(xs) - 1, max(0, int(round(q / 100 * len(xs) + 0.5)) - 1))]


def serve(preset: str, tok, warm: bool, clients: int, max_tokens: int, prompt_len: int):
  import uvicorn
  from flax import nnx
  from lwm_jax.model.config import get_preset
  from lwm_jax.model.transformer import Transformer
  from lwm_jax.sampling import server as server_lib
  from lwm_jax.sampling.sampler import Sampler
  vocab = -(-tok.vocab_size // 64) * 64
  model = Transformer(get_preset(preset, vocab_size=vocab), rngs=nnx.Rngs(0))
  sampler = Sampler(model, tok, max_batch=clients)
  info = None
  if warm:
    info = server_lib.warmup(sampler, clients, prompt_len, [max_tokens])
  app = server_lib.create_app(sampler, "bench", max_batch=clients, window_ms=10,
                              default_max_tokens=max_tokens)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
  threading.Thread(target=srv.run, daemon=True).start()
  while not srv.started:
    time.sleep(0.05)
  return srv, f"http://127.0.0.1:{port}/v1", info


def measure(url: str, clients: int, rounds: int, max_tokens: int, prompt_words: list[int]):
  import openai
  client = openai.OpenAI(base_url=url, api_key="none", timeout=900, max_retries=0)

  def ask(i):
    words = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(prompt_words[i % len(
        prompt_words)]))
    t = time.perf_counter()
    client.chat.completions.create(model="bench", messages=[{"role": "user", "content": words}],
                                   temperature=0.6, seed=i, max_tokens=max_tokens,
                                   extra_body={"ignore_eos": True})
    return time.perf_counter() - t

  out = []
  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    for r in range(rounds):
      lat = list(pool.map(ask, range(r * clients, (r + 1) * clients)))
      out.append({"round": r + 1, "p50_s": statistics.median(lat), "p90_s": _pct(lat, 90),
                  "p99_s": _pct(lat, 99), "max_s": max(lat)})
      print(f"  round {r + 1}: p50 {out[-1]['p50_s']:.2f} s  p90 {out[-1]['p90_s']:.2f} s  "
            f"p99 {out[-1]['p99_s']:.2f} s", flush=True)
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--preset", default="tiny")
  ap.add_argument("--clients", type=int, default=32)
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--max_tokens", type=int, default=16)
  ap.add_argument("--prompt_words", default="2,6,12,20", help="prompt lengths (words), cycled")
  ap.add_argument("--modes", default="cold,warm")
  ap.add_argument("--label", default="")
  ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                "results", "server_latency.json"))
  a = ap.parse_args()
  modes = a.modes.split(",")
  if len(modes) > 1:  # each mode in a fresh process
    import subprocess  # pylint: disable=import-outside-toplevel
    results = None
    for mode in modes:
      argv = [x for x in sys.argv[1:] if not x.startswith("--modes")]
      proc = subprocess.run([sys.executable, os.path.abspath(__file__), f"--modes={mode}"] + argv,
                            stdout=subprocess.PIPE, text=True, check=True)
      lines = proc.stdout.strip().splitlines()
      print("\n".join(lines[:-1]), flush=True)
      one = json.loads(lines[-1])
      results = results or one
      results["modes"].update(one["modes"])
    with open(a.out, "w") as f:
      json.dump(results, f, indent=1)
    print(json.dumps(results))
    return
  from lwm_jax.data.tokenizer import load_tokenizer, train_sentencepiece
  from lwm_jax.sampling import server as server_lib
  texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12)) for i in range(400)]
  tok = load_tokenizer(train_sentencepiece(texts, 400, os.path.join(tempfile.mkdtemp(), "sp")))
  prompt_words = [int(x) for x in a.prompt_words.split(",")]
  longest = max(len(tok.encode_chat([{"role": "user", "content": " ".join(WORDS[:n])}], True))
                for n in prompt_words) + 8
  results = {"preset": a.preset, "clients": a.clients, "max_tokens": a.max_tokens,
             "label": a.label, "modes": {}}
  for mode in modes:
    if mode == "warm" and not hasattr(server_lib, "warmup"):
      print("this lwm_jax has no warm-up: skipping the warm server")
      continue
    print(f"{mode} server:", flush=True)
    srv, url, info = serve(a.preset, tok, mode == "warm", a.clients, a.max_tokens, longest)
    if info:
      print(f"  warm-up: {info['shapes']} shapes in {info['seconds']:.1f} s")
    results["modes"][mode] = {"warmup": info, "rounds": measure(url, a.clients, a.rounds,
                                                                a.max_tokens, prompt_words)}
    srv.should_exit = True
    time.sleep(1)
  os.makedirs(os.path.dirname(a.out), exist_ok=True)
  with open(a.out, "w") as f:
    json.dump(results, f, indent=1)
  print(json.dumps(results))


if __name__ == "__main__":
  main()
