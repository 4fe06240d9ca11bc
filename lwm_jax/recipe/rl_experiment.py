"""GSPO with real rollouts against a "keep doing SFT" control, on one CPU, from the bundled corpus:
the logic of `launch/rl_experiment.py` (experiments/gspo_vs_sft), over a config of
configs/rl_experiment.py (its fields are documented there; below, `field` names one).

1. The training split's trajectories are split by id into disjoint CPT / SFT / RL pools
   (`lwm_jax.rl.pool.split_pools`), written as JSONL files in the run folder.
2. A SentencePiece tokenizer on the CPT+SFT pools; CPT of the demo-sized MoE (the `demo` preset)
   on the CPT pool, then SFT in thinking mode on the SFT pool from the CPT export: the start.
3. GSPO from the SFT export (`configs/rl.py:demo`: rewards `rule` + `reference`, 8 prompts x 4
   replies per rollout, 4 updates per rollout) on the RL pool, through launch/train.py's code path.
4. The control: SFT continued from the same start on the RL pool's trajectories (their real
   observations as targets) for as many target tokens as GSPO generated in its rollouts.
With `start`=DIR (a Hugging Face folder with its tokenizer.model, e.g. the shipped world model of
launch/reproduce.py, which trained on the whole training split) steps 1-2 are skipped: DIR is the
start, the RL pool is the corpus's VALIDATION split (trajectories the start never trained on), and
the rows are as long as the start's context.

5. Free-running (greedy) evaluation of the three models on the same test-split prompts: the
   reward mix, token F1, edit similarity and the share of replies that parse. The table goes to
   results.md / results.json (with the start folder's sha256, the settings and both runs' resolved
   configs), GSPO's reward curve to reward.png, the per-step curves to curves.csv. A write-up's
   figures come from these files: `python experiments/figures.py gspo RUN_DIR`.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time

import ml_collections

from configs import cpt as cpt_config, rl as rl_config, sft as sft_config
from configs import rl_experiment as experiment_config
from lwm_jax import checkpoints, recipe, run_folder
from lwm_jax.data import corpus as corpus_lib, prompts, schema, splits, tokenizer as tok_lib
from lwm_jax.data.jsonl import iter_jsonl
from lwm_jax.rl import pool as pool_lib, stage
from lwm_jax.rl.heldout import HeldOut
from lwm_jax.train import trainer

SEQ_LEN = 1024


def _pipeline_config(stage_name: str, steps: int, tok: str, train: str, vocab: int,
                     init_from_hf: str = "", context: int = SEQ_LEN):
  c = {"cpt": cpt_config, "sft": sft_config}[stage_name].get_config("demo")
  c.model.vocab_size = vocab
  c.model.max_position_embeddings = context
  c.train.update(dict(num_steps=steps, batch_size=8, seq_len=SEQ_LEN, eval_every=0,
                      log_every=5, progress=False))
  c.checkpoint.every = steps
  c.data.source, c.data.tokenizer, c.data.pipeline.jsonl = "pipeline", tok, train
  # as launch/demo.py: keep over-long SFT samples by dropping their oldest history
  c.data.pipeline.overlong = "truncate_history"
  c.init_from_hf, c.export_hf = init_from_hf, True
  return c


def _target_tokens_per_step(workdir: str) -> float:
  ws = [r["loss_weight"] for _, r in iter_jsonl(os.path.join(workdir, "metrics.jsonl"))
        if r.get("split") == "train" and "loss_weight" in r]
  return sum(ws) / max(len(ws), 1)


def _generated_tokens(workdir: str, updates_per_batch: int) -> float:
  """Reply tokens sampled by a GSPO run: rows are logged each step, one rollout per
  `updates_per_batch` steps."""
  total = 0.0
  for _, r in iter_jsonl(os.path.join(workdir, "metrics.jsonl")):
    if r.get("split") == "train" and r.get("rollout/minibatch") == 0:
      total += r["rollout/response_len"] * r["rollout/samples"]
  return total


CURVE_KEYS = ("loss", "clip_frac", "ratio_mean", "ratio_min", "ratio_max", "entropy",
              "rollout/reward_mean", "rollout/reward_rule", "rollout/reward_reference",
              "rollout/response_len", "rollout/truncated", "rollout/zero_variance_groups",
              "rollout/rollout_s")
EVAL_KEYS = ("reward_mean", "token_f1", "edit_sim", "parses", "response_len")


def write_curves(rl_wd: str, out_csv: str) -> None:
  """GSPO's per-step figures and its periodic held-out metrics as one small CSV."""
  rows: dict[int, dict] = {}
  for _, r in iter_jsonl(os.path.join(rl_wd, "metrics.jsonl")):
    row = rows.setdefault(r["step"], {"step": r["step"]})
    keys = CURVE_KEYS if r.get("split") == "train" else EVAL_KEYS
    prefix = "" if r.get("split") == "train" else "heldout/"
    row.update({prefix + k: r[k] for k in keys if k in r})
  cols = ["step"] + list(CURVE_KEYS) + [f"heldout/{k}" for k in EVAL_KEYS]
  with open(out_csv, "w") as f:
    f.write(",".join(cols) + "\n")
    for step in sorted(rows):
      f.write(",".join("" if rows[step].get(c) is None else f"{rows[step][c]:.6g}"
                       for c in cols) + "\n")


