"""GSPO against a keep-doing-SFT control (lwm_jax/recipe/rl_experiment.py over
configs/rl_experiment.py) without training: the config against the old launcher's flag defaults,
and bad fields and values named. (The --config.start check: tests/test_reproduce.py.)"""
import os

import pytest

from configs import ConfigError, rl_experiment as experiment_config
from lwm_jax.recipe import rl_experiment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "rl_experiment.py")

# launch/rl_experiment.py before issue 65: its flags' defaults, quoted
OLD_FLAG_DEFAULTS = dict(workdir=os.path.join(REPO, "runs", "gspo_vs_sft"),
                         corpus=os.path.join(REPO, "data", "corpus"),
                         fractions="cpt=0.45,sft=0.35,rl=0.2", vocab=2048, cpt_steps=80,
                         sft_steps=40, rl_steps=48, max_new_tokens=160, eval_prompts=48,
                         curve_prompts=16, rl_lr=3e-4, reuse_start=False, start="",
                         overwrite=False)
# the flags results.json recorded under settings.flags, in this order
OLD_RECORDED = ("workdir", "corpus", "fractions", "vocab", "cpt_steps", "sft_steps", "rl_steps",
                "max_new_tokens", "eval_prompts", "curve_prompts", "rl_lr", "start",
                "reuse_start")


def test_the_config_keeps_the_old_flag_defaults():
  c = experiment_config.get_config()
  assert dict(c) == OLD_FLAG_DEFAULTS
  for k, v in OLD_FLAG_DEFAULTS.items():  # the same types: the recorded JSON is unchanged
    assert type(c[k]) is type(v), k
  assert dict(experiment_config.get_config("default")) == OLD_FLAG_DEFAULTS
  assert experiment_config.RECORDED == OLD_RECORDED
  assert rl_experiment.resolve(c) == OLD_FLAG_DEFAULTS


def test_a_bad_variant_field_or_value_is_named(tmp_path):
  import configs
  with pytest.raises(ConfigError, match="no variant 'tiny'.*variants: default"):
    experiment_config.get_config("tiny")
  with pytest.raises(ConfigError, match="--config.rl_stpes: config has no field 'rl_stpes' "
                                        "\\(close matches: rl_steps"):
    configs.check_command_line(["rl_experiment.py", "--config.rl_stpes=3"], default=CONFIG)
  c = experiment_config.get_config()
  c.rl_stpes = 3                                         # a field added in Python, not on the CLI
  with pytest.raises(SystemExit, match="--config.rl_stpes: configs/rl_experiment.py has no field "
                                       "'rl_stpes' \\(close matches: rl_steps"):
    rl_experiment.resolve(c)
  for over, says in ((dict(corpus=str(tmp_path / "none")), "--config.corpus: no train and test"),
                     (dict(fractions="cpt=2"), "--config.fractions=cpt=2: "),
                     (dict(rl_steps=0), "--config.rl_steps must be at least 1, got 0"),
                     (dict(rl_lr=-1.0), "--config.rl_lr must be > 0"),
                     (dict(start=str(tmp_path)), "config.json is missing")):
    c = experiment_config.get_config()
    c.update(over)
    with pytest.raises(SystemExit, match=says):
      rl_experiment.resolve(c)
