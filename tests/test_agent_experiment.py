"""The agent experiment (lwm_jax/recipe/agent_experiment.py over configs/agent_experiment.py)
without training: its variants against the old budgets, bc_from copying an earlier run's BC
checkpoints with their recorded time, merging earlier runs, the report and the arms' order of
work on stand-ins."""
import json
import os

import pytest

from configs import ConfigError, agent_experiment as experiment_config
from lwm_jax.recipe import agent_experiment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "agent_experiment.py")


@pytest.fixture(scope="module")
def ae():
  return agent_experiment


def _config(budget="tiny", **over):
  """A variant of configs/agent_experiment.py with `over` set, as the command line sets it."""
  c = experiment_config.get_config(budget)
  c.update(over)
  return c


# launch/agent_experiment.py before issue 65: its BUDGETS dict, quoted ...
OLD_BUDGETS = {
    "tiny": dict(preset="tiny", vocab=1024, bc_steps=30, wm_steps=30, episodes=16, seeds=1,
                 eval_tasks=6, train_tasks=8, max_turns=3, max_new_tokens=32, seq_len=2048,
                 bc_seq_len=1024, bc_tasks=0,
                 wm_max_new_tokens=48, eval_every=1, rl_lr=1e-4,
                 wm_rl_steps=4, wm_rl_lr=1e-4, wm_rl_max_new_tokens=32, wm_rl_domains="domain"),
    "full": dict(preset="demo", vocab=2048, bc_steps=400, wm_steps=300, episodes=512, seeds=3,
                 eval_tasks=64, train_tasks=256, max_turns=6, max_new_tokens=48, seq_len=2048,
                 bc_seq_len=2048, bc_tasks=0,
                 wm_max_new_tokens=384, eval_every=8, rl_lr=3e-5,
                 wm_rl_steps=48, wm_rl_lr=1e-4, wm_rl_max_new_tokens=160, wm_rl_domains="all"),
}
# ... and the defaults of its flags that were not budget overrides (--budget defaulted to tiny;
# --out "" meant runs/agent_<budget>; the overrides' 0 / -1 meant "the budget's")
OLD_FLAG_DEFAULTS = dict(overwrite=False, domain="search", arms="bc,real,sim,warmup",
                         bc_layout="", world_model="", tokenizer="", base="", warmup_rl="real",
                         workers=2, bc_from="", first_seed=0, bc_seed=-1, merge="")


@pytest.mark.parametrize("variant", list(OLD_BUDGETS))
def test_each_variant_keeps_its_old_budget_and_flag_defaults(ae, variant):
  c = experiment_config.get_config(variant)
  old = dict(OLD_FLAG_DEFAULTS, **OLD_BUDGETS[variant], budget=variant,
             out=os.path.join(REPO, "runs", f"agent_{variant}"),
             wm_loop_guard="off")  # added since (issue 69): off, so runs go as before
  assert dict(c) == old
  for k, v in OLD_BUDGETS[variant].items():  # the same types: a record's JSON is unchanged
    assert type(c[k]) is type(v), k
  assert experiment_config.get_config().budget == "tiny"  # the old --budget default
  # (full's sim arm needs a world model folder: its other arms here)
  s = ae.resolve(c if variant == "tiny" else _config(variant, arms="bc,real"))
  assert s["arms"] == (["bc", "real", "sim", "warmup"] if variant == "tiny" else ["bc", "real"])
  assert s["merge"] == []
  # the record each run keeps under "settings": the old budget in its order, then the switches
  s["bc_data"] = "bc.jsonl.gz"
  got = ae.budget_record(s)
  assert list(got) == list(OLD_BUDGETS[variant]) + ["bc_data", "domain", "warmup_rl", "workers",
                                                    "bc_layout", "base"]
  assert got == dict(OLD_BUDGETS[variant], bc_data="bc.jsonl.gz", domain="search",
                     warmup_rl="real", workers=2, bc_layout="",
                     base={"path": "", "sha256": "", "note": "a fresh model (no start folder)"})
  assert ae.budget(s) == dict(OLD_BUDGETS[variant], bc_data="bc.jsonl.gz")


