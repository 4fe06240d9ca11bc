"""The recipe's plumbing (lwm_jax/recipe/reproduce.py over configs/reproduce.py), without
training: budgets and overrides, the runs an ablation adds, each run's config, and the simulated
episode (lwm_jax/eval/episodes.py) on a stand-in model."""
import os
import types

import pytest

from configs import ConfigError, reproduce as reproduce_config, stages as config_stages
from lwm_jax.data import corpus as corpus_lib
from lwm_jax.data.schema import Trajectory, Turn
from lwm_jax.eval import episodes as episodes_lib
from lwm_jax.recipe import reproduce
from lwm_jax.sampling.params import Generation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "reproduce.py")


@pytest.fixture(scope="module")
def rp():
  return reproduce


def _resolve(budget="full", **over):
  """The settings of a variant of configs/reproduce.py with `over` set, as a run checks them."""
  c = reproduce_config.get_config(budget)
  c.update(over)
  return reproduce.resolve(c)


@pytest.fixture
def parsed():
  """The settings a command line of launch/reproduce.py gives (its --config flag, parsed the way
  absl parses it, on a registry of its own)."""
  from absl import flags
  from ml_collections import config_flags

  def parse(*args):
    argv, fv = ["reproduce.py", *args], flags.FlagValues()
    # the override flags (--config.FIELD) are defined from the command line it is given
    config_flags.DEFINE_config_file("config", CONFIG, "", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    fv(argv)
    return reproduce.resolve(fv.config)
  return parse


def test_tiny_budget_and_overrides_from_the_command_line(rp, parsed):
  s = parsed(f"--config={CONFIG}:tiny")
  tiny = reproduce_config.get_config("tiny")
  assert (s.preset, s.vocab, s.seq_len, s.batch, s.cpt_steps, s.sft_steps) == (
      tiny["preset"], tiny["vocab"], tiny["seq_len"], tiny["batch"], tiny["cpt_steps"],
      tiny["sft_steps"])
  assert s.fast_compile and not s.validate and s.ablations == () and not s.rl
  assert s.knowledge == ("search", "actions") and s.knowledge_share == tiny["knowledge_share"]
  s = parsed(f"--config={CONFIG}:tiny", "--config.cpt_steps=3", "--config.seq_len=256",
             "--config.masking=full", "--config.thinking=off", "--config.ablations=thinking",
             "--config.knowledge=search", "--config.knowledge_share=0.25",
             "--config.eval_max_turns=0")
  assert (s.cpt_steps, s.seq_len, s.sft_steps) == (3, 256, tiny["sft_steps"])
  assert (s.masking, s.thinking, s.ablations) == ("full", "off", ("thinking",))
  assert (s.knowledge, s.knowledge_share, s.eval_max_turns) == (("search",), 0.25, 0)
  assert parsed(f"--config={CONFIG}:tiny", "--config.knowledge=").knowledge_share == 0.0
  full = parsed()
  # the full budget spends its hour on the main pipeline; the ablations have their own budget
  assert full.budget == "full" and full.ablations == () and full.validate
  assert (full.seq_len, full.sft_seq_len, rp.context(full)) == (2048, 1024, 2048)
  assert full.cpt_steps == reproduce_config.get_config("full").cpt_steps
  assert parsed(f"--config={CONFIG}:ablation").ablations == ("masking", "thinking")


def test_each_budget_has_its_thinking_default(rp):
  """`full` trains SFT without the thinking block (measured the better at that budget); the flag
  overrides it, and the other budgets keep thinking mode."""
  assert _resolve("full").thinking == "off"
  assert _resolve("full", thinking="on").thinking == "on"
  assert _resolve("tiny").thinking == "on"
  assert [r.name for r in rp.plan(_resolve("full"))] == ["cpt_it", "sft_it_nothink"]


def test_bad_values_are_refused_by_name(rp):
  with pytest.raises(ValueError, match="--config.ablations: 'rl' is not one of masking, thinking, "
                                       "sft_loss"):
    _resolve("tiny", ablations="masking,rl")
  with pytest.raises(ValueError, match="--config.knowledge: 'web'"):
    _resolve("tiny", knowledge="web")
  with pytest.raises(ValueError, match=r"--config.knowledge_share must be in \[0, 1\)"):
    _resolve("tiny", knowledge="search", knowledge_share=1.5)
  with pytest.raises(ValueError, match="--config.cpt_steps must be >= 1"):
    _resolve("tiny", cpt_steps=0)


# launch/reproduce.py at 116651c, before its budgets became configs/reproduce.py: BUDGETS, the
# defaults of its flags for what no budget set, and the fields of its resolved settings. The
# variants keep every value, and plan.json keeps its fields.
OLD_BUDGETS = {
    "tiny": dict(preset="tiny", vocab=1024, seq_len=512, batch=4, cpt_steps=8, sft_steps=4,
                 knowledge_share=0.1, ablations="", eval_max_turns=1, eval_max_new_tokens=16,
                 eval_batch=8, rl_steps=4, validate=False, fast_compile=True),
    "full": dict(preset="demo", vocab=2048, seq_len=2048, batch=4, sft_seq_len=1024, sft_batch=8,
                 cpt_steps=1600, sft_steps=300, knowledge_share=0.1, ablations="", thinking="off",
                 eval_max_turns=20, eval_max_new_tokens=320, eval_batch=32, rl_steps=24,
                 validate=True, fast_compile=False),
    "ablation": dict(preset="demo", vocab=2048, seq_len=2048, batch=4, sft_seq_len=1024,
                     sft_batch=8, cpt_steps=200, sft_steps=60, knowledge_share=0.1,
                     ablations="masking,thinking", eval_max_turns=10, eval_max_new_tokens=320,
                     eval_batch=32, rl_steps=24, validate=True, fast_compile=False),
}
OLD_DEFAULTS = dict(thinking="on", sft_loss="target", masking="it", knowledge="search,actions",
                    cpt_lr=0.0, sft_lr=0.0, rl=False, seed=0, cpt_from="", more_worlds="",
                    drill_share=0.0, drill_rows="64")
OLD_SETTINGS_FIELDS = (
    "budget", "preset", "vocab", "seq_len", "batch", "sft_seq_len", "sft_batch", "cpt_steps",
    "sft_steps", "masking", "thinking", "knowledge", "knowledge_share", "ablations", "rl",
    "rl_steps", "eval_max_turns", "eval_max_new_tokens", "eval_batch", "cpt_lr", "sft_lr",
    "sft_loss", "validate", "fast_compile", "seed", "cpt_from", "more_worlds", "drill_share",
    "drill_rows")


@pytest.mark.parametrize("variant", list(OLD_BUDGETS))
def test_each_variant_keeps_its_old_budget(rp, variant):
  old = dict(OLD_DEFAULTS, budget=variant, **OLD_BUDGETS[variant])
  old.setdefault("sft_seq_len", old["seq_len"])         # the old default: the CPT rows
  old.setdefault("sft_batch", old["batch"])
  old["knowledge"] = tuple(old["knowledge"].split(","))
  old["ablations"] = tuple(a for a in old["ablations"].split(",") if a)
  got = rp.settings(_resolve(variant))
  assert sorted(got) == sorted(OLD_SETTINGS_FIELDS)
  assert got == old
  c = reproduce_config.get_config(variant)               # where the run reads and writes
  assert (c.workdir, c.corpus) == (os.path.join(REPO, "runs", "reproduce"),
                                   os.path.join(REPO, "data", "corpus"))
  assert (c.overwrite, c.reuse_from, c.ship) == (False, "", "")
  assert set(c) == set(OLD_SETTINGS_FIELDS) | set(reproduce_config.RUN_FIELDS)
  assert reproduce_config.get_config().budget == "full"  # the old --budget default


def test_the_long_variant_is_the_recipe_of_the_shipped_long_model(rp):
  """`make world-model-long` (configs/reproduce.py:long) trains what data/world_model_long's
  provenance says it was trained with, field by field (its command line set them by hand)."""
  import json  # pylint: disable=import-outside-toplevel
  with open(os.path.join(REPO, "data", "world_model_long", "provenance.json")) as f:
    shipped = json.load(f)["settings"]
  got = json.loads(json.dumps(rp.settings(_resolve("long"))))   # tuples as the JSON's lists
  # the start folder, absolute in both, was the checkout's data/world_model in both
  assert os.path.relpath(got.pop("cpt_from"), REPO) == os.path.join("data", "world_model")
  assert shipped.pop("cpt_from").endswith(os.path.join("", "data", "world_model"))
  assert set(got) == set(shipped)
  assert {k: got[k] for k in got if got[k] != shipped[k]} == {"budget": "long"}
  with open(os.path.join(REPO, "data", "world_model_long", "config.json")) as f:
    assert json.load(f)["max_position_embeddings"] == got["seq_len"] == 4608


def test_a_bad_variant_or_field_is_named(rp):
  import configs
  with pytest.raises(ConfigError, match="no variant 'tinyy' \\(close matches: tiny\\); "
                                        "variants: tiny, full, ablation"):
    reproduce_config.get_config("tinyy")
  with pytest.raises(ConfigError, match="no variant 'huge'.*variants: tiny, full, ablation"):
    configs.load(f"{CONFIG}:huge")
  with pytest.raises(ConfigError, match="--config.cpt_stpes: config has no field 'cpt_stpes' "
                                        "\\(close matches: cpt_steps"):
    configs.check_command_line(["reproduce.py", f"--config={CONFIG}:tiny",
                                "--config.cpt_stpes=3"])
  c = reproduce_config.get_config("tiny")
  c.cpt_stpes = 3                                        # a field added in Python, not on the CLI
  with pytest.raises(ValueError, match="--config.cpt_stpes: configs/reproduce.py has no field "
                                       "'cpt_stpes' \\(close matches: cpt_steps"):
    rp.resolve(c)


def test_the_launcher_names_a_bad_field_in_one_line(tmp_path):
  import subprocess
  import sys
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "reproduce.py"),
                        f"--config={CONFIG}:tiny", f"--config.workdir={tmp_path / 'wd'}",
                        "--config.sft_stepz=3", "--plan_only"],
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
                       env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
  assert "--config.sft_stepz: config has no field 'sft_stepz' (close matches: sft_steps" in \
      run.stderr
  assert not (tmp_path / "wd").exists()


