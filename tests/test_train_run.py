"""A training run's files and failures: resumes keep every config and no duplicate metrics rows,
a batch with nothing to learn from stops the run, bad command lines are one clear line,
config.sharding.rules reach the parameters, and SFT's thinking target is the config's choice."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from configs import cpt as cpt_config
from configs import sft as sft_config
from lwm_jax.data import prompts, schema
from lwm_jax.data import tokenizer as tk
from lwm_jax.train import metrics, run_config, sources, trainer
from lwm_jax.train.synthetic import SyntheticIterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "data", "trajectories.jsonl")


@pytest.fixture(scope="module", autouse=True)
def _compile_cache(tmp_path_factory):
  """The runs of this module compile the same step: reuse it through JAX's disk cache."""
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  old = [getattr(jax.config, k) for k in keys]
  for k, v in zip(keys, (str(tmp_path_factory.mktemp("jax_cache")), 0, 0)):
    jax.config.update(k, v)
  yield
  for k, v in zip(keys, old):
    jax.config.update(k, v)


def _tiny(num_steps=8, **train):
  c = cpt_config.get_config("tiny")
  c.model.num_hidden_layers = 1
  c.model.num_experts = 4
  c.train.update(dict(num_steps=num_steps, batch_size=4, seq_len=32, log_every=2, eval_every=0,
                      progress=False), **train)
  c.checkpoint.update(dict(every=4, use_async=False))
  c.optim.warmup_steps = 3
  return c


class Crash(Exception):
  """Stands in for the process dying (kill -9) in the middle of a run."""


class _CrashAt(SyntheticIterator):
  def __init__(self, at, **kw):
    super().__init__(**kw)
    self.at = at

  def __next__(self):
    if self.index == self.at:
      raise Crash()
    return super().__next__()


def _rows(wd):
  return [json.loads(l) for l in (wd / "metrics.jsonl").read_text().splitlines()]


def test_restart_keeps_each_config_and_logs_each_step_once(tmp_path):
  wd = tmp_path / "run"
  c = _tiny()
  with pytest.raises(Crash):  # dies during step 7: rows 2, 4, 6 written, checkpoint at 4
    trainer.train(c, str(wd), source=_CrashAt(6, batch=4, seq_len=32, vocab=c.model.vocab_size))
  assert [r["step"] for r in _rows(wd)] == [2, 4, 6]
  with open(wd / "metrics.jsonl", "a") as f:  # a row torn by the kill
    f.write('{"step": 7, "spl')
  changed = _tiny()  # a changed setting (one that leaves the compiled step as it is)
  changed.checkpoint.keep = 3
  out = trainer.train(changed, str(wd))
  assert out["start_step"] == 4 and out["final_step"] == 8
  assert [r["step"] for r in _rows(wd)] == [2, 4, 6, 8]  # step 6 replayed, logged once
  first = json.loads((wd / "config.json").read_text())
  resumed = json.loads((wd / "config.resume-4.json").read_text())
  assert first["checkpoint"]["keep"] == 2 and resumed["checkpoint"]["keep"] == 3
  assert out["config_file"] == str(wd / "config.resume-4.json")


def test_drop_rows_after(tmp_path):
  p = tmp_path / "metrics.jsonl"
  p.write_text('{"step": 1, "split": "train"}\n{"step": 3, "split": "train"}\n'
               '{"step": 2, "split": "eval"}\n{"step": 4')
  assert metrics.drop_rows_after(str(p), 2) == 2
  assert [json.loads(l)["step"] for l in p.read_text().splitlines()] == [1, 2]
  p.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
  with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a metrics row"):
    metrics.drop_rows_after(str(p), 0)
  assert p.read_text() == '{"step": 1}\nnot json\n{"step": 2}\n'  # untouched


def test_same_config_on_resume_writes_no_second_file(tmp_path):
  resolved = {"optim": {"lr": 1e-3}, "train": {"num_steps": 8}}
  assert run_config.save_run_config(str(tmp_path), resolved, 0) == str(tmp_path / "config.json")
  assert run_config.save_run_config(str(tmp_path), resolved, 4) == str(tmp_path / "config.json")
  assert sorted(os.listdir(tmp_path)) == ["config.json"]


class _NoTargets(SyntheticIterator):
  def __next__(self):
    b = super().__next__()
    b["loss_weights"] = np.zeros_like(b["loss_weights"])
    return b


def test_batch_without_loss_tokens_stops_the_run(tmp_path):
  c = _tiny(log_every=0)
  with pytest.raises(trainer.EmptyBatchError,
                     match=r"step 1: no token of the batch carries loss weight.*_NoTargets.*"
                           r"train\.seq_len=32"):
    trainer.train(c, str(tmp_path), source=_NoTargets(4, 32, c.model.vocab_size))
  assert not (tmp_path / "checkpoints" / "1").exists()


