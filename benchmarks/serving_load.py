"""The OpenAI server under open-loop load, static engine vs continuous engine, and the prefill cost of
a G = 8 rollout with and without shared prefixes.

  python benchmarks/serving_load.py                       # both parts, both engines
  python benchmarks/serving_load.py --clients=8,32 --requests=32 --max_reply=128

Load: for each engine a real server (`launch/serve.py --checkpoint=data/world_model`, one
subprocess, loopback) gets, at each client count C, a bounded stream of streamed chat requests:
C clients each send requests as a Poisson process (mean gap `--think_s` seconds), open loop (a
request is sent at its arrival time whatever is still running), at most `--requests` per level.
Each request is an AgentWorldBench record of the bundled benchmark (`evals/mini_bench`, rendered as
its chat messages; records whose prompt plus reply do not fit the model's context are left out
and counted), asking for as many tokens as the record's real reply has (cut at `--max_reply`),
greedy, `ignore_eos` so that the reply has that length. Measured per level: generated tokens per
second (all tokens over the span from the first arrival to the last answer), end-to-end latency
and time to the first token (the first streamed text), p50 and p99. Both engines get the same
requests at the same times. Before the measured levels each server answers one unmeasured level
(the compilations it triggers are then cached for the measured ones; a shape first met later
compiles while requests wait, as it would in service).

Rollout: a GSPO group is G replies to one prompt. `--rollout_prompts` records' prompts, each as G
rows, through the continuous engine in this process, once with `share_prefixes` (one prefill per
prompt, forked into G slots) and once without (G prefills per prompt); prefill seconds and the
whole rollout's seconds for each, after an unmeasured pass over the same prompts on an engine of
its own (it compiles every shape they need; the measured engine's prefix cache starts empty) and
an unmeasured group of another prompt.

Writes benchmarks/results/serving_load.json: {"rows": [{"engine", "clients", "tokens_per_s",
"p50_s", "p99_s", "ttft_p50_s", "ttft_p99_s", ...}], "prefix_prefill_speedup", "rollout", the
command, the machine's load average before and after, the commit and the date}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from common import table, write_result  # benchmarks/common.py, beside this script


def _pct(xs, q):
  return float(np.percentile(np.asarray(xs, float), q)) if xs else float("nan")


def workload(checkpoint: str, bench: str, max_reply: int):
  """[(messages, prompt tokens, reply tokens)] of the records that fit the context; skipped."""
  from lwm_jax.data.tokenizer import load_tokenizer
  from lwm_jax.eval import records
  from lwm_jax.sampling.chat_template import chatml_ids
  tok = load_tokenizer(checkpoint)
  context = json.load(open(os.path.join(checkpoint, "config.json")))["max_position_embeddings"]
  out, skipped = [], 0
  for rec in records.load_bench(bench):
    msgs = records.chat_messages(rec)
    p = len(chatml_ids(tok, msgs, None, True, False))
    r = len(tok.encode(records.ground_truth(rec) or ""))
    if p + r > context:
      skipped += 1
      continue
    out.append((msgs, p, max(1, min(r, max_reply))))
  return out, skipped


def schedule(items, clients: int, n: int, think_s: float, seed: int):
  """n (arrival second, item) pairs. `clients` independent Poisson clients (mean gap `think_s`)
  merge into one Poisson process of rate clients / think_s."""
  rng = random.Random(seed)
  t, out = 0.0, []
  for _ in range(n):
    t += rng.expovariate(clients / think_s)
    out.append((t, rng.choice(items)))
  return out


def start_server(engine: str, args, port: int):
  cmd = [sys.executable, os.path.join(ROOT, "launch", "serve.py"), f"--checkpoint={args.checkpoint}",
         f"--port={port}", "--model_name=bench", f"--engine={engine}", f"--max_batch={args.slots}", "--nowarmup",
         f"--max_tokens={args.max_reply}", f"--chunk_steps={args.chunk_steps}",
         f"--compilation_cache={args.compilation_cache}"]
  log = open(os.path.join(args.log_dir, f"serving_load_{engine}.log"), "w")  # never a full pipe
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  proc.log_path = log.name
  import httpx
  deadline = time.time() + 600
  while time.time() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"server ({engine}) exited: {open(log.name).read()[-3000:]}")
    try:
      if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
        return proc
    except httpx.HTTPError:
      pass
    time.sleep(0.5)
  proc.kill()
  raise RuntimeError(f"server ({engine}) did not come up")


async def run_level(url: str, plan) -> dict:
  import httpx
  results = []

  async def one(client, at, item, t0):
    msgs, _, reply = item
    await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
    sent = time.monotonic()
    first, tokens = None, 0
    body = {"model": "bench", "messages": msgs, "max_tokens": reply, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", url, json=body) as r:
      if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]}")
      async for line in r.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
          continue
        d = json.loads(line[6:])
        if "error" in d:
          raise RuntimeError(d["error"])
        if d.get("usage"):
          tokens = d["usage"]["completion_tokens"]
        for c in d.get("choices", []):
          delta = c.get("delta") or {}
          if first is None and (delta.get("content") or delta.get("reasoning_content")):
            first = time.monotonic()
    end = time.monotonic()
    results.append({"sent": sent, "end": end, "e2e": end - sent,
                    "ttft": (first or end) - sent, "tokens": tokens})

  limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
  async with httpx.AsyncClient(timeout=3600, limits=limits) as client:
    t0 = time.monotonic()
    await asyncio.gather(*(one(client, at, item, t0) for at, item in plan))
  span = max(r["end"] for r in results) - min(r["sent"] for r in results)
  toks = sum(r["tokens"] for r in results)
  e2e, ttft = [r["e2e"] for r in results], [r["ttft"] for r in results]
  return {"requests": len(results), "tokens": toks, "span_s": round(span, 2),
          "tokens_per_s": round(toks / span, 1), "p50_s": round(_pct(e2e, 50), 3),
          "p99_s": round(_pct(e2e, 99), 3), "ttft_p50_s": round(_pct(ttft, 50), 3),
          "ttft_p99_s": round(_pct(ttft, 99), 3)}


def load_part(args, items) -> list[dict]:
  from lwm_jax.sampling.background import free_port
  rows = []
  levels = [int(c) for c in args.clients.split(",")]
  plans = {c: schedule(items, c, min(args.requests, max(2 * c, 8)), args.think_s, args.seed + c)
           for c in levels}
  warm = schedule(items, 32, args.warm_requests, args.think_s, args.seed - 1)
  for engine in args.engines.split(","):
    port = free_port()
    t = time.time()
    proc = start_server(engine, args, port)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
      print(f"[{engine}] up after {time.time() - t:.1f} s; warm-up level ({len(warm)} requests)",
            flush=True)
      t = time.time()
      asyncio.run(run_level(url, warm))
      print(f"[{engine}] warm-up level took {time.time() - t:.1f} s", flush=True)
      for c in levels:
        res = asyncio.run(run_level(url, plans[c]))
        row = {"engine": engine, "clients": c, **res}
        print(json.dumps(row), flush=True)
        rows.append(row)
    finally:
      proc.terminate()
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
  return rows


def rollout_part(args, items) -> dict:
  from lwm_jax.sampling.continuous import ContinuousEngine
  from lwm_jax.sampling.params import SamplingParams
  from lwm_jax.sampling.sampler import Sampler
  g = args.group
  sampler = Sampler.from_checkpoint(args.checkpoint, engine="static")  # loads model + tokenizer
  rng = random.Random(args.seed)
  picks = rng.sample(items, args.rollout_prompts + 1)
  prompts = [sampler.encode_prompt(m) for m, _, _ in picks]
  sp = SamplingParams(temperature=1.0, max_new_tokens=args.rollout_tokens, ignore_eos=True,
                      seed=args.seed)
  out = {}
  for share in (False, True):
    def engine():
      return ContinuousEngine(sampler.model, num_slots=g, share_prefixes=share,
                              chunk_steps=args.chunk_steps)
    # compiles every shape the measured groups use (prefill shapes depend on the prompts'
    # lengths), on an engine of its own so that the measured one starts with an empty prefix
    # cache: engines of one model share their compiled code
    warm = engine()
    for p in prompts:
      warm.generate([p] * g, [sp] * g, [[]] * g, choices=list(range(g)))
    del warm
    eng = engine()
    eng.generate([prompts[0]] * g, [sp] * g, [[]] * g, choices=list(range(g)))
    eng.prefill_seconds, eng.prefill_tokens = 0.0, 0
    t = time.perf_counter()
    for p in prompts[1:]:
      eng.generate([p] * g, [sp] * g, [[]] * g, choices=list(range(g)))
    total = time.perf_counter() - t
    out["shared" if share else "separate"] = {
        "prefill_s": round(eng.prefill_seconds, 3), "prefill_tokens": eng.prefill_tokens,
        "rollout_s": round(total, 3)}
    print(f"[rollout] share_prefixes={share}: {out['shared' if share else 'separate']}",
          flush=True)
  out.update(group=g, prompts=args.rollout_prompts,
             prompt_tokens=[len(p) for p in prompts[1:]], reply_tokens=args.rollout_tokens,
             prefill_speedup=round(out["separate"]["prefill_s"] / out["shared"]["prefill_s"], 2),
             rollout_speedup=round(out["separate"]["rollout_s"] / out["shared"]["rollout_s"], 2))
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--checkpoint", default=os.path.join(ROOT, "data", "world_model"))
  ap.add_argument("--bench", default=os.path.join(ROOT, "evals", "mini_bench"))
  ap.add_argument("--engines", default="static,continuous")
  ap.add_argument("--clients", default="8,32,128")
  ap.add_argument("--requests", type=int, default=32, help="most requests per level")
  ap.add_argument("--warm_requests", type=int, default=16)
  ap.add_argument("--think_s", type=float, default=10.0, help="mean gap of one client's requests")
  ap.add_argument("--max_reply", type=int, default=128, help="longest reply asked for (tokens)")
  ap.add_argument("--slots", type=int, default=32, help="--max_batch of both servers")
  ap.add_argument("--chunk_steps", type=int, default=8)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--rollout_prompts", type=int, default=4)
  ap.add_argument("--rollout_tokens", type=int, default=32)
  ap.add_argument("--parts", default="load,rollout")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--compilation_cache", default="/tmp/lwm_serving_load_cache")
  ap.add_argument("--out", default="serving_load")
  ap.add_argument("--log_dir", default="/tmp", help="where the servers' logs go")
  args = ap.parse_args()
  load0 = os.getloadavg()
  items, skipped = workload(args.checkpoint, args.bench, args.max_reply)
  print(f"{len(items)} records fit the context ({skipped} left out); prompt tokens p50 "
        f"{int(np.median([i[1] for i in items]))}, reply tokens (cut at {args.max_reply}) p50 "
        f"{int(np.median([i[2] for i in items]))}", flush=True)
  rows, rollout = [], None
  if "load" in args.parts:
    rows = load_part(args, items)
    print(table(rows, ["engine", "clients", "requests", "tokens_per_s", "p50_s", "p99_s",
                       "ttft_p50_s", "ttft_p99_s"]))
  if "rollout" in args.parts:
    rollout = rollout_part(args, items)
  commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  path = write_result(args.out, {
      "rows": rows,
      "prefix_prefill_speedup": None if rollout is None else rollout["prefill_speedup"],
      "rollout": rollout,
      "command": "python " + " ".join(sys.argv),
      "workload": {"records": len(items), "left_out_over_context": skipped,
                   "prompt_tokens_p50": int(np.median([i[1] for i in items])),
                   "reply_tokens_p50": int(np.median([i[2] for i in items])),
                   "max_reply": args.max_reply, "think_s": args.think_s,
                   "requests_per_level_cap": args.requests, "slots": args.slots,
                   "chunk_steps": args.chunk_steps},
      "load_average_before": load0, "load_average_after": os.getloadavg(), "commit": commit})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