def _names(runs):
  return [(r.name, r.stage, r.init_from, r.main) for r in runs]


def test_plan_main_pipeline_and_ablations(rp):
  s = _resolve("tiny", knowledge="search,actions")
  assert _names(rp.plan(s)) == [("cpt_it", "cpt", "", True),
                                ("sft_it_think", "sft", "cpt_it", True)]
  s = _resolve("tiny", ablations="masking,thinking", knowledge="")
  runs = rp.plan(s)
  assert _names(runs) == [("cpt_it", "cpt", "", True), ("sft_it_think", "sft", "cpt_it", True),
                          ("cpt_full", "cpt", "", False),
                          ("sft_full_think", "sft", "cpt_full", False),
                          ("sft_it_nothink", "sft", "cpt_it", False)]
  assert rp.ablation_pairs(s, runs) == [
      ("masking (CPT model)", "cpt_it", "cpt_full"),
      ("masking (after SFT)", "sft_it_think", "sft_full_think"),
      ("thinking (SFT)", "sft_it_think", "sft_it_nothink")]
  # the flags choose the main pipeline; an ablation trains the other setting
  s = _resolve("tiny", masking="full", thinking="off", ablations="masking,thinking")
  runs = rp.plan(s)
  assert [r.name for r in runs] == ["cpt_full", "sft_full_nothink", "cpt_it", "sft_it_nothink",
                                    "sft_full_think"]
  assert rp.ablation_pairs(s, runs)[-1] == ("thinking (SFT)", "sft_full_nothink",
                                            "sft_full_think")
  s = _resolve("tiny", rl=True)
  assert _names(rp.plan(s))[-1] == ("rl_sft_it_think", "rl", "sft_it_think", True)


