"""The RL stage through the trainer (`configs/rl.py` with data.source="rollouts"): rollouts from
the live policy feed GSPO updates, rollout figures and held-out metrics reach metrics.jsonl, a
resumed run repeats the uninterrupted one exactly (rewards and losses), and two processes on
loopback (gloo) give the one-process run's rewards and losses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from configs import rl as rl_config
from lwm_jax.data.jsonl import iter_jsonl
from lwm_jax.sampling.background import free_port
from lwm_jax.train import trainer
from tests.conftest import xla_env
from tests.test_rl_pool import many_trajs, train_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("rl_data")
  train_tokenizer(d)
  trajs = many_trajs(2)
  with open(d / "train.jsonl", "w") as f:
    for t in trajs:
      f.write(json.dumps(t.to_dict()) + "\n")
  with open(d / "held.jsonl", "w") as f:
    for t in many_trajs(1)[:3]:
      f.write(json.dumps({**t.to_dict(), "id": t.id + "-held"}) + "\n")
  return d


def config(data, steps=4, prompts=2, updates=2):
  c = rl_config.get_config("tiny")
  c.data.source = "rollouts"
  c.data.tokenizer = str(data / "sp.model")
  c.data.pipeline.jsonl = str(data / "train.jsonl")
  c.model.num_hidden_layers = 1
  c.model.num_experts = 4
  c.rl.update(dict(prompts_per_batch=prompts, group_size=2, updates_per_batch=updates,
                   max_new_tokens=8, temperature=1.0, reward="reference=0.5,rule=0.5",
                   pool_fractions="rl=1.0", filter_zero_variance=False, eval_prompts=2,
                   eval_max_new_tokens=8, eval_jsonl=str(data / "held.jsonl")))
  c.rl.engine.update(dict(chunk_steps=8, min_prompt_bucket=512, prefill_chunk=512,
                          min_cache_len=1024))
  c.optim.lr = 3e-3  # large enough that the policy visibly moves within a rollout
  c.train.update(dict(num_steps=steps, batch_size=prompts * 2 // updates, seq_len=1024,
                      log_every=1, eval_every=2, progress=False))
  c.checkpoint.update(every=2, use_async=False)
  return c


def run(c, workdir):
  from lwm_jax.rl import stage
  return trainer.train(c, str(workdir), source=stage.rollout_source(c))


def rows(workdir, split="train"):
  return [r for _, r in iter_jsonl(workdir / "metrics.jsonl") if r["split"] == split]


@pytest.mark.slow
def test_rl_run_logs_rollouts_evaluates_and_resumes_exactly(data, tmp_path):
  c = config(data)
  c.train.eval_every = 4
  out = run(c, tmp_path / "a")
  train_rows = rows(tmp_path / "a")
  assert len(train_rows) == 4
  r = train_rows[1]
  for k in ("rollout/rollout_s", "rollout/reward_s", "rollout/reward_mean", "rollout/reward_rule",
            "rollout/reward_reference", "rollout/response_len", "rollout/zero_variance_groups",
            "clip_frac", "ratio_mean", "ratio_min", "ratio_max", "entropy"):
    assert k in r, k
  # step 1 is the rollout's first update (on-policy, ratio 1); step 2 sees a moved policy
  assert train_rows[0]["ratio_min"] == pytest.approx(1, abs=1e-4)
  assert train_rows[0]["ratio_max"] == pytest.approx(1, abs=1e-4)
  assert abs(train_rows[1]["ratio_mean"] - 1) > 1e-6
  evals = rows(tmp_path / "a", "eval")
  assert [e["step"] for e in evals] == [0, 4]   # the start, then every eval_every steps
  assert {"reward_mean", "token_f1", "edit_sim", "parses", "reward_rule"} <= set(evals[0])
  assert os.path.exists(out["reward_png"])
  # A run stopped after step 2 and resumed gives the same rollouts, rewards and losses (and
  # without the held-out evaluations: they leave the rollouts alone).
  c = config(data)
  c.rl.eval_jsonl, c.train.stop_after = "", 2
  run(c, tmp_path / "b")
  c.train.stop_after = 0
  again = run(c, tmp_path / "b")
  assert again["start_step"] == 2
  resumed = rows(tmp_path / "b")
  assert [x["step"] for x in resumed] == [1, 2, 3, 4]
  for a, b in zip(train_rows, resumed):
    for k in ("loss", "rollout/reward_mean", "rollout/response_len", "ratio_mean"):
      assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6), (a["step"], k)
  assert np.allclose(out["losses"][2:], again["losses"], rtol=1e-5, atol=1e-7)


WORKER = textwrap.dedent("""
  import json, sys, pathlib
  from tests.test_rl_train import config, run
  c = config(pathlib.Path(sys.argv[5]), steps=2, prompts=1, updates=1)
  c.train.batch_size = 4  # 2 rows from each process
  c.rl.eval_jsonl = ""
  c.dist.update(dict(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]),
                     timeout_s=60, cpu_collectives="gloo"))
  out = run(c, sys.argv[3])
  print("RESULT", json.dumps(dict(losses=out["losses"])))
