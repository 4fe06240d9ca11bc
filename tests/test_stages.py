"""The stage registry (lwm_jax/stages.py): the trainer, its config check and the batch sources read
a stage's record, so a stage registered outside the library trains like a built-in one."""
import numpy as np
import pytest

from configs import common
from lwm_jax import stages
from lwm_jax.train import run_config, trainer


pytestmark = pytest.mark.usefixtures("jax_disk_cache")  # one compile per repeated step


def test_builtin_records_and_errors():
  assert stages.stage_names()[:5] == ("cpt", "sft", "rl", "agent-bc", "agent-rl")
  assert trainer.step_kind("cpt") is trainer.XENT and trainer.step_kind("rl") is trainer.POLICY
  assert stages.get_stage("rl").kl_reference and stages.get_stage("agent-rl").kl_reference
  assert not stages.get_stage("agent-bc").kl_reference
  with pytest.raises(ValueError, match=r"unknown stage 'stf' \(did you mean 'sft'\?\)"):
    stages.get_stage("stf")
  with pytest.raises(ValueError, match="step 'adam' is not one of xent, policy"):
    stages.Stage("x", "adam")
  with pytest.raises(ValueError, match="stage 'cpt' is already registered"):
    stages.register_stage(stages.Stage("cpt", "policy"))
  c = common.get_stage_config("cpt", "tiny")
  c.stage = "stf"
  with pytest.raises(ValueError, match=r"config\.stage: unknown stage 'stf'"):
    run_config.validate_config(c)


@pytest.mark.slow  # two short training runs: `make test-slow` (CI runs it) keeps `make test` under 8 minutes
def test_a_registered_stage_trains_through_the_one_trainer(tmp_path):
  """A stage defined here, never named in the library: the CPT step on synthetic counting rows.
  Its run equals the same run under the built-in cpt stage, loss for loss."""
  stages.register_stage(stages.Stage("test-cpt-twin", "xent", rows="cpt"))

  def run(stage, where):
    c = common.get_stage_config("cpt", "tiny")
    c.stage = stage
    c.data.source = "synthetic"
    c.train.update(num_steps=3, batch_size=2, seq_len=16, log_every=0, eval_every=0,
                   progress=False)
    c.checkpoint.update(every=0, use_async=False)
    return trainer.train(c, str(tmp_path / where))["losses"]

  twin, cpt = run("test-cpt-twin", "twin"), run("cpt", "cpt")
  np.testing.assert_allclose(twin, cpt, rtol=0, atol=0)
  assert len(twin) == 3 and len(set(twin)) == 3  # three real steps, not one loss repeated


def _toy_rollouts(config):
  return ("built for", config.stage)


def test_a_policy_stage_names_its_rollout_source():
  import importlib  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel
  for name in ("rl", "agent-rl"):  # the bundled policy stages name factories that exist
    module, _, function = stages.get_stage(name).rollouts.partition(":")
    assert callable(getattr(importlib.import_module(module), function))
  stages.register_stage(stages.Stage("toy-policy", "policy", policy=True,
                                     needs_trajectories=False,
                                     rollouts="tests.test_stages:_toy_rollouts"))
  c = ml_collections.ConfigDict({"stage": "toy-policy", "data": {"source": "rollouts"}})
  assert stages.rollout_source(c) == ("built for", "toy-policy")
  c.data.source = "pipeline"
  assert stages.rollout_source(c) is None  # the trainer builds the other sources itself
  c.stage, c.data.source = "cpt", "rollouts"
  with pytest.raises(ValueError, match="names no rollout source"):
    stages.rollout_source(c)