def test_sft_loss_switch_and_its_ablation(rp, tmp_path):
  s = _resolve("tiny", thinking="off", sft_loss="history", ablations="sft_loss,thinking",
               knowledge="")
  runs = rp.plan(s)
  assert _names(runs) == [("cpt_it", "cpt", "", True),
                          ("sft_it_nothink_hist", "sft", "cpt_it", True),
                          ("sft_it_think", "sft", "cpt_it", False),   # thinking: target only
                          ("sft_it_nothink", "sft", "cpt_it", False)]
  assert rp.ablation_pairs(s, runs) == [
      ("thinking (SFT)", "sft_it_nothink_hist", "sft_it_think"),
      ("SFT loss on the history too (SFT)", "sft_it_nothink_hist", "sft_it_nothink")]
  corpus = corpus_lib.Corpus("c", ["a_train.jsonl.gz"], ["a_validation.jsonl.gz"], [], [], [])
  cfg = {r.name: rp.run_config(r, s, str(tmp_path), "tok.model", 1024, corpus, "", True)
         for r in runs}
  assert cfg["sft_it_nothink_hist"].data.pipeline.sft_history_loss
  assert not cfg["sft_it_nothink"].data.pipeline.sft_history_loss
  assert not cfg["sft_it_think"].data.pipeline.sft_history_loss
  assert not cfg["cpt_it"].data.pipeline.get("sft_history_loss")
  assert _resolve("tiny").sft_loss == "target"
  with pytest.raises(ValueError, match="--config.sft_loss=history and the sft_loss ablation "
                                       "need --config.thinking=off"):
    _resolve("tiny", thinking="on", sft_loss="history")
  with pytest.raises(ValueError, match="need --config.thinking=off"):
    _resolve("tiny", thinking="on", ablations="sft_loss")
  with pytest.raises(ValueError, match="--config.sft_loss: 'all' is not target or history"):
    _resolve("tiny", thinking="off", sft_loss="all")


def test_run_configs_carry_the_switches(rp, tmp_path):
  corpus = corpus_lib.Corpus("c", ["a_train.jsonl.gz", "b_train.jsonl.gz"], ["a_validation.jsonl.gz"],
                         [], [], [])
  s = _resolve("tiny", ablations="masking,thinking", cpt_steps=5, sft_steps=3,
               knowledge="search")
  runs = {r.name: r for r in rp.plan(s)}
  wd = str(tmp_path)
  exports = {r.init_from for r in runs.values() if r.init_from}
  cfg = {n: rp.run_config(r, s, wd, "tok.model", 1024, corpus, "k.jsonl", n in exports)
         for n, r in runs.items()}
  it, full = cfg["cpt_it"], cfg["cpt_full"]
  assert it.data.pipeline.loss_masking and not full.data.pipeline.loss_masking
  assert it.data.pipeline.knowledge_jsonl == "k.jsonl" and it.data.pipeline.knowledge_share == 0.1
  assert it.train.num_steps == full.train.num_steps == 5       # equal compute
  assert (it.train.batch_size, it.train.seq_len) == (s.batch, s.seq_len)
  assert it.model.vocab_size == 1024 and it.model_preset == "tiny"
  assert it.data.pipeline.jsonl == "a_train.jsonl.gz,b_train.jsonl.gz"
  assert it.export_hf and full.export_hf and not cfg["sft_it_think"].export_hf
  think, nothink = cfg["sft_it_think"], cfg["sft_it_nothink"]
  assert think.data.pipeline.thinking and not nothink.data.pipeline.thinking
  assert think.init_from_hf == nothink.init_from_hf == os.path.join(wd, "cpt_it", "hf")
  assert cfg["sft_full_think"].init_from_hf == os.path.join(wd, "cpt_full", "hf")
  assert think.train.num_steps == nothink.train.num_steps == 3
  assert think.data.pipeline.knowledge_jsonl == ""              # knowledge text is CPT only
  assert it.train.eval_every == 0                               # tiny skips validation
  lr = _resolve("tiny", knowledge="", sft_lr=3e-4)
  c_lr = {r.stage: rp.run_config(r, lr, wd, "tok.model", 1024, corpus, "", True)
          for r in rp.plan(lr)}
  assert c_lr["sft"].optim.lr == 3e-4 and c_lr["cpt"].optim.lr == it.optim.lr
  assert think.optim.lr == config_stages.STAGE_CONFIGS["sft"].get_config("tiny").optim.lr
  with pytest.raises(ValueError, match="sft_lr"):
    _resolve("tiny", sft_lr=-1.0)
  lr = _resolve("tiny", knowledge="", cpt_lr=4e-3)
  c_lr = {r.stage: rp.run_config(r, lr, wd, "tok.model", 1024, corpus, "", True)
          for r in rp.plan(lr)}
  assert c_lr["cpt"].optim.lr == 4e-3 and c_lr["sft"].optim.lr == think.optim.lr
  with pytest.raises(ValueError, match="cpt_lr"):
    _resolve("tiny", cpt_lr=-1.0)