def test_command_line_errors_are_one_line():
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  cases = {
      "--config=configs/cpt.py:tiny --config.train.num_stpes=3":
          "--config.train.num_stpes: config.train has no field 'num_stpes' (close matches: "
          "num_steps)",
      "--config=configs/cpt.py:tinny":
          "--config=configs/cpt.py:tinny: no preset 'tinny' (close matches: tiny)",
      "--config=configs/cpx.py:tiny":
          "--config=configs/cpx.py:tiny: no config file configs/cpx.py (close matches: "
          "configs/cpt.py",
      "--config=configs/cpt.py:tiny --config.trian.seq_len=8":
          "--config.trian.seq_len: config has no field 'trian' (close matches: train)",
  }
  procs = {k: subprocess.Popen([sys.executable, "launch/train.py", *k.split(), "--workdir=/tmp/x"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for k in cases}
  for args, want in cases.items():
    _, err = procs[args].communicate(timeout=300)
    assert procs[args].returncode == 2, (args, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {want}"), (args, err[-2000:])


def test_sharding_rules_validated():
  c = _tiny()
  c.sharding.rules = (("vocab", "tensor"), ("embd", "fsdp"))
  with pytest.raises(ValueError, match=r"config\.sharding\.rules\[1\]: unknown logical axis "
                                       r"'embd' \(close matches: embed"):
    run_config.validate_config(c)
  c.sharding.rules = (("vocab", "tensr"),)
  with pytest.raises(ValueError, match=r"rules\[0\]: 'tensr' is not a mesh axis"):
    run_config.validate_config(c)


RULES = textwrap.dedent("""
  import json, sys
  from configs import cpt
  from lwm_jax.train import trainer

  class Seen(Exception):
    pass

  class Spy:
    def next_batch(self, state):  # the first batch: record the layout, stop before compiling
      raise Seen(json.dumps(list(state.params["embed_tokens"].get_value().sharding.spec)))
    def get_state(self):
      return {}
    def set_state(self, s):
      pass

  out = {}
  for name, rules in (("default", None), ("embed_replicated", (("embed", None),))):
    c = cpt.get_config("tiny")
    c.model.update(dict(num_hidden_layers=1, num_experts=4))
    c.train.update(dict(num_steps=1, batch_size=4, seq_len=16, log_every=0, progress=False))
    c.mesh.update(dict(data=1, fsdp=2))
    if rules:
      c.sharding.rules = rules
    try:
      trainer.train(c, sys.argv[1] + "/" + name, source=Spy())
    except Seen as e:
      out[name] = json.loads(str(e))
  print("RESULT", json.dumps(out))
""")


def test_sharding_rules_from_the_config_place_the_parameters(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  p = subprocess.run([sys.executable, "-c", RULES, str(tmp_path)], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")]
  assert p.returncode == 0 and line, p.stderr[-3000:]
  res = json.loads(line[0][len("RESULT "):])
  # embed_tokens is (vocab, embed): vocab -> tensor (size 1), embed -> fsdp unless the rules say no
  assert res == {"default": [None, "fsdp"], "embed_replicated": [None, None]}


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
  trajs = list(schema.read_jsonl(FIX))
  texts = []
  for t in trajs:
    texts += [x.action for x in t.turns] + [x.observation for x in t.turns]
    texts += [prompts.system_prompt(t, v) for v in range(12)]
  return tk.train_sentencepiece(texts, 600, tmp_path_factory.mktemp("sp") / "s")


def _sft(tmp_path, sp_model, target):
  traj = next(iter(schema.read_jsonl(FIX)))
  d = traj.to_dict()
  d["meta"] = dict(d.get("meta") or {}, think=["weighing the disk usage"] * len(d["turns"]))
  path = tmp_path / f"think_{target}.jsonl"
  path.write_text(json.dumps(d) + "\n")
  c = sft_config.get_config("tiny")
  c.model.update(dict(vocab_size=640, num_hidden_layers=1, num_experts=4))
  c.train.update(dict(batch_size=1, seq_len=1024, log_every=0, progress=False))
  c.data.update(dict(source="pipeline", tokenizer=sp_model, thinking_target=target))
  c.data.pipeline.update(dict(jsonl=str(path), num_epochs=1, num_packing_bins=1))
  return c


@pytest.mark.parametrize("target,think", [("empty", ""), ("recorded", "weighing the disk usage")])
def test_sft_thinking_target_follows_the_config(tmp_path, sp_model, target, think):
  c = _sft(tmp_path, sp_model, target)
  model_cfg = run_config.validate_config(c)
  source, _, _ = sources.pipeline_source(c, model_cfg, "sft")
  b = source.next_batch(None)
  tok = tk.load_tokenizer(sp_model)
  ids = b["tokens"][0][b["loss_weights"][0] > 0]
  text = tok.decode([int(i) for i in ids])
  assert text.startswith(f"<think>{think}</think>\n<predicted_observation>"), text


def test_sft_log_says_the_think_block_is_empty(tmp_path, sp_model, caplog):
  c = _sft(tmp_path, sp_model, "empty")

  class Stop(Exception):
    pass

  class StopAtOnce:
    def next_batch(self, state):
      raise Stop()

    def get_state(self):
      return {}

    def set_state(self, s):
      pass

  with caplog.at_level("WARNING"), pytest.raises(Stop):
    trainer.train(c, str(tmp_path / "wd"), source=StopAtOnce())
  assert "<think></think> block is EMPTY (data.thinking_target='empty')" in caplog.text
  c.data.thinking_target = "teacher"
  with pytest.raises(ValueError, match=r"config\.data\.thinking_target: 'teacher' is not one of"):
    trainer.train(c, str(tmp_path / "wd2"))