""")


@pytest.mark.slow
def test_two_processes_agree_with_one(data, tmp_path):
  """Two processes each sample one prompt's group; one process samples both: the same rewards
  (the seeds follow the prompt's slot in the global batch) and the same GSPO losses."""
  c = config(data, steps=2, prompts=2, updates=1)
  c.rl.eval_jsonl = ""
  one = run(c, tmp_path / "one")
  one_rows = rows(tmp_path / "one")
  addr = f"127.0.0.1:{free_port()}"
  env = xla_env(1, PYTHONPATH=ROOT)
  procs = [subprocess.Popen([sys.executable, "-c", WORKER, addr, str(i), str(tmp_path / "two"),
                             ROOT, str(data)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT) for i in range(2)]
  results = []
  for p in procs:
    o, e = p.communicate(timeout=300)
    line = [x for x in o.splitlines() if x.startswith("RESULT")]
    assert p.returncode == 0 and line, e[-3000:]
    results.append(json.loads(line[0][len("RESULT "):]))
  assert results[0]["losses"] == pytest.approx(results[1]["losses"], abs=1e-6)
  assert results[0]["losses"] == pytest.approx(one["losses"], abs=1e-5)
  two_rows = rows(tmp_path / "two")  # written by process 0: its own share's rollout figures
  assert len(two_rows) == 2 and len(one_rows) == 2


MESHES = textwrap.dedent("""
  import json, sys
  from configs import rl
  from lwm_jax import sharding as shd
  out = {}
  for p in ("qwen3_30b_a3b", "qwen35_35b_a3b", "qwen35_397b_a17b"):
    m = shd.make_mesh(**rl.get_config(p).mesh.to_dict())
    out[p] = dict(m.shape)
  print("RESULT", json.dumps(out))
""")


def test_presets_resolve_for_the_released_sizes():
  """Every RL preset passes the trainer's checks with its rollout shape; the pod presets sample
  from the policy, split experts 8 (397B: 16) ways and FSDP the rest of a 32-device mesh."""
  from lwm_jax.rl import stage
  from lwm_jax.train import run_config
  for p in ("demo", "small", "qwen3_30b_a3b", "qwen35_35b_a3b", "qwen35_397b_a17b"):
    c = rl_config.get_config(p)
    assert c.data.source == "rollouts" and c.rl.updates_per_batch == 4, p
    c.data.tokenizer = __file__  # any existing file: the path check only
    c.data.pipeline.jsonl = "x.jsonl"
    run_config.validate_config(c)
    rc = stage.rollout_config(c)
    processes = c.train.batch_size // rc.minibatch_size
    assert processes >= 1 and stage.rollout_config(c, processes).batch_size == (
        c.rl.prompts_per_batch * c.rl.group_size), p
  assert rl_config.get_config("tiny").data.source == "synthetic"  # the toy task stays
  p = subprocess.run([sys.executable, "-c", MESHES, ROOT], env=xla_env(32, PYTHONPATH=ROOT),
                     capture_output=True, text=True, timeout=300, cwd=ROOT)
  line = [x for x in p.stdout.splitlines() if x.startswith("RESULT")]
  assert p.returncode == 0 and line, p.stderr[-3000:]
  shapes = json.loads(line[0][len("RESULT "):])
  assert shapes["qwen3_30b_a3b"] == {"data": 1, "fsdp": 4, "expert": 8, "tensor": 1}
  assert shapes["qwen35_397b_a17b"] == {"data": 1, "fsdp": 2, "expert": 16, "tensor": 1}
