"""Start-up time of `launch/serve.py`: seconds from launching the process to /health answering 200
and to the first chat answer (its first streamed token and its end), with an empty compilation
cache (cold) and again with the cache the cold start filled (warm), on one checkpoint. The machine's load average is recorded beside the
figures (these machines are shared; compare cold and warm of one run).

  python benchmarks/server_start.py --checkpoint=data/world_model
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import requests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from lwm_jax.sampling.background import free_port


def start(checkpoint: str, cache: str, extra: list[str], limit: float) -> dict:
  port = free_port()
  t0 = time.monotonic()
  proc = subprocess.Popen([sys.executable, os.path.join(REPO, "launch", "serve.py"),
                           f"--checkpoint={checkpoint}", f"--port={port}",
                           f"--compilation_cache={cache}", *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
  out = {"load_avg_at_start": os.getloadavg()}
  try:
    base = f"http://127.0.0.1:{port}"
    while "health_s" not in out:
      if proc.poll() is not None:
        raise RuntimeError(proc.stdout.read()[-2000:])
      try:
        r = requests.get(base + "/health", timeout=5)
        if "listening_s" not in out:
          out["listening_s"] = time.monotonic() - t0
        if r.status_code == 200:
          out["health_s"] = time.monotonic() - t0
      except requests.ConnectionError:
        pass
      if time.monotonic() - t0 > limit:
        raise TimeoutError(f"no /health 200 within {limit} s")
      time.sleep(0.25)
    # streamed, so the first token's time is seen apart from the answer's length
    r = requests.post(base + "/v1/chat/completions", timeout=limit, stream=True, json={
        "messages": [{"role": "system", "content": "You simulate a Linux terminal."},
                     {"role": "user", "content": "ls -la /tmp"}],
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    r.raise_for_status()  # no max_tokens above: the server's default, as most clients send
    for line in r.iter_lines():
      if not line.startswith(b"data: ") or line == b"data: [DONE]":
        continue
      chunk = json.loads(line[6:])
      if chunk.get("usage"):
        out["completion_tokens"] = chunk["usage"]["completion_tokens"]
      if "first_token_s" not in out and any(c["delta"].get("content")
                                            for c in chunk.get("choices", [])):
        out["first_token_s"] = time.monotonic() - t0
    out["first_answer_s"] = time.monotonic() - t0
    out["load_avg_at_end"] = os.getloadavg()
  finally:
    proc.terminate()
    try:
      proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      proc.kill()
  return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--checkpoint", default=os.path.join(REPO, "data", "world_model"))
  ap.add_argument("--limit_s", type=float, default=900)
  ap.add_argument("--extra", default="", help="more serve.py flags, space separated")
  ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results",
                                                "server_start.json"))
  a = ap.parse_args()
  extra = a.extra.split()
  with tempfile.TemporaryDirectory() as cache:
    cold = start(a.checkpoint, cache, extra, a.limit_s)
    print("cold", cold, flush=True)
    warm = start(a.checkpoint, cache, extra, a.limit_s)
    print("warm", warm, flush=True)
  res = {"checkpoint": os.path.relpath(a.checkpoint, REPO), "serve_flags": extra,
         "cpus": os.cpu_count(), "cold": cold, "warm": warm,
         "note": "seconds from process launch; health_s = /health 200 (ready), first_answer_s = "
                 "a greedy chat answer with the default max_tokens (streamed: first_token_s its first token, "
                 "completion_tokens its length); load averages show how busy the shared machine was"}
  with open(a.out, "w") as f:
    json.dump(res, f, indent=1)
  print(json.dumps(res, indent=1))


if __name__ == "__main__":
  main()