def test_a_bad_variant_field_or_value_is_named(ae, tmp_path):
  import configs
  with pytest.raises(ConfigError, match="no variant 'ful' \\(close matches: full\\); "
                                        "variants: tiny, full"):
    experiment_config.get_config("ful")
  with pytest.raises(ConfigError, match="--config.episodse: config has no field 'episodse' "
                                        "\\(close matches: episodes"):
    configs.check_command_line(["agent_experiment.py", f"--config={CONFIG}:full",
                                "--config.episodse=3"])
  with pytest.raises(ConfigError, match="--config.bc_stepz: config has no field"):
    configs.check_command_line(["agent_experiment.py", "--config.bc_stepz=3"], default=CONFIG)
  c = _config()
  c.episodse = 3                                         # a field added in Python, not on the CLI
  with pytest.raises(SystemExit, match="--config.episodse: configs/agent_experiment.py has no "
                                       "field 'episodse' \\(close matches: episodes"):
    ae.resolve(c)
  for over, says in ((dict(arms="bc,bogus"), "--config.arms: unknown arm\\(s\\) bogus"),
                     (dict(domain="nope"), "--config.domain=nope: no corpus"),
                     (dict(episodes=0), "--config.episodes must be >= 1, got 0"),
                     (dict(workers=-1), "--config.workers must not be negative"),
                     (dict(rl_lr=0.0), "--config.rl_lr must be > 0"),
                     (dict(warmup_rl="both"), "--config.warmup_rl='both' is not one of"),
                     (dict(base=str(tmp_path / "none")), "--config.base=.* is not a folder"),
                     (dict(merge=f"{tmp_path / 'none'}:bc"), "--config.merge: .* is not a folder")):
    with pytest.raises(SystemExit, match=says):
      ae.resolve(_config(**over))
  with pytest.raises(SystemExit, match="--config.world_model is required"):
    ae.resolve(_config("full", arms="sim"))
  assert ae.resolve(_config(arms="sim"))["arms"] == ["sim"]  # tiny trains a stand-in
  assert not (tmp_path / "none").exists()


def test_the_launcher_names_a_bad_field_in_one_line(tmp_path):
  """Also without --config, where config_flags would apply the overrides to the default config
  as it defines the flag."""
  import subprocess
  import sys
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "agent_experiment.py"),
                        f"--config.out={tmp_path / 'out'}", "--config.episodse=3"],
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
                       env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
  assert "--config.episodse: config has no field 'episodse' (close matches: episodes" in \
      run.stderr
  assert not (tmp_path / "out").exists()


def _earlier_run(root, warm: bool):
  for name in ("bc_0",) + (("bc_warm_0",) if warm else ()):
    os.makedirs(root / name / "hf")
    (root / name / "hf" / "config.json").write_text("{}")
  runs = {"bc": [{"bc_s": 1170.5, "bc_loss": 1.5}], "warmup": [{"bc_s": 900.0}] if warm else []}
  (root / "results.json").write_text(json.dumps({"runs": runs}))


def test_bc_from_copies_the_checkpoint_and_its_time(ae, tmp_path):
  _earlier_run(tmp_path / "old", warm=False)
  old = str(tmp_path / "old")
  got = ae.reused_bc(old, str(tmp_path / "new" / "bc_0"), 0, "bc")
  assert got == {"hf": str(tmp_path / "new" / "bc_0" / "hf"), "bc_s": 1170.5, "bc_loss": 1.5}
  assert (tmp_path / "new" / "bc_0" / "hf" / "config.json").exists()
  # no warm-up BC in the earlier run: the warm-up arm trains its own
  assert ae.reused_bc(old, str(tmp_path / "new" / "bc_warm_0"), 0, "bc_from_wm") is None
  with pytest.raises(SystemExit, match="has no bc run of seed 1"):
    ae.reused_bc(old, str(tmp_path / "new" / "bc_1"), 1, "bc")
  assert ae.reused_bc("", str(tmp_path / "other"), 0, "bc") is None  # bc_from="": train it


