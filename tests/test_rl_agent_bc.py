"""Agent behaviour cloning through the trainer (stage "agent-bc", configs/agent_bc.py): the batches
of the bundled corpus carry loss weight only on the scripted agent's actions (and finish()), and a
few steps train; the agent-rl config resolves to a source with the corpus-free checks."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from configs import agent_bc, agent_rl
from lwm_jax.data import agent_targets as at
from lwm_jax.data import schema
from lwm_jax.data import tokenizer as tk
from lwm_jax.model.config import ModelConfig
from lwm_jax.rl import agent_stage
from lwm_jax.train import run_config, sources, trainer


def corpus(n: int = 40) -> list[schema.Trajectory]:
  c = agent_bc.get_config("tiny")
  return list(schema.read_jsonl(c.data.pipeline.jsonl))[:n]


@pytest.fixture(scope="module")
def sp(tmp_path_factory):
  texts = []
  for t in corpus():
    texts.append(at.agent_system_prompt(t))
    texts += [x.action for x in t.turns] + [at.observation_message(x.observation) for x in t.turns]
  return tk.train_sentencepiece(texts, 700, tmp_path_factory.mktemp("sp") / "s")


def config(sp: str):
  c = agent_bc.get_config("tiny")
  c.data.tokenizer = sp
  c.model.vocab_size = 768
  c.train.update(dict(num_steps=2, log_every=1, eval_every=0, progress=False))
  c.checkpoint.every = 2
  return c


def test_agent_bc_batches_weigh_only_actions(sp):
  c = config(sp)
  model_cfg = run_config.validate_config(c)
  tok = tk.load_tokenizer(sp)
  src, _, _ = sources.pipeline_source(c, model_cfg, "agent-bc")
  actions = {x.action.strip() for t in schema.read_jsonl(c.data.pipeline.jsonl) for x in t.turns}
  actions.add(at.FINISH_ACTION)
  runs = 0
  for _ in range(2):
    b = src.next_batch(None)
    assert b["tokens"].shape == (4, 512)
    for ids, w in zip(b["tokens"], b["loss_weights"]):
      cur: list[int] = []
      for t, x in zip(list(ids) + [0], list(w) + [0.0]):
        if x > 0:
          cur.append(int(t))
        elif cur:
          assert cur[-1] == tok.im_end_id  # the action and its end marker
          assert tok.decode(cur[:-1]).strip() in actions, tok.decode(cur)
          runs, cur = runs + 1, []
  assert runs >= 8


def test_goal_cut_writes_each_trajectory_up_to_its_goal(tmp_path):
  """`launch/data.py goal-cut`, as a user runs it before BC: each trajectory up to the turn that
  opens its target document (the search task's goal), the counts printed; the trainer itself
  never starts an environment (the config carries no cut)."""
  assert "agent_until" not in agent_bc.get_config("tiny").data.pipeline
  trajs = corpus(12)
  src, out = tmp_path / "in.jsonl", tmp_path / "cut.jsonl.gz"
  schema.write_jsonl(src, trajs)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = subprocess.run([sys.executable, os.path.join(root, "launch", "data.py"), "goal-cut",
                        f"--inputs={src}", f"--out={out}"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": root})
  assert run.returncode == 0, run.stderr
  cut = list(schema.read_jsonl(out))
  expect = []
  for whole in trajs:
    target = whole.meta["target_doc"]
    opened = [i for i, x in enumerate(whole.turns) if x.observation.startswith(f"[{target}] page ")]
    expect.append(opened[0] + 1 if opened else len(whole.turns))
  assert [t.id for t in cut] == [t.id for t in trajs]
  assert [len(t.turns) for t in cut] == expect
  n_cut = sum(e < len(t.turns) for e, t in zip(expect, trajs))
  assert n_cut >= 6
  assert f"12 trajectories -> {out}: {n_cut} cut at their goal" in run.stdout, run.stdout


@pytest.mark.slow  # heavy: `make test-slow` (CI runs it after `make test`) keeps `make test` under 8 minutes
def test_agent_bc_trains_through_the_trainer(sp, tmp_path):
  s = trainer.train(config(sp), str(tmp_path / "bc"))
  assert s["final_step"] == 2 and all(np.isfinite(s["losses"]))
  assert (tmp_path / "bc" / "metrics.jsonl").exists()


def test_stages_and_agent_rl_config_checks(sp):
  from lwm_jax import stages
  assert {"agent-bc", "agent-rl"} <= set(stages.stage_names())
  assert trainer.step_kind("agent-bc") is trainer.XENT
  c = agent_rl.get_config("tiny")
  c.data.tokenizer = sp
  c.model.vocab_size = 768
  assert isinstance(run_config.validate_config(c), ModelConfig)  # no corpus needed
  ac = agent_stage.agent_config(c)
  assert ac.domain == "search" and ac.minibatch_size == c.train.batch_size
  assert ac.batch_size == 4 * c.train.batch_size  # 4 updates per rollout (issue 64)
  c.agent.arm = "dream"
  with pytest.raises(ValueError, match="config.agent.arm"):
    agent_stage.agent_config(c)
  c.agent.arm, c.train.batch_size = "real", 3
  with pytest.raises(ValueError, match="config.train.batch_size"):
    agent_stage.agent_config(c)
  c.train.batch_size, c.agent.arm, c.agent.world_model = 2, "sim", "/nonexistent"
  with pytest.raises(ValueError, match="config.agent.world_model"):
    agent_stage.agent_source(c)
