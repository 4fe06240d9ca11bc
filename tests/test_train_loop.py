"""Trainer: exact resume, NaN stop keeping the last good checkpoint, config and workdir failures,
restore_params, one RL (GSPO) step run; a restart keeps each config and logs each step once, a
batch with nothing to learn from stops the run, the SFT log names the empty thinking target."""
import json
import os

import jax
import numpy as np
import pytest

from configs import cpt as cpt_config
from configs import rl as rl_config
from configs import sft as sft_config
from lwm_jax import checkpoints
from lwm_jax.data import prompts, schema
from lwm_jax.data import tokenizer as tk
from lwm_jax.train import trainer
from lwm_jax.train.synthetic import SyntheticIterator


pytestmark = pytest.mark.usefixtures("jax_disk_cache")  # one compile per repeated step


def _tiny(num_steps=40, **train):
  c = cpt_config.get_config("tiny")
  c.model.num_hidden_layers = 1
  c.model.num_experts = 4
  c.train.update(dict(num_steps=num_steps, batch_size=4, seq_len=32, log_every=10, eval_every=0,
                      progress=False), **train)
  c.checkpoint.every = 20
  c.optim.warmup_steps = 3
  return c


@pytest.mark.slow  # heavy (over 10 s): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_exact_resume(tmp_path):
  straight = trainer.train(_tiny(), str(tmp_path / "a"))
  first = trainer.train(_tiny(stop_after=20), str(tmp_path / "b"))
  assert first["final_step"] == 20
  second = trainer.train(_tiny(), str(tmp_path / "b"))
  assert second["start_step"] == 20 and second["final_step"] == 40
  np.testing.assert_allclose(first["losses"], straight["losses"][:20], atol=1e-6, rtol=0)
  np.testing.assert_allclose(second["losses"], straight["losses"][20:], atol=1e-6, rtol=0)
  assert straight["losses"][-1] < straight["losses"][0] - 0.3  # it learns
  # files of the workdir
  wd = tmp_path / "a"
  cfg = json.loads((wd / "config.json").read_text())
  assert cfg["model"]["num_hidden_layers"] == 1 and cfg["stage"] == "cpt"
  rows = [json.loads(l) for l in (wd / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [10, 20, 30, 40]
  assert {"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "kept_tokens", "aux_loss"} <= set(rows[0])
  assert (wd / "loss.png").exists() and any((wd / "tensorboard").iterdir())
  # restore_params from the workdir (latest step) and from a step folder
  mcfg, params, info = checkpoints.restore_params(str(wd))
  assert info["step"] == 40 and mcfg.num_hidden_layers == 1
  _, params20, info20 = checkpoints.restore_params(str(wd / "checkpoints" / "20"))
  assert info20["step"] == 20
  assert not np.allclose(np.asarray(params["lm_head"]["kernel"][...]),
                         np.asarray(params20["lm_head"]["kernel"][...]))


class _NanAt(SyntheticIterator):
  def __init__(self, at, **kw):
    super().__init__(**kw)
    self.at = at

  def __next__(self):
    b = super().__next__()
    if self.index == self.at:
      b["loss_weights"] = b["loss_weights"] * np.nan
    return b


def test_nan_stops_and_keeps_last_good_checkpoint(tmp_path):
  c = _tiny(num_steps=10, log_every=0)
  c.checkpoint.every = 2
  it = _NanAt(5, batch=4, seq_len=32, vocab=c.model.vocab_size)
  with pytest.raises(trainer.TrainingDiverged, match="loss is nan at step 5.*checkpoints/4"):
    trainer.train(c, str(tmp_path), train_iter=it)
  _, params, info = checkpoints.restore_params(str(tmp_path))
  assert info["step"] == 4
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_config_and_workdir_errors(tmp_path):
  c = _tiny()
  c.train.micro_batches = 3
  with pytest.raises(ValueError, match=r"config\.train\.micro_batches"):
    trainer.train(c, str(tmp_path / "x"))
  c = _tiny()
  c.model.num_key_value_heads = 3
  with pytest.raises(ValueError, match=r"model\.num_key_value_heads"):
    trainer.train(c, str(tmp_path / "x"))
  c = _tiny()
  c.mesh.expert = 3
  with pytest.raises(ValueError, match=r"config\.mesh\.expert"):
    trainer.train(c, str(tmp_path / "x"))
  blocker = tmp_path / "a_file"  # a folder cannot be made under a file, even as root
  blocker.write_text("x")
  with pytest.raises(PermissionError, match=f"workdir {blocker / 'w'} is not writable"):
    trainer.train(_tiny(), str(blocker / "w"))


def test_rl_gspo_runs(tmp_path):
  c = rl_config.get_config("tiny")
  c.model.num_hidden_layers = 1
  c.model.num_experts = 4
  c.train.update(dict(num_steps=3, batch_size=4, seq_len=24, log_every=1, eval_every=0,
                      progress=False, micro_batches=2))
  c.rl.group_size = 2
  c.rl.response_len = 8
  out = trainer.train(c, str(tmp_path))
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert len(rows) == 3
  r = rows[0]
  assert {"clip_frac", "ratio_mean", "ratio_min", "ratio_max", "entropy"} <= set(r)
  # on-policy first step: old log-probs are the current ones, every ratio is 1
  assert r["ratio_min"] == pytest.approx(1.0, abs=1e-5) and r["ratio_max"] == pytest.approx(1.0, abs=1e-5)
  assert r["clip_frac"] == 0.0 and r["entropy"] > 0
  assert np.isfinite(out["losses"]).all()


class _CorruptCheckpointThenNan(_NanAt):
  """At batch `at`, overwrites 100 bytes of the newest step's largest data file, then yields NaN."""

  def __init__(self, workdir, **kw):
    super().__init__(**kw)
    self.workdir = workdir

  def __next__(self):
    if self.index + 1 == self.at:
      step_dir = os.path.join(self.workdir, "checkpoints", "4")
      files = [os.path.join(r, n) for r, _, ns in os.walk(os.path.join(step_dir, "state"))
               for n in ns]
      self.bad = max(files, key=os.path.getsize)
      with open(self.bad, "r+b") as f:
        f.seek(os.path.getsize(self.bad) // 2)
        f.write(bytes(range(100)))
    return super().__next__()


def test_nan_and_resume_skip_a_checkpoint_that_fails_verification(tmp_path, caplog):
  """Step 4 is damaged on disk before the NaN at step 5: the error names step 2, and a resume
  starts from step 2 with a warning naming the damaged file."""
  c = _tiny(num_steps=6, log_every=0)
  c.checkpoint.update(every=2, use_async=False)
  it = _CorruptCheckpointThenNan(str(tmp_path), at=5, batch=4, seq_len=32,
                                 vocab=c.model.vocab_size)
  with pytest.raises(trainer.TrainingDiverged, match=r"loss is nan at step 5.*checkpoints/2$"):
    trainer.train(c, str(tmp_path), train_iter=it)
  with caplog.at_level("WARNING"):
    out = trainer.train(c, str(tmp_path))
  assert out["start_step"] == 2 and out["final_step"] == 6
  assert any(it.bad in r.getMessage() for r in caplog.records)
  assert (tmp_path / "rejected_checkpoints" / "4").is_dir()
  assert checkpoints.restore_params(str(tmp_path))[2]["step"] == 6


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
  c = _tiny(stop_after=8, log_every=2)
  c.checkpoint.update(dict(every=4, use_async=False))
  # dies fetching step 8's batch: rows 2, 4, 6 written (a step's row is written once the next
  # step is queued), checkpoint at 4
  with pytest.raises(Crash):
    trainer.train(c, str(wd), source=_CrashAt(7, batch=4, seq_len=32, vocab=c.model.vocab_size))
  assert [r["step"] for r in _rows(wd)] == [2, 4, 6]
  with open(wd / "metrics.jsonl", "a") as f:  # a row torn by the kill
    f.write('{"step": 7, "spl')
  changed = _tiny(stop_after=8, log_every=2)  # a changed setting that keeps the compiled step
  changed.checkpoint.update(dict(every=4, use_async=False, keep=3))
  out = trainer.train(changed, str(wd))
  assert out["start_step"] == 4 and out["final_step"] == 8
  assert [r["step"] for r in _rows(wd)] == [2, 4, 6, 8]  # step 6 replayed, logged once
  first = json.loads((wd / "config.json").read_text())
  resumed = json.loads((wd / "config.resume-4.json").read_text())
  assert first["checkpoint"]["keep"] == 2 and resumed["checkpoint"]["keep"] == 3
  assert out["config_file"] == str(wd / "config.resume-4.json")


class _NoTargets(SyntheticIterator):
  def __next__(self):
    b = super().__next__()
    b["loss_weights"] = np.zeros_like(b["loss_weights"])
    return b


def test_batch_without_loss_tokens_stops_the_run(tmp_path):
  c = _tiny(log_every=0)
  c.checkpoint.every = 1
  with pytest.raises(trainer.EmptyBatchError,
                     match=r"step 1: no token of the batch carries loss weight.*_NoTargets.*"
                           r"train\.seq_len=32"):
    trainer.train(c, str(tmp_path), source=_NoTargets(4, 32, c.model.vocab_size))
  assert not (tmp_path / "checkpoints" / "1").exists()

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "data",
                   "trajectories.jsonl")


@pytest.fixture(scope="module")
def sp_model_512(tmp_path_factory):
  trajs = list(schema.read_jsonl(FIX))
  texts = []
  for t in trajs:
    texts += [x.action for x in t.turns] + [x.observation for x in t.turns]
    texts += [prompts.system_prompt(t, v) for v in range(12)]
  return tk.train_sentencepiece(texts, 480, tmp_path_factory.mktemp("sp") / "s")


def _sft_run(tmp_path, sp_model):
  """SFT on the fixture trajectories with _tiny's model."""
  c = sft_config.get_config("tiny")
  tiny = _tiny()
  c.model, c.train = tiny.model, tiny.train
  c.data.update(dict(source="pipeline", tokenizer=sp_model, thinking_target="empty"))
  c.data.pipeline.update(dict(jsonl=FIX, num_epochs=1, num_packing_bins=1))
  return c


def test_sft_log_says_the_think_block_is_empty(tmp_path, sp_model_512, caplog):
  c = _sft_run(tmp_path, sp_model_512)

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


class _Logged(SyntheticIterator):
  """Records each batch handed out in a shared event list."""

  def __init__(self, events, **kw):
    super().__init__(**kw)
    self.events = events

  def __next__(self):
    b = super().__next__()
    self.events.append(("batch", self.index))
    return b


def test_metrics_read_after_next_step_is_dispatched(tmp_path, monkeypatch):
  """Step N's loss is read on the host only once step N+1 has its batch and is queued, except
  where a checkpoint (every 4 steps here) or the last step needs it at once."""
  events = []
  real = trainer._checked_loss  # pylint: disable=protected-access

  def checked(m, step, *a):
    events.append(("read", step))
    return real(m, step, *a)

  monkeypatch.setattr(trainer, "_checked_loss", checked)
  c = _tiny(num_steps=6, log_every=0)
  c.checkpoint.every = 4
  out = trainer.train(c, str(tmp_path), train_iter=_Logged(events, batch=4, seq_len=32,
                                                           vocab=c.model.vocab_size))
  assert events == [("batch", 1), ("batch", 2), ("read", 1), ("batch", 3), ("read", 2),
                    ("batch", 4), ("read", 3), ("read", 4), ("batch", 5), ("batch", 6),
                    ("read", 5), ("read", 6)]
  assert len(out["losses"]) == 6 and np.isfinite(out["losses"]).all()