def test_search_behaviour_reads_copying_from_the_episodes(ae):
  from lwm_jax.envs import base, verify
  from lwm_jax.rl.agent_episodes import Episode
  seed = verify.task_seeds("heldout", 1)[0]
  env = base.make_env("search")
  try:
    env.reset(seed)
    word = max(env.describe().task.split(), key=len).strip('".,').lower()
  finally:
    env.close()
  good, bad = Episode(0, seed), Episode(1, seed)
  good.turns = [(f'search(query="{word}")', "Results 1-2 of 2\n\n1. [a.b] A\n2. [c.d] C"),
                ('open(doc_id="c.d")', "[c.d] page 1 of 1")]
  bad.turns = [('search(query="zzqx")', "No results"), ('open(doc_id="a.b")', "Error: no document"),
               ('open(doc_id="x', "Error: cannot parse action: unterminated string literal")]
  got = ae.search_behaviour([good, bad])
  assert got == {"first_query_from_task": 0.5, "opens": 2, "open_of_listed_doc": 0.5,
                 "unparsed_actions": 0.2}


def test_success_by_kind_groups_held_out_episodes_by_their_goal(ae):
  from lwm_jax.envs import base, verify
  from lwm_jax.rl.agent_episodes import Episode
  seeds = list(verify.task_seeds("heldout", 12))
  env = base.make_env("android")
  try:  # the kinds as the environment gives them, seed by seed
    kinds = []
    for s in seeds:
      env.reset(s)
      kinds.append(env.goal["kind"])
  finally:
    env.close()
  eps = []
  for i, s in enumerate(seeds):
    e = Episode(i, s)
    e.success, e.credit = i % 3 == 0, (1.0 if i % 3 == 0 else 0.5 * (i % 2))
    eps.append(e)
  got = ae.success_by_kind("android", eps)
  assert sorted(got) == sorted(set(kinds))
  for k, row in got.items():
    mine = [e for e, kk in zip(eps, kinds) if kk == k]
    assert row["tasks"] == len(mine)
    assert row["success"] == sum(e.success for e in mine)
    assert row["credit"] == pytest.approx(sum(e.credit for e in mine) / len(mine), abs=1e-3)


def test_merge_joins_earlier_seeds_and_refuses_a_seed_twice(ae, tmp_path):
  old = tmp_path / "old"
  os.makedirs(old)
  # written before runs carried "seed": list position is the seed
  (old / "results.json").write_text(json.dumps({"runs": {
      "bc": [{"success": 0.25, "tasks": 64, "credit": 0.3, "bc_s": 10.0, "eval_s": 2.0}],
      "real": [{"success": 0.125, "tasks": 64, "credit": 0.2, "rl_s": 5.0, "curve": [[0, 0.25]],
                "episodes": 8}]}}))
  new = {"real": [{"success": 0.375, "tasks": 64, "credit": 0.4, "rl_s": 7.0, "curve": [],
                   "episodes": 8, "seed": 2, "bc_seed": 0},
                  {"success": 0.25, "tasks": 64, "credit": 0.3, "rl_s": 6.0, "curve": [],
                   "episodes": 8, "seed": 1, "bc_seed": 0}]}
  got, taken = ae.merged_runs(new, [str(old)])
  assert [r["seed"] for r in got["real"]] == [0, 1, 2]
  assert [r["seed"] for r in got["bc"]] == [0]
  assert sorted(taken[str(old)]) == ["bc", "real"]
  only_bc, taken = ae.merged_runs(new, [f"{old}:bc"])  # the earlier run's BC only
  assert [r["seed"] for r in only_bc["real"]] == [1, 2] and list(taken[str(old)]) == ["bc"]
  with pytest.raises(SystemExit, match=r"has no runs of \['sim'\]"):
    ae.merged_runs(new, [f"{old}:bc+sim"])
  table = ae.summarize(got)
  assert table["real"]["seeds"] == 3 and table["real"]["success"] == pytest.approx(0.25)
  assert table["real"]["ci_over"] == "seeds" and table["real"]["bc_seeds"] == [0]
  sd = 0.125  # sample sd of 0.125, 0.25, 0.375
  assert table["real"]["ci95"][1] == pytest.approx(0.25 + 4.303 * sd / 3 ** 0.5)
  assert table["bc"]["ci_over"] == "Wilson over 64 tasks"
  with pytest.raises(SystemExit, match="real seed 0 is in both"):
    ae.merged_runs({"real": [dict(new["real"][0], seed=0)]}, [str(old)])
  with pytest.raises(SystemExit, match="cannot read the runs of"):
    ae.merged_runs({}, [str(tmp_path / "missing")])
  ae.write_report(str(tmp_path), new, got, taken, table,
                  {"domain": "android", "eval_tasks": 64, "episodes": 8, "world_model": "wm",
                   "total_s": 1.0}, "tiny")
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["runs"] == new and saved["merged"] == {str(old): {"bc": got["bc"]}}
  md = (tmp_path / "results.md").read_text()
  assert "| real | 2 | 0 | 0.375 | 0.400 |" in md and f"Merged from {old}: bc seeds 0" in md
  assert md.startswith("# Agent RL on android:") and "budget=tiny;" in md
  assert (tmp_path / "success_vs_episodes.png").stat().st_size > 0


