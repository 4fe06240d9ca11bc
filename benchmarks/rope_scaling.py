"""How many bundled AgentWorldBench records fit the shipped world model's context, at 2,048 (as
shipped) and at 4,096 (YaRN factor 2, the same weights), and the YaRN folder that the free-running
comparison loads.

  python benchmarks/rope_scaling.py count [--checkpoint=data/world_model] [--bench=evals/mini_bench]
  python benchmarks/rope_scaling.py yarn_folder --out=/tmp/wm_yarn [--factor=2]
  python benchmarks/rope_scaling.py long --model=shipped=data/world_model --model=yarn2=/tmp/wm_yarn

count: each record rendered as its chat messages with the checkpoint's tokenizer and chat template
(as benchmarks/serving_load.py does); a record fits a context C when its prompt tokens plus its
reply budget (the tokens of its real reply, the budget serving_load.py asks for) are at most C.
Also counted: prompts that leave no room to generate at all (prompt >= C). Prints JSON.

yarn_folder: a copy of the checkpoint whose config.json carries `rope_parameters` (and the
`rope_scaling` copy) of type yarn with `factor`, original_max_position_embeddings = the shipped
context and max_position_embeddings = factor x that; the weights are the shipped file, unchanged
(checksums.json is left out: config.json differs from the one it records).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def count(checkpoint: str, bench: str, contexts=(2048, 4096, 4608)) -> dict:
  from lwm_jax.data.tokenizer import load_tokenizer
  from lwm_jax.eval import records
  from lwm_jax.sampling.chat_template import chatml_ids
  tok = load_tokenizer(checkpoint)
  prompts, replies, domains = [], [], []
  for rec in records.load_bench(bench):
    prompts.append(len(chatml_ids(tok, records.chat_messages(rec), None, True, False)))
    replies.append(len(tok.encode(records.ground_truth(rec) or "")))
    domains.append(rec.task)
  p, r = np.asarray(prompts), np.asarray(replies)
  out = {"records": int(len(p)), "prompt_p50": float(np.median(p)), "prompt_max": int(p.max()),
         "reply_p50": float(np.median(r)), "total_max": int((p + r).max()), "contexts": {}}
  for c in contexts:
    fit = (p + r) <= c
    per_domain = {}
    for d in sorted(set(domains)):
      m = np.asarray([x == d for x in domains])
      per_domain[d] = {"records": int(m.sum()), "fit": int((fit & m).sum())}
    out["contexts"][str(c)] = {"fit": int(fit.sum()), "left_out": int((~fit).sum()),
                               "prompt_leaves_no_room": int((p >= c).sum()),
                               "per_domain": per_domain}
  return out


def long_records(checkpoints: dict[str, str], bench: str, per_domain: int, max_new_tokens: int,
                 long_from: int = 2048) -> dict:
  """Greedy replies of each checkpoint to `per_domain` records of each domain (by id) whose prompt
  plus real reply exceed `long_from` tokens and whose prompt leaves `max_new_tokens` of room in
  the largest context, generated and scored as evals/free_running.py does (a context too short
  for the whole history loses its oldest turns; token F1 of the cleaned prediction against the
  real observation), beside copy-previous."""
  from lwm_jax.data import bench_records as awb
  from lwm_jax.data.tokenizer import load_tokenizer
  from lwm_jax.eval import free_running as fr
  from lwm_jax.eval import records
  from lwm_jax.sampling import Sampler
  from lwm_jax.sampling.chat_template import chatml_ids
  first = next(iter(checkpoints.values()))
  tok = load_tokenizer(first)
  room = max(int(json.load(open(os.path.join(d, "config.json")))["max_position_embeddings"])
             for d in checkpoints.values()) - max_new_tokens
  picked, count = [], {}
  for rec in sorted(records.load_bench(bench), key=lambda r: (r.task, r.id)):
    msgs = records.chat_messages(rec)
    truth = records.ground_truth(rec) or ""
    p = len(chatml_ids(tok, msgs, None, True, False))
    if p + len(tok.encode(truth)) <= long_from or p > room or count.get(rec.task, 0) >= per_domain:
      continue
    count[rec.task] = count.get(rec.task, 0) + 1
    i = rec.turn_idx - 1
    prev = awb.parse_observation(rec.response[i - 1]) if i >= 1 else ""
    picked.append((p, fr.Case(key=f"{rec.task}:{rec.id}:{rec.turn_idx}", domain=rec.task,
                              traj_id=rec.id, turn=i, messages=tuple(msgs), truth=truth,
                              previous=prev)))
  cases = [c for _, c in picked]
  rows = {c.key: {"domain": c.domain, "prompt_tokens": p} for p, c in picked}
  for c, r in zip(cases, fr.score(cases, {c.key: c.previous for c in cases})):
    rows[c.key]["copy_previous_f1"] = r["token_f1"]
  summary = {"copy_previous": float(np.mean([r["copy_previous_f1"] for r in rows.values()]))}
  for name, folder in checkpoints.items():
    preds, stats = fr.generate(Sampler.from_checkpoint(folder), cases, max_new_tokens, 8)
    scored = fr.score(cases, {k: v["prediction"] for k, v in preds.items()})
    for c, r in zip(cases, scored):
      rows[c.key][f"{name}_f1"] = r["token_f1"]
      rows[c.key][f"{name}_history_dropped"] = preds[c.key]["history_dropped"]
      rows[c.key][f"{name}_prediction_head"] = preds[c.key]["prediction"][:160]
    rows_truth = {c.key: c.truth[:160] for c in cases}
    summary[name] = float(np.mean([r["token_f1"] for r in scored]))
    summary[f"{name}_seconds"] = stats.seconds
  for k, t in rows_truth.items():
    rows[k]["truth_head"] = t
  return {"records": len(cases), "long_from": long_from, "max_new_tokens": max_new_tokens,
          "mean_token_f1": summary, "rows": rows}


def yarn_folder(checkpoint: str, out: str, factor: float) -> str:
  os.makedirs(out, exist_ok=True)
  for fn in os.listdir(checkpoint):
    if fn not in ("config.json", "checksums.json") and os.path.isfile(os.path.join(checkpoint, fn)):
      shutil.copy2(os.path.join(checkpoint, fn), os.path.join(out, fn))
  with open(os.path.join(checkpoint, "config.json")) as f:
    cfg = json.load(f)
  orig = int(cfg["max_position_embeddings"])
  rope = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": orig,
          "rope_theta": cfg.get("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta"))}
  cfg.update(max_position_embeddings=int(orig * factor), rope_parameters=rope,
             rope_scaling=dict(rope))
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("what", choices=("count", "yarn_folder", "long"))
  ap.add_argument("--checkpoint", default=os.path.join(ROOT, "data", "world_model"))
  ap.add_argument("--bench", default=os.path.join(ROOT, "evals", "mini_bench"))
  ap.add_argument("--out", default="/tmp/wm_yarn")
  ap.add_argument("--factor", type=float, default=2.0)
  ap.add_argument("--model", action="append", default=[],
                  help="long: NAME=DIR, repeatable (e.g. shipped=data/world_model yarn2=/tmp/wm_yarn)")
  ap.add_argument("--per_domain", type=int, default=2)
  ap.add_argument("--max_new_tokens", type=int, default=320)
  a = ap.parse_args()
  if a.what == "count":
    print(json.dumps(count(a.checkpoint, a.bench), indent=1))
  elif a.what == "long":
    models = dict(m.split("=", 1) for m in a.model)
    print(json.dumps(long_records(models, a.bench, a.per_domain, a.max_new_tokens), indent=1))
  else:
    print(yarn_folder(a.checkpoint, a.out, a.factor))


if __name__ == "__main__":
  main()