def test_sft_rows_and_the_models_context(rp):
  """SFT may train on other rows than CPT; every model's context is the longest row of the
  pipeline, so a sampler never feeds positions no row had and SFT keeps CPT's reach."""
  corpus = corpus_lib.Corpus("c", ["a_train.jsonl.gz"], ["a_validation.jsonl.gz"], [], [], [])
  s = _resolve("tiny", seq_len=1024, batch=2, sft_seq_len=512, sft_batch=8, knowledge="")
  assert rp.context(s) == 1024
  cpt, sft = (rp.run_config(r, s, "/w", "tok.model", 1024, corpus, "", True) for r in rp.plan(s))
  assert (cpt.train.batch_size, cpt.train.seq_len) == (2, 1024)
  assert (sft.train.batch_size, sft.train.seq_len) == (8, 512)
  assert cpt.model.max_position_embeddings == sft.model.max_position_embeddings == 1024
  rl = _resolve("tiny", seq_len=1024, sft_seq_len=512, knowledge="", rl=True)
  gspo = rp.run_config(rp.plan(rl)[-1], rl, "/w", "tok.model", 1024, corpus, "", True)
  # GSPO prompts come from the validation split, which CPT and SFT never saw
  assert gspo.data.pipeline.jsonl == "a_validation.jsonl.gz" and gspo.rl.pool_fractions == "rl=1.0"
  assert gspo.train.seq_len == gspo.model.max_position_embeddings == 1024
  same = _resolve("tiny", knowledge="")
  assert (same.sft_seq_len, same.sft_batch) == (same.seq_len, same.batch)


def test_reuse_copies_only_equal_runs(rp, tmp_path, capsys):
  """--reuse_from copies a run of an earlier folder only when its config, with the folder's own path
  written out, equals this plan's and its starting point is copied too; another corpus or
  tokenizer setting is refused."""
  import json
  corpus = corpus_lib.Corpus("c", ["a_train.jsonl.gz"], ["a_validation.jsonl.gz"], [], [], [])
  old, new = str(tmp_path / "old"), str(tmp_path / "new")

  def configs(wd, **over):
    s = _resolve("tiny", knowledge="search", **over)
    runs = rp.plan(s)
    return s, runs, {r.name: rp.run_config(r, s, wd, os.path.join(wd, "tokenizer.model"), 1024,
                                           corpus, os.path.join(wd, "knowledge.jsonl.gz"), True)
                     for r in runs}

  s_old, _, c_old = configs(old)
  header = lambda s, sha="abc": {"corpus": {"sha256": sha}, "settings": json.loads(json.dumps(
      rp.settings(s)))}
  for name in c_old:
    os.makedirs(os.path.join(old, name, "checkpoints"))
    os.makedirs(os.path.join(old, name, "hf"))        # exported: copying needs no export
  with open(os.path.join(old, "plan.json"), "w") as f:
    json.dump({**header(s_old), "configs": {k: c.to_dict() for k, c in c_old.items()}}, f)
  rows = {n: {"name": n, "loss_png": os.path.join(old, n, "loss.png"), "steps": 8} for n in c_old}
  with open(os.path.join(old, "report.json"), "w") as f:
    json.dump({"stages": rows}, f)
  open(os.path.join(old, "tokenizer.model"), "w").close()

  s_same, r_same, c_same = configs(new)                    # the same plan: everything is copied
  c_same["sft_it_think"].export_hf = False                 # (whether it exports is not training)
  assert rp.reusable(old, header(s_same), r_same, c_same, new) == rows
  s_new, r_new, c_new = configs(new, sft_steps=9)          # another SFT from the same CPT
  assert rp.reusable(old, header(s_new), r_new, c_new, new) == {"cpt_it": rows["cpt_it"]}
  assert f"sft_it_think of {old} was configured differently" in capsys.readouterr().out
  os.makedirs(new)
  copied = rp._copy_run(old, new, r_new[0], rows["cpt_it"], c_new["cpt_it"])
  assert copied["loss_png"] == os.path.join(new, "cpt_it", "loss.png")
  assert copied["reused_from"] == os.path.join(old, "cpt_it") and os.path.isdir(
      os.path.join(new, "cpt_it", "checkpoints"))
  s_other, r_other, c_other = configs(new, cpt_steps=9)    # another CPT: all trained afresh
  assert rp.reusable(old, header(s_other), r_other, c_other, new) == {}
  assert f"cpt_it of {old} was configured differently" in capsys.readouterr().out
  with pytest.raises(SystemExit, match="corpus"):
    rp.reusable(old, header(s_new, sha="other"), r_new, c_new, new)
  s_vocab, r_vocab, c_vocab = configs(new, vocab=512)
  with pytest.raises(SystemExit, match="vocab"):
    rp.reusable(old, header(s_vocab), r_vocab, c_vocab, new)
  with pytest.raises(SystemExit, match="plan.json is missing"):
    rp.reusable(new, header(s_new), r_new, c_new, new)