def test_merge_reads_what_a_report_folder_had_merged(ae, tmp_path):
  """A folder written with --merge holds the runs it merged under "merged": merging that folder
  again brings them too, and merging it beside its own source takes each run once."""
  src, rep = tmp_path / "src", tmp_path / "report"
  os.makedirs(src)
  os.makedirs(rep)
  bc = {"success": 0.25, "tasks": 64, "credit": 0.3, "bc_s": 10.0, "eval_s": 2.0, "seed": 0}
  real = {"success": 0.125, "tasks": 64, "credit": 0.2, "rl_s": 5.0, "curve": [], "episodes": 8,
          "seed": 0, "bc_seed": 0}
  sim = dict(real, success=0.5, rl_s=9.0)
  (src / "results.json").write_text(json.dumps({"runs": {"bc": [bc], "real": [real]}}))
  (rep / "results.json").write_text(json.dumps({"runs": {"sim": [sim]},
                                                "merged": {str(src): {"bc": [bc], "real": [real]}}}))
  got, taken = ae.merged_runs({}, [str(rep)])
  assert {a: [r["success"] for r in rs] for a, rs in got.items()} == {
      "sim": [0.5], "bc": [0.25], "real": [0.125]}
  both, _ = ae.merged_runs({}, [str(rep), str(src)])  # the same records: each counted once
  assert both == got
  clash = dict(real, success=0.375)  # another run under the same seed is still refused
  (src / "results.json").write_text(json.dumps({"runs": {"real": [clash]}}))
  with pytest.raises(SystemExit, match="real seed 0 is in both"):
    ae.merged_runs({}, [str(rep), str(src)])


