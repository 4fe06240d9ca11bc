"""Agents trained inside the world model: BC only, Real RL, Sim RL, the paper's warm-up and BC from
the world model, scored on held-out tasks in the REAL environment. The logic of
`launch/agent_experiment.py` (docs/agents.md), over a config of configs/agent_experiment.py (its
fields are documented there; below, `field` names one).

Per seed (the run's seed: BC data order, rollouts, parameter init of a fresh base):
1. bc: the agent learns the scripted agents' actions of the domain's corpus split
   (configs/agent_bc.py) from the base (`base`, or a fresh model of the preset): the policy
   model every other arm but bc_from_wm starts from.
2. real: GSPO on multi-turn episodes in the real environment (configs/agent_rl.py,
   agent.arm="real"), from the BC checkpoint.
3. sim: the same, with episodes in `SimulatedEnv` backed by the world model (`world_model`);
   its reward is the transcript verifier (`verify_transcript.check_transcript`) applied to the
   simulated episode, i.e. the world model's observations judged by the same rules the real
   checks use.
4. warmup (the paper's LWM warm-up): the policy model (the BC checkpoint) gets single-turn
   WORLD-MODEL RL first: GSPO on next-observation prediction over the corpus's RL pool
   (configs/rl.py, rewards rule + reference, no tool calls, no agent reward); that model is
   evaluated as an agent with no further tuning (`zero_shot` in its record), then gets the agent
   RL of `warmup_rl` (real by default) and is evaluated again.
5. bc_from_wm (the arm called "warm-up" before issue 64): BC from the world-model checkpoint
   instead of the base, then the agent RL of `warmup_rl`.
Every agent-RL arm gets the same episode budget (`episodes`). Every arm is evaluated with
greedy episodes on `verify.task_seeds("heldout", n)` in the real environment: at the start of RL
and every few steps (success vs episodes), and at the end. Every run's record holds the sha256 of
each model folder it started from (`start`, and `wm_rl_start` for the warm-up's world-model RL)
and its own resolved settings (`settings`: the budget it ran with, and the agent-RL config), so a
report merged from several sittings shows each run's own learning rate, episodes and eval
cadence. Outputs in `out`: results.json, results.md (success with a 95% CI over seeds, or the
Wilson interval over tasks with one seed; wall-clock per arm), success_vs_episodes.png.

The tiny budget trains its own tokenizer and a tiny world model (a few SFT steps on the corpus)
when none is given, and runs end to end in minutes on a CPU; its numbers only show the machinery.

Seeds in several sittings: `first_seed=K, seeds=N` runs seeds K..K+N-1; `bc_seed=S` starts every
seed's RL from the BC checkpoints of seed S (with `bc_from`, those of an earlier run), so the seeds
differ in the RL only; `merge="DIR[:ARM+ARM],..."` puts the runs of an earlier `out` (of the named
arms, or all: those it made and those it had merged itself) into this report; results.json keeps
this run's own runs under "runs" and the merged ones under "merged" (`arms=""` with `merge`: the
report alone)."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import time

import ml_collections

from configs import agent_bc, agent_rl, stages
from configs import agent_experiment as experiment_config
from lwm_jax import checkpoints, recipe, run_folder
from lwm_jax.data import agent_targets, corpus as corpus_lib, schema
from lwm_jax.envs import verify
from lwm_jax.rl import agent_stage
from lwm_jax.rl.agent_episodes import evaluate_policy, wilson

ROOT = experiment_config.ROOT
ARMS = experiment_config.ARMS


def _comma_list(value: str) -> list[str]:
  return [x.strip() for x in str(value).split(",") if x.strip()]


def resolve(config: ml_collections.ConfigDict) -> dict:
  """`config` (configs/agent_experiment.py) checked before any folder is made or replaced, each
  error (SystemExit) naming its field, as the plain dict the run reads: `arms` and `merge` as
  lists, `out` absolute."""
  s = dict(config)
  known = experiment_config.get_config()  # every variant has the same fields
  bad_field = recipe.unknown_field(s, known, "configs/agent_experiment.py")
  if bad_field:
    raise SystemExit(bad_field)
  s["arms"], s["merge"] = _comma_list(s["arms"]), _comma_list(s["merge"])
  bad = [a for a in s["arms"] if a not in ARMS]
  if bad:
    raise SystemExit(f"--config.arms: unknown arm(s) {', '.join(bad)} (expected some of "
                     f"{', '.join(ARMS)})")
  if s["arms"] and not os.path.isfile(_split(s["domain"], "train")):
    corpus = os.path.join(ROOT, "data", "corpus")
    known_domains = sorted({f.split("_")[0] for f in os.listdir(corpus) if f.endswith(".jsonl.gz")})
    raise SystemExit(f"--config.domain={s['domain']}: no corpus {_split(s['domain'], 'train')} "
                     f"(known: {', '.join(known_domains)})")
  if not s["world_model"] and {"sim", "bc_from_wm"} & set(s["arms"]) and s["budget"] != "tiny":
    raise SystemExit("--config.world_model is required for the sim and bc_from_wm arms (a "
                     "trained LWM checkpoint, after its RL)")
  for field in ("world_model", "base", "bc_from"):
    if s[field] and not os.path.isdir(s[field]):
      raise SystemExit(f"--config.{field}={s[field]} is not a folder")
  if s["tokenizer"] and not os.path.isfile(s["tokenizer"]):
    raise SystemExit(f"--config.tokenizer={s['tokenizer']} is not a file")
  for spec in s["merge"]:
    if not os.path.isdir(spec.split(":")[0]):
      raise SystemExit(f"--config.merge: {spec.split(':')[0]} is not a folder")
  for field, allowed in (("warmup_rl", ("real", "sim")), ("bc_layout", ("", "turns", "trajectory")),
                         ("wm_rl_domains", ("domain", "all")),
                         ("wm_loop_guard", ("off", "cut", "resample"))):
    if s[field] not in allowed:
      raise SystemExit(f"--config.{field}={s[field]!r} is not one of "
                       f"{', '.join(repr(a) for a in allowed)}")
  for field in ("seeds", "episodes", "eval_tasks", "bc_steps", "eval_every", "wm_rl_steps",
                "vocab", "train_tasks", "max_turns", "max_new_tokens", "seq_len", "bc_seq_len",
                "wm_steps", "wm_max_new_tokens", "wm_rl_max_new_tokens"):
    if s[field] < 1:
      raise SystemExit(f"--config.{field} must be >= 1, got {s[field]}")
  for field in ("workers", "bc_tasks", "first_seed"):
    if s[field] < 0:
      raise SystemExit(f"--config.{field} must not be negative, got {s[field]}")
  for field in ("rl_lr", "wm_rl_lr"):
    if not s[field] > 0:
      raise SystemExit(f"--config.{field} must be > 0, got {s[field]}")
  if not s["out"]:
    raise SystemExit("--config.out: give the run folder")
  s["out"] = os.path.abspath(s["out"])
  return s


def budget(s: dict) -> dict:
  """The budget the run ran with (results.json's meta.budget): the budget's fields, and
  `bc_data` once chosen."""
  b = {k: s[k] for k in experiment_config.BUDGET_FIELDS}
  if "bc_data" in s:
    b["bc_data"] = s["bc_data"]
  return b


def budget_record(s: dict) -> dict:
  """The settings a run used, recorded in its own record (a merged report shows each run's): the
  budget, then the run's domain and switches."""
  return dict(budget(s), domain=s["domain"], warmup_rl=s["warmup_rl"], workers=s["workers"],
              bc_layout=s["bc_layout"], base=checkpoints.start_record(s["base"]))


def _banner(text: str) -> None:
  print(f"\n=== {text}", flush=True)


def tokenizer(out: str, s: dict) -> tuple[str, int]:
  """(tokenizer path, model vocabulary): `tokenizer`, or SentencePiece on the domain's corpus."""
  if s["tokenizer"]:
    from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
    return s["tokenizer"], -(-tok_lib.load_tokenizer(s["tokenizer"]).vocab_size // 128) * 128
  trajs = list(schema.read_jsonl(_split(s["domain"], "train")))
  extra = [agent_targets.agent_system_prompt(t) for t in trajs]
  extra += [agent_targets.observation_message(x.observation) for t in trajs for x in t.turns]
  path, _, vocab = corpus_lib.train_tokenizer(trajs, s["vocab"], os.path.join(out, "sp"), extra)
  return path, vocab


def _split(domain: str, name: str) -> str:
  """The bundled corpus's split `name` of `domain`."""
  return os.path.join(ROOT, "data", "corpus", f"{domain}_{name}.jsonl.gz")


def train_world_model(out: str, tok: str, vocab: int, s: dict) -> str:
  """A stand-in world model for the tiny budget: SFT of a fresh model on the domain's corpus."""
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  wd = os.path.join(out, "world_model")
  c = stages.stage_config("sft", preset=s["preset"], vocab=vocab, steps=s["wm_steps"], batch=4,
                          seq_len=s["bc_seq_len"], workdir=wd, tokenizer=tok,
                          train=_split(s["domain"], "train"),
                          valid=_split(s["domain"], "validation"), export_hf=True)
  c.train.progress = False
  return trainer.train(c, wd)["export_hf"]


def reused_bc(bc_from: str, wd: str, seed: int, arm: str) -> dict | None:
  """The BC run `bc_SEED` (arm "bc") or `bc_warm_SEED` (arm "bc_from_wm", which results
  written before issue 64 call "warmup") of the earlier run folder `bc_from`, copied to `wd`, with
  its BC time and loss from that run's results.json; None when `bc_from` is "", or for a BC from
  the world model the earlier run did not make."""
  if not bc_from:
    return None
  src = os.path.join(bc_from, os.path.basename(wd))
  results = os.path.join(bc_from, "results.json")
  if arm == "bc_from_wm" and not os.path.isdir(src):
    return None
  try:
    with open(results) as f:
      saved = json.load(f)["runs"]
    key = "warmup" if arm == "bc_from_wm" and arm not in saved else arm
    recs = [r for r in _seeded(saved[key]) if r["seed"] == seed]
  except (OSError, KeyError, ValueError) as e:
    raise SystemExit(f"--config.bc_from: {results} has no {arm} runs ({e!r})") from None
  if not recs:
    raise SystemExit(f"--config.bc_from: {results} has no {arm} run of seed {seed}")
  rec = recs[0]
  if not os.path.isdir(os.path.join(src, "hf")):
    raise SystemExit(f"--config.bc_from: {src}/hf is missing (no exported BC checkpoint)")
  shutil.copytree(src, wd)
  print(f"BC of {arm}, seed {seed}: reused from {src} (trained in {rec['bc_s']:.0f} s)", flush=True)
  return {"hf": os.path.join(wd, "hf"), "bc_s": rec["bc_s"], "bc_loss": rec.get("bc_loss")}


def _seeded(rs: list[dict]) -> list[dict]:
  """An arm's runs, each with its "seed" (runs written before the field existed are seeds 0..)."""
  return [dict(r, seed=r.get("seed", i)) for i, r in enumerate(rs)]


def _folder_runs(results: dict) -> dict[str, list[dict]]:
  """Every run a results.json holds: its own and those it had merged from other folders (so a
  report folder can be merged again without the folders it was made from)."""
  arms: dict[str, list[dict]] = {}
  for src in [results["runs"]] + list(results.get("merged", {}).values()):
    for arm, rs in src.items():
      arms.setdefault(arm, []).extend(_seeded(rs))
  return arms


def merged_runs(runs: dict[str, list[dict]], specs: list[str]) -> tuple[dict, dict]:
  """(`runs` with the runs of earlier run folders (`merge`), per arm in seed order; what was taken
  from each folder). A folder gives its own runs and those it had merged itself. A spec is DIR or
  DIR:ARM+ARM (those arms only); the same (arm, seed) twice is an error naming both places,
  unless both are the same record (a folder merged again beside one it was made from)."""
  out: dict[str, list[dict]] = {}
  taken: dict[str, dict[str, list[dict]]] = {}
  where: dict[tuple[str, int], tuple[str, dict]] = {}
  for spec in [None] + list(specs):
    if spec is None:
      name, arms = "this run", runs
    else:
      folder, _, only = spec.partition(":")
      name = os.path.join(folder, "results.json")
      try:
        with open(name) as f:
          arms = _folder_runs(json.load(f))
      except (OSError, KeyError, ValueError, AttributeError) as e:
        raise SystemExit(f"--config.merge: cannot read the runs of {name} ({e!r})") from None
      if only:
        missing = set(only.split("+")) - set(arms)
        if missing:
          raise SystemExit(f"--config.merge: {name} has no runs of {sorted(missing)}")
        arms = {a: arms[a] for a in only.split("+")}
      taken[folder] = arms
    for arm, rs in arms.items():
      for r in rs:  # seeded: this run's carry theirs, an earlier folder's went through _seeded
        key = (arm, r["seed"])
        if key in where:
          if where[key][1] == r:
            continue
          raise SystemExit(f"--config.merge: {arm} seed {r['seed']} is in both {where[key][0]} and "
                           f"{name}")
        where[key] = (name, r)
        out.setdefault(arm, []).append(r)
  return {arm: sorted(rs, key=lambda r: r["seed"]) for arm, rs in out.items()}, taken


def demonstrations(out: str, s: dict) -> str:
  """The BC data: the domain's corpus training split, plus (with `bc_tasks`) the scripted agent
  on that many training tasks, taken after the RL's `train_tasks` so that RL meets new tasks;
  each trajectory cut after the turn that meets its task (`verify_transcript.cut_at_goal`, the
  data preparation of `launch/data.py goal-cut`), written under `out`; comma-separated files
  for `data.pipeline.jsonl`."""
  from lwm_jax.envs import collect, verify_transcript  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  parts = [("corpus", list(schema.read_jsonl(_split(s["domain"], "train"))))]
  if s["bc_tasks"]:
    seeds = verify.task_seeds("train", s["train_tasks"] + s["bc_tasks"])[s["train_tasks"]:]
    parts.append(("tasks", collect.record_tasks(s["domain"], seeds)))
    print(f"BC data: {len(parts[1][1])} scripted episodes on training tasks {seeds[0]}..{seeds[-1]} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
  paths = []
  for name, trajs in parts:
    path = os.path.join(out, f"bc_{name}_{s['domain']}_goal.jsonl.gz")
    st = verify_transcript.write_cut_at_goal(trajs, path)
    print(f"BC data: {st['trajectories']} {name} trajectories, {st['cut']} cut at their goal "
          f"({st['turns_dropped']} later turns left out), {st['never_solved']} never meet it "
          f"-> {path}", flush=True)
    paths.append(path)
  return ",".join(paths)


def behaviour_clone(wd: str, tok: str, vocab: int, s: dict, seed: int, init: str) -> dict:
  """BC of `init` (a Hugging Face folder; "": a fresh model) on `bc_data`; its export and time."""
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  c = agent_bc.get_config(s["preset"])
  c.seed, c.model.vocab_size, c.data.tokenizer = seed, vocab, tok
  c.data.pipeline.jsonl, c.data.eval_jsonl = s["bc_data"], _split(s["domain"], "validation")
  if s["bc_layout"]:
    c.data.pipeline.agent_layout = s["bc_layout"]
  c.train.update(dict(num_steps=s["bc_steps"], seq_len=s["bc_seq_len"], eval_every=s["bc_steps"],
                      progress=False, log_every=10))
  c.checkpoint.every = s["bc_steps"]
  c.init_from_hf, c.export_hf, c.export_hf_dir = init, True, os.path.join(wd, "hf")
  t0 = time.perf_counter()
  trained = trainer.train(c, wd)
  return {"hf": trained["export_hf"], "bc_s": time.perf_counter() - t0,
          "bc_loss": trained["losses"][-1]}


def wm_rl_data(s: dict) -> str:
  """The trajectories whose RL share is the warm-up's pool: the corpus's training split of every
  domain (or, on the tiny budget, of the agent's domain), as `data.pipeline.jsonl`."""
  from lwm_jax import domains as domains_lib  # pylint: disable=import-outside-toplevel
  domains = [s["domain"]] if s["wm_rl_domains"] == "domain" else list(domains_lib.bench_domains())
  return ",".join(os.path.join(ROOT, "data", "corpus", f"{d}_train.jsonl.gz") for d in domains)


def world_model_rl(wd: str, tok: str, vocab: int, s: dict, seed: int, init: str) -> dict:
  """The paper's warm-up: single-turn world-model RL of the policy model `init` (GSPO on
  next-observation prediction over the RL pool; configs/rl.py's demo rollouts and rewards, no
  judge on a CPU), through the trainer as launch/train.py runs it. Returns its export and time."""
  from configs import rl as rl_cfg  # pylint: disable=import-outside-toplevel
  from lwm_jax.rl import stage  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  c = rl_cfg.get_config("demo")
  c.model = agent_bc.get_config(s["preset"]).model  # the policy's own shape
  c.model.vocab_size = vocab
  c.seed, c.data.tokenizer, c.data.pipeline.jsonl = seed, tok, wm_rl_data(s)
  c.rl.max_new_tokens = s["wm_rl_max_new_tokens"]
  c.rl.eval_jsonl = ""
  per_update = c.rl.prompts_per_batch * c.rl.group_size // c.rl.updates_per_batch
  c.train.update(dict(num_steps=s["wm_rl_steps"], seq_len=s["seq_len"], batch_size=per_update,
                      eval_every=0, progress=False, log_every=1))
  c.checkpoint.every = s["wm_rl_steps"]
  c.optim.lr = s["wm_rl_lr"]
  c.init_from_hf, c.export_hf, c.export_hf_dir = init, True, os.path.join(wd, "hf")
  t0 = time.perf_counter()
  src = stage.rollout_source(c)
  trained = trainer.train(c, wd, source=src)
  return {"hf": trained["export_hf"], "wm_rl_s": time.perf_counter() - t0,
          "wm_rl_steps": s["wm_rl_steps"], "wm_rl_prompts": len(src.pool),
          "wm_rl_start": checkpoints.start_record(init), "wm_rl_settings": _settings(c)}


def _settings(c) -> dict:
  """A run's resolved config as plain JSON (what it actually ran with)."""
  return json.loads(c.to_json_best_effort())


def rl_config(s: dict, tok: str, vocab: int, seed: int, init: str, arm: str, wm: str):
  """The agent-RL config (configs/agent_rl.py) of one arm and seed from `init`."""
  c = agent_rl.get_config(s["preset"])
  a = c.agent
  a.domain, a.arm, a.world_model, a.workers = s["domain"], arm, wm, s["workers"]
  a.train_tasks, a.eval_tasks = s["train_tasks"], s["eval_tasks"]
  a.max_turns, a.max_new_tokens, a.wm_max_new_tokens = (s["max_turns"], s["max_new_tokens"],
                                                        s["wm_max_new_tokens"])
  a.wm_loop_guard = s.get("wm_loop_guard", "off")  # results written before it: no guard
  per_step = a.tasks_per_batch * c.rl.group_size // c.rl.updates_per_batch
  steps = max(1, s["episodes"] // per_step)
  c.seed, c.model.vocab_size, c.data.tokenizer, c.init_from_hf = seed, vocab, tok, init
  c.train.update(dict(num_steps=steps, seq_len=s["seq_len"], eval_every=s["eval_every"],
                      progress=False, log_every=1))
  c.checkpoint.every = steps
  c.optim.lr = s["rl_lr"]
  return c


def agent_rl_run(wd: str, c) -> dict:
  """The agent-rl stage through the trainer (what launch/train.py runs); the held-out curve."""
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  src = agent_stage.agent_source(c)
  try:
    trainer.train(c, wd, source=src)
  finally:
    for envs in {id(e): e for e in (src.envs, src.eval_envs)}.values():
      getattr(envs, "shutdown", lambda: None)()
  curve = [(h["episodes_trained"], h["success"]) for h in src.history]
  final = src.history[-1]
  return {"rl_s": time.perf_counter() - t0, "curve": curve, "success": final["success"],
          "credit": final["credit"], "tasks": int(final["tasks"]),
          "episodes": src.episodes_played, "rl_settings": _settings(c)}


def evaluate_checkpoint(hf: str, s: dict) -> dict:
  """Greedy held-out episodes of a checkpoint in the real environment."""
  from lwm_jax.sampling.sampler import Sampler  # pylint: disable=import-outside-toplevel
  from lwm_jax.rl.agent_episodes import AgentConfig  # pylint: disable=import-outside-toplevel
  sampler = Sampler.from_checkpoint(hf, decode_layout="model")
  envs = agent_stage.real_envs(s["domain"], s["workers"])
  cfg = AgentConfig(domain=s["domain"], tasks=(0,), seq_len=s["seq_len"],
                    max_turns=s["max_turns"], max_new_tokens=s["max_new_tokens"])
  try:
    m = evaluate_policy(sampler, envs, cfg, list(verify.task_seeds("heldout", s["eval_tasks"])))
  finally:
    getattr(envs, "shutdown", lambda: None)()
  eps = m.pop("_episodes")
  m["tasks"] = int(m["tasks"])
  m["examples"] = [{"seed": e.seed, "end": e.end, "turns": e.turns[:3], "reason": e.reason}
                   for e in eps[:2]]
  m["by_kind"] = success_by_kind(s["domain"], eps)
  if s["domain"] == "search":
    m["behaviour"] = search_behaviour(eps)
  return m


def _reset_to_each(domain: str, eps):
  """Yields (episode, one real env of `domain` reset to the episode's seed), then closes it."""
  from lwm_jax.envs import base  # pylint: disable=import-outside-toplevel
  env = base.make_env(domain)
  try:
    for e in eps:
      env.reset(e.seed)
      yield e, env
  finally:
    env.close()


def success_by_kind(domain: str, eps) -> dict[str, dict]:
  """Held-out success and mean credit per task kind of `domain` (the env's
  `episode_meta()["task_kind"]`; "-" for a domain that names none)."""
  out: dict[str, dict] = {}
  for e, env in _reset_to_each(domain, eps):
    kind = str(env.episode_meta().get("task_kind") or "-")
    k = out.setdefault(kind, {"tasks": 0, "success": 0, "credit": 0.0})
    k["tasks"] += 1
    k["success"] += int(e.success)
    k["credit"] += e.credit
  for k in out.values():
    k["credit"] = round(k["credit"] / k["tasks"], 3)
  return dict(sorted(out.items()))


_LISTED = re.compile(r"^\d+\. \[([^\]]+)\]", re.M)


def search_behaviour(eps) -> dict:
  """What the held-out search episodes show of the policy: the share of first actions that are a
  search whose words all come from the task text, of `open` actions naming a document an earlier
  result list showed, and of actions the environment could not parse."""
  from lwm_jax.envs.search import env as search  # pylint: disable=import-outside-toplevel
  def call(action: str) -> tuple[str, dict]:
    try:
      return search.parse_call(action)
    except ValueError:
      return "", {}
  first_ok, opens, opens_listed, actions, unparsed = 0, 0, 0, 0, 0
  for e, env in _reset_to_each("search", eps):
    task_words = set(re.findall(r"[a-z0-9_]+", env.describe().task.lower()))
    name, kw = call(e.turns[0][0]) if e.turns else ("", {})
    words = re.findall(r"[a-z0-9_]+", str(kw.get("query", "")).lower()) if name == "search" else []
    first_ok += bool(words) and set(words) <= task_words
    listed: set[str] = set()
    for action, obs in e.turns:
      actions += 1
      unparsed += obs.startswith("Error: cannot parse action")
      name, kw = call(action)
      if name == "open":
        opens += 1
        opens_listed += kw.get("doc_id") in listed
      listed |= set(_LISTED.findall(obs))
  n = max(len(eps), 1)
  return {"first_query_from_task": first_ok / n, "opens": opens,
          "open_of_listed_doc": opens_listed / max(opens, 1),
          "unparsed_actions": unparsed / max(actions, 1)}


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
  """Per arm: mean success over seeds with a 95% CI (t over seeds; Wilson over tasks for one)."""
  out = {}
  for arm, rs in runs.items():
    xs = [r["success"] for r in rs]
    mean = sum(xs) / len(xs)
    if len(xs) > 1:
      sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
      t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}.get(len(xs), 2.0)
      lo, hi, how = mean - t * sd / math.sqrt(len(xs)), mean + t * sd / math.sqrt(len(xs)), "seeds"
    else:
      n = rs[0]["tasks"]
      lo, hi = wilson(round(mean * n), n)
      how = f"Wilson over {n} tasks"
    wall = [r.get("bc_s", 0) + r.get("rl_s", 0) + r.get("wm_rl_s", 0)
            + (r.get("eval_s", 0) if arm == "bc" else 0) for r in rs]
    credit = sum(r["credit"] for r in rs) / len(rs)
    sets = [r.get("settings") or {} for r in rs]
    own = {k: sorted({str(x.get(k, "?")) for x in sets}) for k in ("episodes", "rl_lr",
                                                                    "eval_every")}
    zero = [r["zero_shot"]["success"] for r in rs if r.get("zero_shot")]
    out[arm] = {"zero_shot": sum(zero) / len(zero) if zero else None,
                "settings": {k: ",".join(v) for k, v in own.items()},
                "success": mean, "ci95": [max(0.0, lo), min(1.0, hi)], "ci_over": how,
                "credit": credit, "bc_seeds": sorted({r.get("bc_seed", r["seed"]) for r in rs}),
                "seeds": len(xs), "wall_s": sum(wall) / len(wall),
                "episodes": rs[0].get("episodes", 0)}
  return out


def write_report(out: str, own: dict, runs: dict, merged: dict, table: dict, meta: dict,
                 budget: str) -> None:
  """results.json (this run's `own` runs, the `merged` ones by folder, the table over `runs`, all
  of them), results.md (titled with meta["domain"] and the `budget` variant) and the PNG."""
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump({"meta": meta, "summary": table, "runs": own, "merged": merged}, f, indent=2,
              default=str)
  lines = [f"# Agent RL on {meta['domain']}: held-out success in the real environment", "",
           f"budget={budget}; held-out tasks={meta['eval_tasks']}; RL episodes per arm="
           f"{meta['episodes']}; world model: {meta['world_model']}", "",
           "| arm | success | 95% CI | CI over | mean credit | zero-shot | seeds | BC seeds | "
           "RL episodes | RL lr (runs) | eval every (runs) | wall-clock (s) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for arm, s in table.items():
    zs = f"{s['zero_shot']:.3f}" if s.get("zero_shot") is not None else "-"
    st = s.get("settings") or {}
    lines.append(f"| {arm} | {s['success']:.3f} | {s['ci95'][0]:.3f}-{s['ci95'][1]:.3f} | "
                 f"{s['ci_over']} | {s['credit']:.3f} | {zs} | {s['seeds']} | "
                 f"{','.join(map(str, s['bc_seeds']))} | {s['episodes']} | "
                 f"{st.get('rl_lr', '?')} | {st.get('eval_every', '?')} | {s['wall_s']:.0f} |")
  lines += ["", "Wall-clock per seed: bc = BC from the base and its evaluation (shared by real and "
            "sim); real / sim = their RL with its periodic held-out evaluations; warmup = its "
            "world-model RL and zero-shot evaluation plus its agent RL (zero-shot: held-out "
            "success after the world-model RL, before any agent RL); bc_from_wm = its own BC "
            "plus its RL. Compilation falls on the first arm that needs each shape. Learning "
            "rate and eval cadence are each run's own (from its record; '?' for runs recorded "
            "before issue 64).", f"Total: {meta['total_s']:.0f} s."]
  lines += ["", "| arm | seed | BC seed | success | mean credit |", "|---|---|---|---|---|"]
  lines += [f"| {arm} | {r['seed']} | {r.get('bc_seed', r['seed'])} | {r['success']:.3f} | "
            f"{r['credit']:.3f} |" for arm, rs in runs.items() for r in rs]
  lines.append("")
  for folder, arms in merged.items():
    lines.append(f"Merged from {folder}: " + "; ".join(
        f"{a} seeds {','.join(str(r['seed']) for r in rs)}" for a, rs in arms.items()))
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  plot(out, runs)


def plot(out: str, runs: dict) -> str:
  """success_vs_episodes.png: each RL arm's held-out success over its training episodes."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(6, 4))
  for arm, rs in runs.items():
    if arm == "bc":
      ax.axhline(sum(r["success"] for r in rs) / len(rs), ls="--", color="gray", label="BC only")
      continue
    pts: dict[float, list[float]] = {}
    for r in rs:
      for e, s in r["curve"]:
        pts.setdefault(e, []).append(s)
    xs = sorted(pts)
    ax.plot(xs, [sum(pts[x]) / len(pts[x]) for x in xs], marker="o", label=arm)
  ax.set_xlabel("training episodes")
  ax.set_ylabel("held-out success (real env)")
  ax.set_ylim(-0.02, 1.02)
  ax.legend()
  path = os.path.join(out, "success_vs_episodes.png")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def run(config: ml_collections.ConfigDict) -> dict:
  """The whole experiment of `config` (configs/agent_experiment.py): every setting is checked
  before `out` is touched. Returns results.json's contents."""
  s = recipe.settings(config, resolve)
  try:
    out = run_folder.prepare(s["out"], "--config.out", s["overwrite"])
  except ValueError as e:
    raise SystemExit(str(e)) from None
  t_all = time.perf_counter()
  arms = s["arms"]
  tok, vocab = "", 0
  if arms:  # (none: only a report of the `merge` folders)
    _banner("tokenizer")
    tok, vocab = tokenizer(out, s)
    s["bc_data"] = demonstrations(out, s)
  wm = s["world_model"]
  if not wm and {"sim", "bc_from_wm"} & set(arms):
    _banner("a tiny stand-in world model (SFT on the corpus)")
    wm = train_world_model(out, tok, vocab, s)
  runs: dict[str, list[dict]] = {a: [] for a in arms}
  starts: dict[tuple[str, int], dict] = {}  # (bc | bc_from_wm | wm_rl, BC seed) -> made once

  def save_so_far() -> None:
    """results.json with every run finished so far, so that an interrupted experiment keeps
    them (`merge` reads them, `bc_from` reuses their BC)."""
    with open(os.path.join(out, "results.json"), "w") as f:
      json.dump({"partial": True, "runs": runs}, f, indent=2, default=str)

  def start_of(arm: str, seed: int) -> dict:
    """The checkpoint an arm of `seed` starts from, made (or reused) once per BC seed: the BC
    from the base (bc), from the world model (bc_from_wm), or the BC after world-model RL
    (wm_rl, the warm-up)."""
    bc_seed = s["bc_seed"] if s["bc_seed"] >= 0 else seed
    if (arm, bc_seed) not in starts:
      if arm == "wm_rl":
        bc = start_of("bc", seed)
        _banner(f"seed {bc_seed}: warm-up, world-model RL of the policy model")
        r = world_model_rl(os.path.join(out, f"wm_rl_{bc_seed}"), tok, vocab, s, bc_seed,
                           bc["hf"])
        t0 = time.perf_counter()
        zero = evaluate_checkpoint(r["hf"], s)
        zero["eval_s"] = time.perf_counter() - t0
        print(f"warm-up, zero-shot (no agent training after the world-model RL): success "
              f"{zero['success']:.3f}", flush=True)
        starts[arm, bc_seed] = dict(r, bc_s=bc["bc_s"], bc_seed=bc_seed, zero_shot=zero,
                                    policy_start=checkpoints.start_record(bc["hf"]))
        return starts[arm, bc_seed]
      name, init = ("bc", s["base"]) if arm == "bc" else ("bc_warm", wm)
      _banner(f"seed {bc_seed}: BC from the {'base' if arm == 'bc' else 'world model'}")
      wd = os.path.join(out, f"{name}_{bc_seed}")
      rec = (reused_bc(s["bc_from"], wd, bc_seed, "bc" if arm == "bc" else "bc_from_wm")
             or behaviour_clone(wd, tok, vocab, s, bc_seed, init))
      starts[arm, bc_seed] = dict(rec, bc_seed=bc_seed, bc_start=checkpoints.start_record(init))
    return starts[arm, bc_seed]

  for seed in range(s["first_seed"], s["first_seed"] + s["seeds"]) if arms else ():
    # The BC from the base is made only for the arms that use it.
    bc = start_of("bc", seed) if {"bc", "real", "sim", "warmup"} & set(runs) else {}
    if "bc" in runs and all(r["seed"] != bc["bc_seed"] for r in runs["bc"]):  # once per BC
      t0 = time.perf_counter()
      m = evaluate_checkpoint(bc["hf"], s)
      m["eval_s"] = time.perf_counter() - t0  # with the checkpoint load and env start
      runs["bc"].append(dict(bc, **m, curve=[], seed=bc["bc_seed"], settings=budget_record(s)))
      save_so_far()
      print(f"BC only: success {m['success']:.3f} on {int(m['tasks'])} held-out tasks", flush=True)
    for arm in ("real", "sim", "warmup", "bc_from_wm"):
      if arm not in runs:
        continue
      start, env_arm, extra = bc, arm, {}
      if arm == "bc_from_wm":
        start = start_of("bc_from_wm", seed)
        env_arm, extra = s["warmup_rl"], {"bc_s": start["bc_s"]}
      elif arm == "warmup":
        start = start_of("wm_rl", seed)
        env_arm = s["warmup_rl"]
        extra = {k: start[k] for k in ("wm_rl_s", "wm_rl_steps", "wm_rl_prompts",
                                       "wm_rl_start", "wm_rl_settings", "zero_shot",
                                       "policy_start")}
      _banner(f"seed {seed}: agent RL, arm {arm} ({env_arm} episodes)")
      c = rl_config(s, tok, vocab, seed, start["hf"], env_arm, wm)
      r = agent_rl_run(os.path.join(out, f"{arm}_{seed}"), c)
      runs[arm].append(dict(r, **extra, seed=seed, bc_seed=start["bc_seed"],
                            start=checkpoints.start_record(start["hf"]),
                            world_model=(checkpoints.start_record(wm) if env_arm == "sim"
                                         else None),
                            settings=budget_record(s)))
      save_so_far()
      print(f"{arm}: success {r['success']:.3f} after {r['episodes']} episodes "
            f"({r['rl_s']:.0f} s)", flush=True)
  everything, merged = merged_runs(runs, s["merge"])
  table = summarize(everything)
  # A report of merged folders alone ran nothing: its budget is not any run's; each run's own
  # settings are in its record ("settings").
  meta = {"budget": budget(s) if arms else "(report only: see each run's settings)",
          "domain": s["domain"], "world_model": wm or "(none)",
          "world_model_sha256": (checkpoints.start_record(wm)["sha256"]
                                 if wm and os.path.exists(wm) else ""),
          "eval_tasks": s["eval_tasks"],
          # a report of merged folders alone: the RL episodes its runs had, not the budget's
          "episodes": s["episodes"] if arms else ",".join(sorted(
              {str(t["episodes"]) for a, t in table.items() if a != "bc"})),
          "total_s": time.perf_counter() - t_all}
  write_report(out, runs, everything, merged, table, meta, s["budget"])
  print(f"\nwrote {out}/results.md, results.json, success_vs_episodes.png "
        f"({meta['total_s']:.0f} s in all)")
  return {"meta": meta, "summary": table, "runs": runs, "merged": merged}