def test_ship_copies_the_export_with_its_provenance(rp, tmp_path):
  import json
  export = tmp_path / "hf"
  export.mkdir()
  (export / "config.json").write_text("{}")
  free = lambda f1: {"free": {"token_f1": {"overall": f1, "domains": {"os": f1, "mcp": f1 / 2}},
                              "exact": {"overall": 0.0, "domains": {"os": 0.0, "mcp": 0.0}},
                              "counts": {"os": 1, "mcp": 1}}}   # the shape results() gives
  res = {"systems": {"sft_it_think": free(0.6), "copy_previous": free(0.4)}}
  cfg = types.SimpleNamespace(to_dict=lambda: {"train": {"num_steps": 3}})
  header = {"command": "reproduce.py --budget=tiny", "settings": {"preset": "tiny"},
            "corpus": {"sha256": "ab" * 32}}
  dest = tmp_path / "ship"
  (dest / "old").mkdir(parents=True)
  # A folder that is not an earlier ship is refused, untouched (issue 68) ...
  with pytest.raises(ValueError, match="did not make"):
    rp.ship(str(export), str(dest), header, cfg, res, "sft_it_think", None)
  assert os.listdir(dest) == ["old"]
  # ... an earlier ship (its provenance says how it was made) is replaced, not merged.
  (dest / "provenance.json").write_text('{"made_by": "reproduce.py --budget=tiny"}')
  rp.ship(str(export), str(dest), header, cfg, res, "sft_it_think",
          {"mean_edit_similarity": 0.7, "transcript": "long text"})
  assert sorted(os.listdir(dest)) == ["checksums.json", "config.json", "provenance.json"]
  prov = json.loads((dest / "provenance.json").read_text())
  assert prov["made_by"] == "reproduce.py --budget=tiny" and prov["corpus"]["sha256"] == "ab" * 32
  assert prov["free_running"]["sft_it_think"]["token_f1"] == 0.6
  assert prov["free_running"]["copy_previous"]["token_f1"] == 0.4
  assert prov["token_f1_vs_copy_previous"]["ahead"] == ["os", "mcp"]
  assert prov["simulated_episode"] == {"mean_edit_similarity": 0.7}
  assert prov["config"] == {"train": {"num_steps": 3}} and "cpt_from" not in prov
  # a run whose CPT continued from that shipped model records the chain
  header["settings"] = {"preset": "tiny", "cpt_from": str(dest)}
  rp.ship(str(export), str(tmp_path / "next"), header, cfg, res, "sft_it_think", None)
  chained = json.loads((tmp_path / "next" / "provenance.json").read_text())
  assert chained["cpt_from"] == {"folder": str(dest), "provenance": prov}
  # shipping over the folder the CPT started from keeps the chain (read before it is replaced)
  rp.ship(str(export), str(dest), header, cfg, res, "sft_it_think", None)
  in_place = json.loads((dest / "provenance.json").read_text())
  assert in_place["cpt_from"] == {"folder": str(dest), "provenance": prov}


class _FakeSampler:
  def __init__(self, replies):
    self.replies, self.seen = list(replies), []

  def generate(self, chats, params):
    self.seen.append(chats[0])
    text = self.replies.pop(0)
    return [Generation(text=text, token_ids=[], logprobs=[], finish_reason="stop", content=text)]


def test_simulated_episode_prints_both_sides_and_the_mean():
  ep = Trajectory("t1", "terminal", "task", "bash", "~$", [Turn("cat a", "abc"),
                                                           Turn("cat b", "hello"),
                                                           Turn("cat c", "unused")])
  lines = []
  fake = _FakeSampler(["abd", "hello"])
  sim = episodes_lib.simulated_episode(fake, ep, turns=2, out=lines.append)
  # "abd" vs "abc": one substitution in 3 characters -> 2/3; "hello" exact -> 1
  assert sim["edit_similarity"] == pytest.approx([2 / 3, 1.0])
  assert sim["mean_edit_similarity"] == pytest.approx(5 / 6) and sim["turns"] == 2
  text = "\n".join(lines)
  assert "edit similarity 0.667" in text and "mean edit similarity" in text and "0.833" in text
  row = next(ln for ln in text.splitlines() if ln.strip().startswith("abd"))
  assert row.split("|")[1].strip() == "abc"                    # simulated | real, side by side
  # the model's own first answer, not the real one, is its history at the second turn
  assert "abd" in fake.seen[1][2]["content"]


def test_rl_experiment_start_folder_is_checked(tmp_path):
  """launch/rl_experiment.py --config.start: a Hugging Face folder with its tokenizer; what is
  missing is named."""
  import json
  from lwm_jax.recipe import rl_experiment as rx
  assert rx.corpus_lib.given_start is corpus_lib.given_start  # the experiment checks with this
  with pytest.raises(SystemExit, match="config.json is missing"):
    corpus_lib.given_start(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 2048}))
  (tmp_path / "tokenizer.model").write_bytes(b"x")
  with pytest.raises(SystemExit, match="'max_position_embeddings' is missing"):
    corpus_lib.given_start(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 2048,
                                                    "max_position_embeddings": 2048}))
  assert corpus_lib.given_start(str(tmp_path)) == (str(tmp_path), str(tmp_path / "tokenizer.model"),
                                            2048, 2048)