def test_a_bc_from_wm_only_run_trains_no_bc_from_the_base(ae, tmp_path, monkeypatch):
  """--arms=bc_from_wm (the arm called warm-up before issue 64) needs only the BC from the world
  model: the BC from the base is not made."""
  made, rl = [], []
  monkeypatch.setattr(ae, "tokenizer", lambda out, b: ("tok.model", 64))
  monkeypatch.setattr(ae, "demonstrations", lambda out, b: "bc.jsonl.gz")

  def clone(wd, tok, vocab, b, seed, init):
    made.append((os.path.basename(wd), init))
    return {"hf": os.path.join(wd, "hf"), "bc_s": 1.0, "bc_loss": 0.5}

  def run(wd, c):
    rl.append(os.path.basename(wd))
    return {"success": 0.25, "tasks": 4, "credit": 0.3, "rl_s": 2.0, "curve": [],
            "episodes": 8}

  monkeypatch.setattr(ae, "behaviour_clone", clone)
  monkeypatch.setattr(ae, "rl_config", lambda *a: None)
  monkeypatch.setattr(ae, "agent_rl_run", run)
  monkeypatch.setattr(ae, "evaluate_checkpoint", lambda hf, b: pytest.fail("BC evaluated"))
  monkeypatch.chdir(tmp_path)
  os.mkdir("wm_dir")
  ae.run(_config(arms="bc_from_wm", seeds=2, bc_seed=0, world_model="wm_dir",
                 out=str(tmp_path / "out")))
  assert made == [("bc_warm_0", "wm_dir")]  # one BC from the world model, shared
  assert rl == ["bc_from_wm_0", "bc_from_wm_1"]
  saved = json.loads((tmp_path / "out" / "results.json").read_text())
  assert [r["bc_seed"] for r in saved["runs"]["bc_from_wm"]] == [0, 0]


def test_the_warmup_arm_is_the_papers_protocol(ae, tmp_path, monkeypatch):
  """--arms=warmup: the policy model (BC from the base) -> world-model GSPO -> zero-shot agent
  evaluation of that model -> agent RL from it -> evaluation; each record names the sha256 of the
  folders it started from and its own settings."""
  calls = []
  monkeypatch.setattr(ae, "tokenizer", lambda out, b: ("tok.model", 64))
  monkeypatch.setattr(ae, "demonstrations", lambda out, b: "bc.jsonl.gz")

  def folder(path):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
      f.write(path)
    return path

  def clone(wd, tok, vocab, b, seed, init):
    calls.append(("bc", os.path.basename(wd), init))
    return {"hf": folder(os.path.join(wd, "hf")), "bc_s": 1.0, "bc_loss": 0.5}

  def wm_rl(wd, tok, vocab, b, seed, init):
    calls.append(("wm_rl", os.path.basename(wd), init))
    return {"hf": folder(os.path.join(wd, "hf")), "wm_rl_s": 3.0, "wm_rl_steps": b["wm_rl_steps"],
            "wm_rl_prompts": 7, "wm_rl_start": {"path": init, "sha256": "x"},
            "wm_rl_settings": {"stage": "rl"}}

  def evaluate(hf, b):
    calls.append(("eval", hf))
    return {"success": 0.5, "tasks": 4, "credit": 0.6}

  def rl_cfg(b, tok, vocab, seed, init, arm, wm):
    calls.append(("agent_rl_from", init, arm))
    return init

  def run(wd, c):
    calls.append(("agent_rl", os.path.basename(wd)))
    return {"success": 0.75, "tasks": 4, "credit": 0.8, "rl_s": 2.0, "curve": [[0, 0.5]],
            "episodes": 8, "rl_settings": {"optim": {"lr": 1e-4}}}

  monkeypatch.setattr(ae, "behaviour_clone", clone)
  monkeypatch.setattr(ae, "world_model_rl", wm_rl)
  monkeypatch.setattr(ae, "evaluate_checkpoint", evaluate)
  monkeypatch.setattr(ae, "rl_config", rl_cfg)
  monkeypatch.setattr(ae, "agent_rl_run", run)
  out = tmp_path / "out"
  ae.run(_config(arms="warmup", seeds=1, wm_rl_steps=3, rl_lr=0.0002, out=str(out)))
  bc_hf, wm_hf = str(out / "bc_0" / "hf"), str(out / "wm_rl_0" / "hf")
  assert calls == [("bc", "bc_0", ""), ("wm_rl", "wm_rl_0", bc_hf), ("eval", wm_hf),
                   ("agent_rl_from", wm_hf, "real"), ("agent_rl", "warmup_0")]
  saved = json.loads((out / "results.json").read_text())
  r = saved["runs"]["warmup"][0]
  assert r["zero_shot"]["success"] == 0.5 and r["success"] == 0.75
  from lwm_jax.checkpoints import folder_sha256
  assert r["start"] == {"path": wm_hf, "sha256": folder_sha256(wm_hf)}
  assert r["policy_start"]["sha256"] == folder_sha256(bc_hf)
  assert r["settings"]["wm_rl_steps"] == 3 and r["settings"]["rl_lr"] == 0.0002
  assert saved["summary"]["warmup"]["zero_shot"] == 0.5
  assert saved["summary"]["warmup"]["settings"]["rl_lr"] == "0.0002"
  assert "| warmup | 0.750 |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_the_warmup_pipeline_runs_end_to_end_on_a_tiny_model(ae, tmp_path):
  """The warm-up arm for real on the tiny budget, shrunk: tokenizer, BC, world-model GSPO on the
  RL pool, zero-shot evaluation, agent RL, evaluation (16 minutes on 2 busy cores, most of it
  compiling)."""
  out = tmp_path / "out"
  ae.run(_config("tiny", arms="warmup", bc_steps=2, wm_rl_steps=2, episodes=4, eval_tasks=2,
                 eval_every=4, workers=0, out=str(out)))
  r = json.loads((out / "results.json").read_text())["runs"]["warmup"][0]
  # one rollout of 2 tasks x 4 episodes feeds the 4 updates of the (at least) 4-episode budget
  assert r["wm_rl_steps"] == 2 and r["wm_rl_prompts"] > 0 and r["episodes"] == 8
  assert 0 <= r["zero_shot"]["success"] <= 1 and 0 <= r["success"] <= 1
  assert len(r["start"]["sha256"]) == 64 and r["start"]["path"].endswith("wm_rl_0/hf")
  assert r["wm_rl_settings"]["stage"] == "rl" and r["rl_settings"]["stage"] == "agent-rl"