def _evaluate(name: str, hf_dir: str, held: HeldOut, reward, out_dir: str) -> dict:
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  t0 = time.time()
  sampler = Sampler.from_checkpoint(hf_dir)
  m, rows = held.evaluate(sampler, reward)
  with open(os.path.join(out_dir, f"eval_{name}.jsonl"), "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  print(f"[{name}] reward {m['reward_mean']:.2f}  token F1 {m['token_f1']:.4f}  "
        f"edit sim {m['edit_sim']:.4f}  parses {m['parses']:.2f}  ({time.time() - t0:.0f} s)",
        flush=True)
  return m


def _train_start(wd: str, pools: dict, s: dict) -> tuple[str, str, object, int]:
  """Tokenizer, CPT and SFT on the CPT and SFT pools (kept when `reuse_start` and there): (SFT
  export, tokenizer path, tokenizer, vocabulary)."""
  sp = os.path.join(wd, "tokenizer.model")
  start_hf = os.path.join(wd, "sft", "hf")
  if not (s["reuse_start"] and os.path.isdir(start_hf)):
    texts = []
    for t in pools["cpt"] + pools["sft"]:
      texts.append(prompts.system_prompt(t, 1))
      texts += [x for turn in t.turns for x in (turn.action, turn.observation)]
    sp = tok_lib.train_sentencepiece(texts, s["vocab"], os.path.join(wd, "tokenizer"))
  tok = tok_lib.load_tokenizer(sp)
  vocab = -(-tok.vocab_size // 128) * 128
  if not (s["reuse_start"] and os.path.isdir(start_hf)):
    t0 = time.time()
    cpt = trainer.train(_pipeline_config("cpt", s["cpt_steps"], sp, paths_of(wd, "cpt"), vocab),
                        os.path.join(wd, "cpt"))
    print(f"CPT: loss {cpt['losses'][0]:.3f} -> {cpt['losses'][-1]:.3f} "
          f"({time.time() - t0:.0f} s)", flush=True)
    t0 = time.time()
    sft = trainer.train(_pipeline_config("sft", s["sft_steps"], sp, paths_of(wd, "sft"), vocab,
                                         os.path.join(wd, "cpt", "hf")), os.path.join(wd, "sft"))
    print(f"SFT: loss {sft['losses'][0]:.3f} -> {sft['losses'][-1]:.3f} "
          f"({time.time() - t0:.0f} s)", flush=True)
  return start_hf, sp, tok, vocab


def paths_of(wd: str, pool: str) -> str:
  """Where a pool's trajectories are written in the run folder (pool_<name>.jsonl)."""
  return os.path.join(wd, f"pool_{pool}.jsonl")


def _sft_target_tokens(trajs, tok) -> float:
  """Mean target tokens of one SFT sample of `trajs` (rows of SEQ_LEN, the control's rows)."""
  c = _pipeline_config("sft", 1, "", "", 0).data.pipeline
  c.seq_len = SEQ_LEN
  from lwm_jax.data import pipeline  # pylint: disable=import-outside-toplevel
  ws = [float(sum(w > 0 for w in pipeline.sft_sample(t, tok, c)["loss_weights"]))
        for t in trajs]
  return sum(ws) / max(len(ws), 1)


def resolve(config: ml_collections.ConfigDict) -> dict:
  """`config` (configs/rl_experiment.py) checked before any folder is made or replaced, each error
  (SystemExit) naming its field, as a plain dict."""
  s = dict(config)
  known = experiment_config.get_config()
  bad_field = recipe.unknown_field(s, known, "configs/rl_experiment.py")
  if bad_field:
    raise SystemExit(bad_field)
  if not (os.path.isdir(s["corpus"]) and splits.split_files(s["corpus"], "train")
          and splits.split_files(s["corpus"], "test")):
    raise SystemExit(f"--config.corpus: no train and test split files under {s['corpus']}")
  try:
    stage.parse_fractions(s["fractions"])
  except (ValueError, KeyError) as e:
    raise SystemExit(f"--config.fractions={s['fractions']}: {e}") from None
  for name in ("vocab", "cpt_steps", "sft_steps", "rl_steps", "max_new_tokens", "eval_prompts",
               "curve_prompts"):
    if s[name] < 1:
      raise SystemExit(f"--config.{name} must be at least 1, got {s[name]}")
  if not s["rl_lr"] > 0:
    raise SystemExit(f"--config.rl_lr must be > 0, got {s['rl_lr']}")
  if s["start"]:
    corpus_lib.given_start(s["start"])
  return s


def run(config: ml_collections.ConfigDict) -> dict:
  """The whole experiment of `config` (configs/rl_experiment.py): every setting is checked before
  `workdir` is touched. Returns results.json's contents."""
  t_start = time.time()
  s = recipe.settings(config, resolve)
  train_files = splits.split_files(s["corpus"], "train")
  test_files = splits.split_files(s["corpus"], "test")
  try:
    wd = run_folder.prepare(s["workdir"], "--config.workdir", s["overwrite"],
                            keep=s["reuse_start"])
  except ValueError as e:
    raise SystemExit(str(e)) from None
  trajs = [t for p in train_files for t in schema.read_jsonl(p)]
  tests = splits.read_split(s["corpus"], "test")
  if s["start"]:
    # the start trained on the whole training split: RL and its control get the validation split
    valid = splits.read_split(s["corpus"], "validation")
    pools = {"rl": valid}
  else:
    pools = pool_lib.split_pools(trajs, stage.parse_fractions(s["fractions"]), seed=0)
  paths = {}
  for name, items in pools.items():
    paths[name] = paths_of(wd, name)
    with open(paths[name], "w") as f:
      for t in items:
        f.write(json.dumps(t.to_dict()) + "\n")
  print(("RL pool: the validation split, " if s["start"] else
         f"pools of {len(trajs)} training trajectories: ")
        + ", ".join(f"{k} {len(v)}" for k, v in pools.items()) + f"; {len(tests)} test", flush=True)

  # ------------------------------------------------------------------ the SFT start
  if s["start"]:
    start_hf, sp, vocab, context = corpus_lib.given_start(s["start"])
    tok = tok_lib.load_tokenizer(sp)
    per_step = _sft_target_tokens(pools["rl"], tok) * 8
  else:
    start_hf, sp, tok, vocab = _train_start(wd, pools, s)
    context = SEQ_LEN
    per_step = _target_tokens_per_step(os.path.join(wd, "sft"))

  start_record = checkpoints.start_record(start_hf)  # before anything trains from it

  # ------------------------------------------------------------------ GSPO
  c = rl_config.get_config("demo")
  c.model.vocab_size = vocab
  c.data.tokenizer, c.data.pipeline.jsonl = sp, paths["rl"]
  c.rl.update(dict(pool_fractions="rl=1.0", max_new_tokens=s["max_new_tokens"],
                   eval_jsonl=",".join(test_files), eval_prompts=s["curve_prompts"]))
  c.model.max_position_embeddings = context
  c.train.update(dict(num_steps=s["rl_steps"], seq_len=context, log_every=1, progress=False,
                      eval_every=max(s["rl_steps"] // 4, 1)))
  c.optim.lr = s["rl_lr"]
  c.checkpoint.every = s["rl_steps"]
  c.init_from_hf, c.export_hf = start_hf, True
  rl_wd = os.path.join(wd, "gspo")
  shutil.rmtree(rl_wd, ignore_errors=True)
  t0 = time.time()
  source = stage.rollout_source(c)
  gspo = trainer.train(c, rl_wd, source=source)
  gspo_s = time.time() - t0
  generated = _generated_tokens(rl_wd, c.rl.updates_per_batch)
  print(f"GSPO: {s['rl_steps']} steps, {generated:.0f} generated reply tokens "
        f"({gspo_s:.0f} s); reward curve {gspo.get('reward_png')}", flush=True)

  # ------------------------------------------------------------------ the SFT control
  ctl_steps = max(1, math.ceil(generated / max(per_step, 1.0)))
  ctl = _pipeline_config("sft", ctl_steps, sp, paths["rl"], vocab, start_hf, context)
  ctl.optim.warmup_steps = 0
  ctl_wd = os.path.join(wd, "sft_control")
  shutil.rmtree(ctl_wd, ignore_errors=True)
  t0 = time.time()
  control = trainer.train(ctl, ctl_wd)
  ctl_tokens = _target_tokens_per_step(ctl_wd) * ctl_steps
  print(f"SFT control: {ctl_steps} steps, ~{ctl_tokens:.0f} target tokens "
        f"({time.time() - t0:.0f} s)", flush=True)

  # ------------------------------------------------------------------ the table
  held_pool = pool_lib.build_pool(tests, tok, context - s["max_new_tokens"], seed=0)
  held = HeldOut(held_pool, limit=s["eval_prompts"], max_new_tokens=s["max_new_tokens"])
  reward = stage.make_reward(c)
  table = {name: _evaluate(name, path, held, reward, wd) for name, path in
           [("sft_start", start_hf), ("gspo", gspo["export_hf"]),
            ("sft_control", control["export_hf"])]}
  summary = {"corpus": s["corpus"], "start": s["start"] or os.path.join(wd, "sft", "hf"),
             "context": context, "pools": {k: len(v) for k, v in pools.items()},
             "test_prompts": len(held.items), "test_pool": held_pool.stats,
             "rl_steps": s["rl_steps"], "generated_tokens": generated,
             "control_steps": ctl_steps, "control_target_tokens": ctl_tokens,
             "reward": c.rl.reward, "max_new_tokens": s["max_new_tokens"],
             "gspo_seconds": gspo_s, "seconds": time.time() - t_start, "table": table,
             "reward_png": gspo.get("reward_png"),
             # what a reader needs to rerun it: the start folder's sha256, the settings (under
             # "flags", as before they were config fields) and the resolved configs of the
             # GSPO run and of the control
             "start_folder": start_record,
             "settings": {"flags": {f: s[f] for f in experiment_config.RECORDED},
                 "gspo": json.loads(c.to_json_best_effort()),
                 "sft_control": json.loads(ctl.to_json_best_effort())}}
  with open(os.path.join(wd, "results.json"), "w") as f:
    json.dump(summary, f, indent=2)
  lines = ["| model | reward (0-25) | reward rule | reward reference | token F1 | edit sim | "
           "parses |", "|---|---|---|---|---|---|---|"]
  for name, m in table.items():
    lines.append(f"| {name} | {m['reward_mean']:.2f} | {m.get('reward_rule', 0):.2f} | "
                 f"{m.get('reward_reference', 0):.2f} | {m['token_f1']:.4f} | "
                 f"{m['edit_sim']:.4f} | {m['parses']:.2f} |")
  write_curves(rl_wd, os.path.join(wd, "curves.csv"))
  with open(os.path.join(wd, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  print(f"done in {summary['seconds']:.0f} s; {wd}/results.json, {wd}/gspo/reward.png")
  return summary

