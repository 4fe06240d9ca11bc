"""The official AgentWorldBench client against our server and our CLI, end to end, side by side.

Needs a checkout of QwenLM/Qwen-AgentWorld (its `eval/eval.py` and `prompts/`; only `openai` is
required to run it). Nothing of it is copied: it runs from where it is. Steps:

1. a few records per domain of evals/mini_bench (`--counts`, or `all` of them) and a tiny
   random-weight HF checkpoint (or `--checkpoint`, e.g. the shipped data/world_model);
2. `launch/serve.py` on that checkpoint, and the stand-in judge (tools/stand_in_judge.py);
3. the official `infer`, `judge`, `score` on the subset, against our server;
4. our CLI scoring the official client's files (`--import_predictions/--import_judged`), and
   judging its predictions itself (`--drop_empty`, as the official client does);
5. our CLI's own run (`all`, baselines included) exported in the official shapes, then judged and
   scored by the official client;
6. a table of the per-domain scores and both overall figures from each side.

  python tools/official_client_e2e.py --official=/path/to/Qwen-AgentWorld --work=/tmp/awb_e2e
  python tools/official_client_e2e.py --official=... --work=... --counts=all \
      --checkpoint=data/world_model --max_tokens=128      # the whole bundled benchmark
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import stand_in_judge
from lwm_jax.sampling.background import free_port

DOMAINS = ("mcp", "search", "terminal", "swe", "android", "web", "os")
CLI = os.path.join(REPO, "evals", "agentworldbench.py")


def build(work: str, counts: dict[str, int | None], checkpoint: str = "") -> str:
  """The benchmark subset (the first N records of each domain; None: all) and the checkpoint
  served: `checkpoint`, else a tiny random-weight one trained a tokenizer here."""
  from flax import nnx

  from lwm_jax import hf
  from lwm_jax.data import tokenizer as tok_lib
  from lwm_jax.model.config import get_preset
  from lwm_jax.model.transformer import Transformer
  bench = os.path.join(work, "bench")
  os.makedirs(bench, exist_ok=True)
  texts = []
  for dom in DOMAINS:
    with open(os.path.join(REPO, "evals", "mini_bench", f"{dom}_test.jsonl"), encoding="utf-8") as f:
      lines = f.readlines()
    with open(os.path.join(bench, f"{dom}_test.jsonl"), "w", encoding="utf-8") as f:
      f.writelines(lines[:counts[dom]])
    if checkpoint:
      continue
    for line in lines[:20]:  # the tiny checkpoint's tokenizer text
      row = json.loads(line)
      texts += [row["system_str"], *row["prompt"], *row["response"]]
  if checkpoint:
    return os.path.abspath(checkpoint)
  ckpt = os.path.join(work, "tiny_hf")
  sp = tok_lib.train_sentencepiece(texts, 2000, os.path.join(ckpt, "tokenizer"))
  vocab = tok_lib.load_tokenizer(sp).vocab_size
  cfg = get_preset("tiny", vocab_size=-(-vocab // 64) * 64, max_position_embeddings=16384)
  hf.save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), ckpt)
  return ckpt


def run(cmd: list[str], cwd: str, log: str) -> str:
  print("$ " + " ".join(cmd), flush=True)
  proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
  with open(log, "a", encoding="utf-8") as f:
    f.write(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
  if proc.returncode:
    raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
  return proc.stdout


def official_figures(text: str) -> dict[str, float | None]:
  """Per-domain total_score and 'Overall' from the official `score` printout."""
  out: dict[str, float | None] = {}
  dom = None
  for line in text.splitlines():
    m = re.match(r"--- (\w+) \(", line)
    if m:
      dom = m.group(1).lower()
      out[dom] = None
    m = re.match(r"\s*total_score: ([\d.]+)", line)
    if m and dom:
      out[dom] = float(m.group(1))
    m = re.match(r"Overall: ([\d.]+)", line)
    if m:
      out["pooled"] = float(m.group(1))
  return out


def our_figures(out_dir: str, system: str) -> dict[str, float | None]:
  with open(os.path.join(out_dir, "scores.json"), encoding="utf-8") as f:
    j = json.load(f)["systems"][system]["judge"]
  return {**{d: j["domains"].get(d) for d in DOMAINS}, "mean": j["overall"],
          "pooled": j["pooled_overall"], "n_domains": j["n_domains"]}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--official", required=True, help="Qwen-AgentWorld checkout (has eval/eval.py)")
  ap.add_argument("--work", required=True, help="empty working directory")
  ap.add_argument("--counts", default="mcp=1,search=2,terminal=3,swe=4,android=2,web=3,os=1",
                  help="records per domain (the first N of each file), or `all`")
  ap.add_argument("--checkpoint", default="",
                  help="HF folder to serve (default: a tiny random-weight model built here)")
  ap.add_argument("--max_tokens", type=int, default=64)
  args = ap.parse_args()
  counts = (dict.fromkeys(DOMAINS) if args.counts == "all" else
            {k: int(v) for k, v in (x.split("=") for x in args.counts.split(","))})
  work = os.path.abspath(args.work)
  os.makedirs(work, exist_ok=True)
  log = os.path.join(work, "commands.log")
  py = sys.executable
  ckpt = build(work, counts, args.checkpoint)
  name = os.path.basename(ckpt.rstrip("/"))
  bench = os.path.join(work, "bench")
  port = free_port()
  env = dict(os.environ, PYTHONPATH=REPO)
  server = subprocess.Popen([py, os.path.join(REPO, "launch", "serve.py"), f"--checkpoint={ckpt}",
                             f"--port={port}", "--max_batch=4"], cwd=REPO, env=env,
                            stdout=open(os.path.join(work, "serve.log"), "w"),
                            stderr=subprocess.STDOUT)
  judge, judge_url = stand_in_judge.start()
  model_url = f"http://127.0.0.1:{port}/v1"
  try:
    deadline = time.time() + 300
    while True:
      if server.poll() is not None:
        raise SystemExit(f"serve.py exited; see {work}/serve.log")
      try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        break
      except OSError:
        if time.time() > deadline:
          raise SystemExit("serve.py did not come up") from None
        time.sleep(1)
    ev = os.path.join(args.official, "eval")
    off = os.path.join(work, "official")
    judge_args = ["--judge-base-url", judge_url, "--judge-model", "stand-in", "--judge-api-key",
                  "none"]
    rows: list[tuple[str, dict[str, float | None]]] = []
    # 3. the official client on our bench against our server
    run([py, "eval.py", "infer", "--data-dir", bench, "--model-base-url", model_url,
         "--model-name", name, "--output-dir", off, "--max-tokens", str(args.max_tokens)],
        ev, log)
    run([py, "eval.py", "judge", "--predictions", f"{off}/predictions.jsonl", *judge_args,
         "--output-dir", off], ev, log)
    rows.append(("official infer+judge+score, model", official_figures(
        run([py, "eval.py", "score", "--predictions", f"{off}/judged.jsonl"], ev, log))))
    # 4. our CLI on the official client's files
    a = os.path.join(work, "ours_scores_official_files")
    run([py, CLI, "score", f"--data={bench}", f"--out={a}", "--system=official_model",
         f"--import_predictions={off}/predictions.jsonl",
         f"--import_judged={off}/judged.jsonl"], REPO, log)
    rows.append(("our score of the official judged file", our_figures(a, "official_model")))
    b = os.path.join(work, "ours_judges_official_predictions")
    run([py, CLI, "judge", f"--data={bench}", f"--out={b}", "--system=official_model",
         f"--import_predictions={off}/predictions.jsonl", "--judge_systems=official_model",
         "--drop_empty", f"--judge_endpoint={judge_url}", "--judge_model=stand-in",
         "--noprogress"], REPO, log)
    run([py, CLI, "score", f"--data={bench}", f"--out={b}"], REPO, log)
    rows.append(("our judge (--drop_empty) + score of official predictions",
                 our_figures(b, "official_model")))
    # 5. our own run, exported and judged/scored by the official client
    c = os.path.join(work, "ours_run")
    run([py, CLI, "all", f"--data={bench}", f"--out={c}", f"--endpoint={model_url}",
         f"--model={name}", f"--max_tokens={args.max_tokens}", f"--judge_endpoint={judge_url}",
         "--judge_model=stand-in", "--noprogress"], REPO, log)
    run([py, CLI, "export", f"--data={bench}", f"--out={c}"], REPO, log)
    d = os.path.join(work, "ours_run_drop_empty")
    run([py, CLI, "judge", f"--data={bench}", f"--out={d}", "--system=copy_previous_x",
         f"--import_predictions={c}/official/copy_previous_predictions.jsonl",
         "--judge_systems=copy_previous_x", "--drop_empty", f"--judge_endpoint={judge_url}",
         "--judge_model=stand-in", "--noprogress"], REPO, log)
    run([py, CLI, "score", f"--data={bench}", f"--out={d}"], REPO, log)
    for system in (name, "copy_previous"):
      rows.append((f"our all, {system}", our_figures(c, system)))
      rows.append((f"official score of our exported judged file, {system}", official_figures(
          run([py, "eval.py", "score", "--predictions",
               f"{c}/official/{system}_judged.jsonl"], ev, log))))
      oj = os.path.join(work, f"official_on_our_{system}")
      run([py, "eval.py", "judge", "--predictions", f"{c}/official/{system}_predictions.jsonl",
           *judge_args, "--output-dir", oj], ev, log)
      rows.append((f"official judge+score of our exported predictions, {system}",
                   official_figures(run([py, "eval.py", "score", "--predictions",
                                         f"{oj}/judged.jsonl"], ev, log))))
    rows.append(("our judge (--drop_empty) + score, copy_previous",
                 our_figures(d, "copy_previous_x")))
  finally:
    server.terminate()
    server.wait(timeout=30)
    judge.shutdown()
  cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
  print("\n| run | " + " | ".join(DOMAINS) + " | mean of domains (n) | pooled |")
  print("|:--" + "|--:" * (len(DOMAINS) + 2) + "|")
  for name, fig in rows:
    mean = f"{cell(fig['mean'])} ({fig['n_domains']})" if "mean" in fig else "(not printed)"
    print(f"| {name} | " + " | ".join(cell(fig.get(d)) for d in DOMAINS) +
          f" | {mean} | {cell(fig.get('pooled'))} |")
  print(f"\ncommands and outputs: {log}")


if __name__ == "__main__":
  main()