def test_an_interrupted_run_keeps_its_bc_for_bc_from(ae, tmp_path, monkeypatch):
  """A run stopped in its first RL arm has already written the BC's record (results.json,
  partial), so a later run's `bc_from` reuses that BC instead of training it again."""
  monkeypatch.setattr(ae, "tokenizer", lambda out, b: ("tok.model", 64))
  monkeypatch.setattr(ae, "demonstrations", lambda out, b: "bc.jsonl.gz")
  trained = []

  def clone(wd, tok, vocab, b, seed, init):
    trained.append(os.path.basename(wd))
    os.makedirs(os.path.join(wd, "hf"))
    return {"hf": os.path.join(wd, "hf"), "bc_s": 42.0, "bc_loss": 0.5}

  def stop(wd, c):
    raise KeyboardInterrupt  # the first RL arm never ends

  monkeypatch.setattr(ae, "behaviour_clone", clone)
  monkeypatch.setattr(ae, "evaluate_checkpoint",
                      lambda hf, b: {"success": 0.25, "tasks": 4, "credit": 0.3})
  monkeypatch.setattr(ae, "rl_config", lambda *a: None)
  monkeypatch.setattr(ae, "agent_rl_run", stop)
  first = tmp_path / "first"
  with pytest.raises(KeyboardInterrupt):
    ae.run(_config(arms="bc,real", seeds=1, out=str(first)))
  saved = json.loads((first / "results.json").read_text())
  assert saved["partial"] and saved["runs"]["bc"][0]["bc_s"] == 42.0
  monkeypatch.setattr(ae, "agent_rl_run", lambda wd, c: {
      "success": 0.5, "tasks": 4, "credit": 0.6, "rl_s": 2.0, "curve": [], "episodes": 8})
  ae.run(_config(arms="bc,real", seeds=1, bc_from=str(first), out=str(tmp_path / "second")))
  assert trained == ["bc_0"]  # the second run copied it
  again = json.loads((tmp_path / "second" / "results.json").read_text())
  assert again["runs"]["bc"][0]["bc_s"] == 42.0 and again["runs"]["real"][0]["success"] == 0.5