def test_perturb_experiment_compares_models_check_by_check():
  """The perturb experiment's table (lwm_jax/recipe/perturb_experiment.py): per (domain, spec,
  check) each model's rates with and without the instruction, and per model the mean over the
  checks that applied."""
  from lwm_jax.recipe import perturb_experiment as px

  def report(err_with, page_with, sim, page_departing=None):
    check = lambda w, wo, real, target: {"turns": 4, "with_instruction": w,  # noqa: E731
                                         "without_instruction": wo, "real": real,
                                         "target": target}
    page = check(page_with, 0.5, 1.0, 1.0)
    if page_departing is not None:  # (turns, with, without) on the departing turns
      page["departing"] = dict(zip(("turns", "with_instruction", "without_instruction"),
                                   page_departing), real=1.0)
    sims = {"with": {"exact": 0.0, "token_f1": sim, "edit_sim": sim},
            "without": {"exact": 0.0, "token_f1": 0.0, "edit_sim": 0.0}}
    return {"rows": [
        {"domain": "mcp", "spec": "errors:rate=0.2,kind=timeout",
         "checks": {"errors": check(err_with, 0.0, 0.25, 0.2)}, "similarity_to_real": sims},
        {"domain": "search", "spec": "page_size:size=2",
         "checks": {"page_size": page}, "similarity_to_real": sims},
        {"domain": "web", "spec": "rate_limit:limit=5,retry_after=20",   # never applied
         "checks": {"rate_limit": check(None, None, None, 1.0)}, "similarity_to_real": sims}]}

  checks, means = px.compare({"plain": report(0.0, 0.5, 0.2, (2, 0.0, 0.0)),
                              "perturbed": report(0.25, 1.0, 0.4, (2, 1.0, 0.5))})
  assert [(r["domain"], r["check"]) for r in checks] == [("mcp", "errors"), ("search", "page_size"),
                                                        ("web", "rate_limit")]
  assert checks[1]["perturbed"] == {"with": 1.0, "without": 0.5,
                                    "departing": {"turns": 2, "with": 1.0, "without": 0.5}}
  assert checks[1]["real"] == 1.0
  # departing: the page size on its departing turns, the error rate over every call
  assert means["perturbed"]["departing"] == {"checks": 2, "with": pytest.approx(0.625),
                                             "without": pytest.approx(0.25)}
  assert means["plain"]["departing"]["with"] == 0.0
  # a report made without plain twins has no departing rates, the error rate's included
  assert px.compare({"plain": report(0.0, 0.5, 0.2)})[1]["plain"]["departing"]["checks"] == 0
  assert means["plain"]["checks"] == 2                          # the check that never applied is out
  assert means["plain"]["with"] == pytest.approx(0.25) and means["plain"]["without"] == 0.25
  assert means["perturbed"]["with"] == pytest.approx(0.625)
  assert means["perturbed"]["edit_sim_with"] == pytest.approx(0.4)
  text = px.markdown(checks, means, {}, {"command": "c", "start": "s", "sft_steps": 1,
                                         "sft_batch": 1, "sft_seq_len": 8, "domains": ["mcp"],
                                         "perturb_share": 0.5, "episodes": 1, "max_turns": 1,
                                         "max_tokens": 8, "temperature": 1.0})
  assert "| perturbed | 2 | 62.5 | 25.0 | +37.5 |" in text
  assert "| plain | 2 | 0.0 | 0.0 | +0.0 |" in text  # the departing turns' table
  assert "| web | `rate_limit:limit=5,retry_after=20` | rate_limit | 4 | - | 100.0 | - / - | - / - |" in text


def test_perturb_experiment_pools_the_likelihood_gain_per_token():
  """The teacher-forced table pools each model's NLL over tokens (not over cells), separately for
  all turns and for the turns that show the behaviour; per check it lists each model's gain."""
  from lwm_jax.recipe import perturb_experiment as px
  cell = lambda tok, w, wo: {"turns": 1, "tokens": tok, "nll_with": w,  # noqa: E731
                             "nll_without": wo, "gain": None if w is None else wo - w}
  rep = {"rows": [], "likelihood": [
      {"domain": "mcp", "spec": "errors:rate=0.2,kind=timeout", "all": cell(30, 1.0, 2.0),
       "checks": {"errors": cell(10, 1.0, 3.0)}},
      {"domain": "search", "spec": "page_size:size=2", "all": cell(10, 2.0, 2.0),
       "checks": {"page_size": cell(0, None, None)}}]}
  gains = px.compare_likelihood({"start": {"rows": []}, "perturbed": rep})
  assert "start" not in gains["pooled"]  # a report without the likelihood part
  pooled = gains["pooled"]["perturbed"]
  assert pooled["all"]["tokens"] == 40
  assert pooled["all"]["nll_with"] == pytest.approx((30 * 1.0 + 10 * 2.0) / 40)
  assert pooled["all"]["gain"] == pytest.approx((30 * 1.0) / 40)
  assert pooled["shown"] == {"tokens": 10, "nll_with": 1.0, "nll_without": 3.0, "gain": 2.0}
  assert [(r["check"], r["perturbed"]) for r in gains["checks"]] == [("errors", 2.0),
                                                                     ("page_size", None)]
  settings = {"command": "c", "start": "s", "sft_steps": 1, "sft_batch": 1, "sft_seq_len": 8,
              "domains": ["mcp"], "perturb_share": 0.5, "episodes": 1, "max_turns": 1,
              "max_tokens": 8, "temperature": 1.0,
              "instruction_visible": {"mcp": {"samples": 8, "kept": 1, "dropped": 2}}}
  text = px.markdown([], {}, {}, settings, gains)
  assert "| perturbed | shown | 10 | 1.0000 | 3.0000 | +2.0000 |" in text
  assert "| mcp | `errors:rate=0.2,kind=timeout` | errors | 1 | 10 | +2.000 |" in text
  assert "keeps the whole simulation instruction: mcp 12% of 8 (2 dropped as over-long)" in text


