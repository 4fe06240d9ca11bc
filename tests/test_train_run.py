"""A training run's files and settings: metrics rows past a restart's step, per-resume config
files, one-line command-line errors, config.sharding.rules reaching the parameters, and SFT's
thinking target following the config. (Trainer runs themselves are in test_train_loop.py.)"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import configs
from configs import cpt as cpt_config
from configs import sft as sft_config
from lwm_jax.data import prompts, schema
from lwm_jax.data import tokenizer as tk
from lwm_jax.train import metrics, run_config, sources

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "data", "trajectories.jsonl")


def _tiny():
  c = cpt_config.get_config("tiny")
  c.model.update(dict(num_hidden_layers=1, num_experts=4))
  return c


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


def _event_scalars(path) -> list[tuple[int, str, float]]:
  """(step, tag, value) of every scalar in a TensorBoard event file, read record by record
  (TFRecord framing: 8-byte length, 4-byte CRC, the Event proto, 4-byte CRC)."""
  from tensorboardX.proto import event_pb2
  data, i, out = path.read_bytes(), 0, []
  while i < len(data):
    n = int.from_bytes(data[i:i + 8], "little")
    event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
    out += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
    i += 12 + n + 4
  return out


def test_tensorboard_event_file_holds_every_scalar(tmp_path):
  """The TensorBoard writer (imported with torch hidden, see test_train_distributed) still writes
  each scalar of a row to the event file, next to the metrics.jsonl row."""
  w = metrics.MetricsWriter(str(tmp_path))
  w.write(7, {"loss": 1.25, "lr": 0.5})
  w.close()
  (events,) = (tmp_path / "tensorboard").iterdir()
  assert _event_scalars(events) == [(7, "train/loss", 1.25), (7, "train/lr", 0.5)]
  assert [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
      {"step": 7, "split": "train", "loss": 1.25, "lr": 0.5}]


def test_same_config_on_resume_writes_no_second_file(tmp_path):
  resolved = {"optim": {"lr": 1e-3}, "train": {"num_steps": 8}}
  assert run_config.save_run_config(str(tmp_path), resolved, 0) == str(tmp_path / "config.json")
  assert run_config.save_run_config(str(tmp_path), resolved, 4) == str(tmp_path / "config.json")
  assert sorted(os.listdir(tmp_path)) == ["config.json"]


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
  }
  procs = {k: subprocess.Popen([sys.executable, "launch/train.py", *k.split(), "--workdir=/tmp/x"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for k in cases}
  for args, want in cases.items():
    _, err = procs[args].communicate(timeout=300)
    assert procs[args].returncode == 2, (args, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {want}"), (args, err[-2000:])


def test_unknown_section_is_named():
  with pytest.raises(configs.ConfigError,
                     match=r"^--config\.trian\.seq_len: config has no field 'trian' "
                           r"\(close matches: train\)$"):
    configs.check_command_line(["train.py", "--config=configs/cpt.py:tiny",
                                "--config.trian.seq_len=8"])


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

  c = cpt.get_config("tiny")
  c.model.update(dict(num_hidden_layers=1, num_experts=4))
  c.train.update(dict(num_steps=1, batch_size=4, seq_len=16, log_every=0, progress=False))
  c.mesh.update(dict(data=1, fsdp=2))
  # not the default layout (vocab -> tensor, embed -> fsdp): the vocabulary split over fsdp
  c.sharding.rules = (("vocab", "fsdp"), ("embed", None))
  try:
    trainer.train(c, sys.argv[1], source=Spy())
  except Seen as e:
    out = json.loads(str(e))
  print("RESULT", json.dumps(out))
""")


@pytest.mark.slow  # a subprocess on a mesh of 2 host devices: `make test-slow`
def test_sharding_rules_from_the_config_place_the_parameters(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  p = subprocess.run([sys.executable, "-c", RULES, str(tmp_path)], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")]
  assert p.returncode == 0 and line, p.stderr[-3000:]
  res = json.loads(line[0][len("RESULT "):])
  # embed_tokens is (vocab, embed); the default rules would give [None, "fsdp"] on this mesh
  assert res == ["fsdp", None]


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
  c.data.pipeline.update(dict(jsonl=str(path), num_epochs=1, num_packing_bins=1,
                              overlong="truncate_history"))  # one record: never drop it
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


def test_copy_drill_is_trained_on_but_never_validated_on(tmp_path, sp_model):
  """A CPT run with the copy drill mixed in (data.pipeline.drill_share) feeds drill samples to
  training; its validation batches hold the held-out trajectories only."""
  c = cpt_config.get_config("tiny")
  c.model.update(dict(vocab_size=640, num_hidden_layers=1, num_experts=4))
  c.train.update(dict(batch_size=2, seq_len=256, log_every=0, progress=False))
  c.data.update(dict(source="pipeline", tokenizer=sp_model, eval_jsonl=FIX))
  c.data.pipeline.update(dict(jsonl=FIX, num_packing_bins=1, drill_share=0.5, drill_rows="32"))
  source, evals, _ = sources.pipeline_source(c, run_config.validate_config(c), "cpt")
  for _ in range(4):
    source.next_batch(None)
  ev = evals()
  for _ in range(4):
    next(ev)
  assert source.it.stats["drill_tokens"] > 0
  assert ev.stats["drill_tokens"] == 0 and ev.stats["tokens"] > 0
