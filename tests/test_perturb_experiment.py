"""The perturb experiment's settings (configs/perturb_experiment.py, checked by
lwm_jax/recipe/perturb_experiment.py.resolve) against the absl flags they replaced. Its tables and
corpus pairing are tested in tests/test_reproduce.py."""
import os
import subprocess
import sys

import pytest

import configs
from configs import ConfigError, perturb_experiment as perturb_config
from lwm_jax.recipe import perturb_experiment as px

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "perturb_experiment.py")

# launch/perturb_experiment.py at 168644f, before its flags became configs/perturb_experiment.py:
# each flag's default (domains was ",".join(perturb.corpus_menu()), which is this).
OLD_FLAG_DEFAULTS = dict(
    start=os.path.join(REPO, "data", "world_model"), preset="demo",
    workdir=os.path.join(REPO, "runs", "perturb_vs_plain"),
    corpus=os.path.join(REPO, "data", "corpus"), domains="mcp,search,web", perturb_share=0.5,
    per_domain=0, thinking="auto", thinking_target="", long_prompts=True, sft_steps=120,
    sft_batch=8, sft_seq_len=1024, episodes=4, max_turns=6, max_tokens=192, temperature=1.0,
    batch=16, menu="", paired=False, reuse=False)


def test_the_config_keeps_the_old_flag_defaults():
  c = perturb_config.get_config()
  assert dict(c) == OLD_FLAG_DEFAULTS
  assert dict(perturb_config.get_config("default")) == OLD_FLAG_DEFAULTS
  for k, v in OLD_FLAG_DEFAULTS.items():                # same types: overrides parse as before
    assert type(c[k]) is type(v), k
  s = px.resolve(c)
  assert s.domains == ("mcp", "search", "web") and s.thinking == "auto"


def test_a_bad_variant_field_or_value_is_named(tmp_path):
  with pytest.raises(ConfigError, match="no variant 'defualt' \\(close matches: default\\); "
                                        "variants: default"):
    perturb_config.get_config("defualt")
  with pytest.raises(ConfigError, match="--config.sft_stpes: config has no field 'sft_stpes' "
                                        "\\(close matches: sft_steps"):
    configs.check_command_line(["perturb_experiment.py", f"--config={CONFIG}",
                                "--config.sft_stpes=3"])
  c = perturb_config.get_config()
  c.max_token = 8                                        # a field added in Python, not on the CLI
  with pytest.raises(ValueError, match="--config.max_token: configs/perturb_experiment.py has no "
                                       "field 'max_token' \\(close matches: max_tokens"):
    px.resolve(c)

  def bad(**over):
    c = perturb_config.get_config()
    c.update(over)
    return px.resolve(c)
  with pytest.raises(ValueError, match="--config.thinking: 'yes' is not one of auto, on, off"):
    bad(thinking="yes")
  with pytest.raises(ValueError, match="--config.thinking_target: 'answer' is not"):
    bad(thinking_target="answer")
  with pytest.raises(ValueError, match="--config.thinking_target=instruction needs thinking-mode"):
    bad(thinking_target="instruction", thinking="off")
  with pytest.raises(ValueError, match="--config.domains: 'desktop' has no real perturbations"):
    bad(domains="mcp,desktop")
  with pytest.raises(ValueError, match="--config.menu"):
    bad(menu="mcp=no_such_perturbation")
  # run() refuses before it makes the run folder
  c = perturb_config.get_config()
  c.update(domains="desktop", workdir=str(tmp_path / "wd"))
  with pytest.raises(SystemExit, match="--config.domains"):
    px.run(c)
  assert not (tmp_path / "wd").exists()


def test_the_launcher_names_a_bad_field_in_one_line(tmp_path):
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "perturb_experiment.py"),
                        f"--config={CONFIG}", f"--config.workdir={tmp_path / 'wd'}",
                        "--config.sft_stepz=3"],
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
                       env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
  assert "--config.sft_stepz: config has no field 'sft_stepz' (close matches: sft_steps" in \
      run.stderr
  assert not (tmp_path / "wd").exists()