def test_perturb_experiment_paired_copy_adds_each_perturbed_episodes_plain_twin(tmp_path):
  """`paired`: the perturbed run's training split gains, after its own episodes, the plain copy's
  version of exactly the episodes that carry an instruction; validation is the perturbed copy's;
  a perturbed episode with no twin is refused, naming the file."""
  import json
  from lwm_jax.data.jsonl import iter_jsonl, open_text
  from lwm_jax.recipe import perturb_experiment as px

  def write(folder, split, recs):
    os.makedirs(folder, exist_ok=True)
    with open_text(os.path.join(folder, f"mcp_{split}.jsonl.gz"), "w") as f:
      for r in recs:
        f.write(json.dumps(r) + "\n")

  rec = lambda i, instr, obs: {"id": f"mcp-{i}", "simulation_instruction": instr,  # noqa: E731
                               "turns": [{"action": "a", "observation": obs}]}
  pert, plain = str(tmp_path / "p"), str(tmp_path / "q")
  write(pert, "train", [rec(0, "", "ok"), rec(1, "Calls fail.", "error"), rec(2, " ", "ok")])
  write(pert, "validation", [rec(9, "Calls fail.", "error")])
  write(plain, "train", [rec(0, "", "ok"), rec(1, "", "ok"), rec(2, "", "ok")])
  out, added = px.paired_copy(str(tmp_path / "wd"), ["mcp"], pert, plain)
  got = [r for _, r in iter_jsonl(os.path.join(out, "mcp_train.jsonl.gz"))]
  assert added == {"mcp": 1}
  assert [(r["id"], r["turns"][0]["observation"]) for r in got] == [
      ("mcp-0", "ok"), ("mcp-1", "error"), ("mcp-2", "ok"), ("mcp-1", "ok")]
  assert [r["id"] for _, r in iter_jsonl(os.path.join(out, "mcp_validation.jsonl.gz"))] == ["mcp-9"]
  write(plain, "train", [rec(0, "", "ok")])
  with pytest.raises(SystemExit, match="mcp_train.jsonl.gz: no plain twin for 1 perturbed"):
    px.paired_copy(str(tmp_path / "wd2"), ["mcp"], pert, plain)


def test_cpt_from_starts_every_cpt_run_from_the_given_model(rp, tmp_path):
  """--cpt_from: each CPT run (the masking ablation's too) loads the given folder; SFT runs still
  start from their own CPT run's export; without it CPT starts from random initialisation."""
  corpus = corpus_lib.Corpus("c", ["a_train.jsonl.gz"], ["a_validation.jsonl.gz"], [], [], [])
  given = tmp_path / "given"
  s = _resolve("tiny", ablations="masking", knowledge="", cpt_from=str(given))
  assert s.cpt_from == str(given)
  wd = str(tmp_path / "wd")
  cfg = {r.name: rp.run_config(r, s, wd, "tok.model", 1024, corpus, "", True) for r in rp.plan(s)}
  assert cfg["cpt_it"].init_from_hf == cfg["cpt_full"].init_from_hf == str(given)
  assert cfg["sft_it_think"].init_from_hf == os.path.join(wd, "cpt_it", "hf")
  plain = _resolve("tiny", knowledge="")
  assert plain.cpt_from == ""
  assert rp.run_config(rp.plan(plain)[0], plain, wd, "tok.model", 1024, corpus, "",
                       True).init_from_hf == ""


class _ByAction:
  """A stand-in sampler answering each chat from its last message (the action): batched."""
  def __init__(self, answers):
    self.answers, self.batches = answers, []

  def generate(self, chats, params):
    self.batches.append(len(chats))
    texts = [next((v for k, v in self.answers.items() if f"\n{k}\n" in c[-1]["content"]), "?")
             for c in chats]
    return [Generation(text=t, token_ids=[], logprobs=[], finish_reason="stop", content=t)
            for t in texts]


def test_played_episodes_advance_together_and_are_summarised():
  a = Trajectory("a", "terminal", "task", "bash", "~$", [Turn("pwd", "/home/user"),
                                                         Turn("whoami", "root")])
  b = Trajectory("b", "terminal", "task", "bash", "~$", [Turn("date", "Mon"),
                                                         Turn("pwd", "/home/user"),
                                                         Turn("ls", "never played")])
  fake = _ByAction({"pwd": "/home/user", "whoami": "rooX", "date": "Mon"})
  played = episodes_lib.play_episodes(fake, [a, b], turns=3)
  assert fake.batches == [2, 2, 1]       # one generation per turn; `a` has two turns only
  assert [p["turns"] for p in played] == [2, 3]
  assert played[0]["edit_similarity"] == pytest.approx([1.0, 0.75])
  assert played[1]["predicted"] == ["Mon", "/home/user", "?"]
  assert played[1]["mean_edit_similarity"] == pytest.approx(2 / 3)
  lines = []
  summary = episodes_lib.summarise_episodes(played, out=lines.append)
  assert summary["episodes"] == 2 and summary["mean"] == pytest.approx((0.875 + 2 / 3) / 2)
  assert summary["at_least_0.6"] == 2 and summary["per_episode"] == {"a": 0.875, "b": 0.6667}
  assert "median 0.771" in lines[-1] and "2 of 2 at 0.6 or more" in lines[-1]
  assert lines[0].split()[0] == "a" and "pwd ; whoami" in lines[0]


def test_the_demo_episode_is_the_most_knowable_one():
  """knowable_share counts the words of each real observation already shown before it; the demo
  plays the episode where that share is highest, whatever any model scores on it."""
  state = "Files under ~:\nnotes/todo.txt\nlogs/app.log"
  lucky = Trajectory("log", "terminal", "task", "bash", state,
                     [Turn("cat logs/app.log", "12:03 ERROR disk full\n12:04 INFO retry"),
                      Turn("ls notes", "todo.txt")])
  known = Trajectory("ls", "terminal", "task", "bash", state,
                     [Turn("ls notes", "todo.txt"), Turn("ls logs", "app.log")])
  other = Trajectory("mcp", "mcp", "task", "tools", state, [Turn("x", "y")])
  assert episodes_lib.knowable_share(known) == 1.0
  # the log's 7 words: only "12" reappears inside it, never before it; "todo.txt" was shown
  assert episodes_lib.knowable_share(lucky) == pytest.approx((0 / 7 + 1.0) / 2)
  assert episodes_lib.demo_episode([lucky, other, known]).id == "ls"
  with pytest.raises(SystemExit, match="no terminal episode"):
    episodes_lib.demo_episode([other])


def test_simulated_terminal_episodes_show_the_demo_episode_and_summarise_all():
  state = "Files under ~:\nnotes/todo.txt"
  known = Trajectory("known", "terminal", "task", "bash", state, [Turn("ls notes", "todo.txt")])
  drawn = Trajectory("drawn", "terminal", "task", "bash", state,
                     [Turn("cat log", "12:03 disk full")])
  elsewhere = Trajectory("web", "web", "task", "click", state, [Turn("click 1", "page")])
  fake = _ByAction({"ls notes": "todo.txt", "cat log": "12:03 disk ok"})
  lines = []
  sim = episodes_lib.simulated_terminal_episodes(fake, [drawn, elsewhere, known], 32, lines.append)
  assert fake.batches == [2]                                   # both terminal episodes at once
  assert sim["trajectory"] == "known" and sim["mean_edit_similarity"] == 1.0
  every = sim["all_terminal_test_episodes"]
  assert every["episodes"] == 2 and set(every["per_episode"]) == {"known", "drawn"}
  assert every["per_episode"]["drawn"] == pytest.approx(1 - 4 / 15, abs=1e-4)   # ok -> full
  assert "the demo's episode known (100%" in lines[0]


def test_more_worlds_adds_episodes_of_other_worlds_and_drops_held_out_ones(rp, tmp_path):
  """--more_worlds: every split of another corpus folder joins CPT and SFT training (validation
  stays the corpus's own); an episode whose world the corpus holds out is dropped and counted;
  reusing an earlier run that trained on other extra episodes is refused."""
  import json
  from lwm_jax.data import schema
  traj = lambda i, world: Trajectory(id=f"t-{i}", domain="terminal", task="t", action_space="a",  # noqa: E731
                                     initial_state="", turns=[Turn("ls", "x")],
                                     meta={"world": world})
  base, more = tmp_path / "base", tmp_path / "more"
  base.mkdir(), more.mkdir()
  schema.write_jsonl(base / "terminal_train.jsonl.gz", [traj(0, "w-train")])
  schema.write_jsonl(base / "terminal_validation.jsonl.gz", [traj(1, "w-val")])
  schema.write_jsonl(base / "terminal_test.jsonl.gz", [traj(2, "w-test")])
  schema.write_jsonl(more / "terminal_train.jsonl.gz",
                     [traj(10, "w-new"), traj(11, "w-test"), traj(12, "w-train")])
  schema.write_jsonl(more / "terminal_test.jsonl.gz", [traj(13, "w-val"), traj(14, "w-new2")])
  corpus = corpus_lib.load_corpus(str(base))
  out = str(tmp_path / "kept.jsonl")
  info = corpus_lib.more_worlds(str(more), corpus, out)
  assert [t.id for t in schema.read_jsonl(out)] == ["t-14", "t-10", "t-12"]   # test file first
  assert (info["trajectories"], info["worlds"], info["worlds_new"],
          info["dropped_held_out_world"]) == (3, 3, 2, 2)
  with pytest.raises(SystemExit, match="no .*under"):
    corpus_lib.more_worlds(str(tmp_path), corpus, out)
  other = tmp_path / "other"                                                  # two folders
  other.mkdir()
  schema.write_jsonl(other / "terminal_train.jsonl.gz", [traj(20, "w-other")])
  two = corpus_lib.more_worlds(f"{more},{other}", corpus, str(tmp_path / "two.jsonl"))
  assert [t.id for t in schema.read_jsonl(tmp_path / "two.jsonl")] == ["t-14", "t-10", "t-12", "t-20"]
  assert two["files"][-1] == "other/terminal_train.jsonl.gz" and two["worlds_new"] == 3
  assert _resolve("tiny", knowledge="",
                  more_worlds=f"{more},{other}").more_worlds == f"{more},{other}"

  s = _resolve("tiny", knowledge="", more_worlds=str(more))
  assert s.more_worlds == str(more)
  wd = str(tmp_path / "wd")
  cfg = {r.stage: rp.run_config(r, s, wd, "tok.model", 1024, corpus, "", True, out)
         for r in rp.plan(s)}
  for c in cfg.values():
    assert c.data.pipeline.jsonl == ",".join(corpus.train_files + [out])
    assert c.data.eval_jsonl == corpus.valid_jsonl
  old = tmp_path / "old"
  old.mkdir()
  for n in ("report.json", "tokenizer.model"):
    (old / n).write_text("{}")
  (old / "plan.json").write_text(json.dumps({"corpus": {"sha256": "c"}, "more_worlds": None}))
  with pytest.raises(SystemExit, match="other --config.more_worlds"):
    rp.reusable(str(old), {"corpus": {"sha256": "c"}, "more_worlds": info}, rp.plan(s), cfg, wd)


def test_drill_flags_reach_the_cpt_config_only(rp, tmp_path):
  s = _resolve("tiny", knowledge="", drill_share=0.6, drill_rows="64, 512")
  assert (s.drill_share, s.drill_rows) == (0.6, "64,512")
  corpus = corpus_lib.Corpus("c", ["a_train.jsonl.gz"], ["a_validation.jsonl.gz"], [], [], [])
  cfg = {r.name: rp.run_config(r, s, str(tmp_path), "tok.model", 1024, corpus, "", True)
         for r in rp.plan(s)}
  assert (cfg["cpt_it"].data.pipeline.drill_share, cfg["cpt_it"].data.pipeline.drill_rows) == (
      0.6, "64,512")
  assert cfg["sft_it_think"].data.pipeline.drill_share == 0.0
  assert _resolve("tiny").drill_share == 0.0
  with pytest.raises(ValueError, match=r"--config.drill_share must be in \[0, 1\)"):
    _resolve("tiny", drill_share=1.0)
  with pytest.raises(ValueError, match="--config.drill_rows: .*'64,x'"):
    _resolve("tiny", drill_share=0.5, drill_rows="64,x")
