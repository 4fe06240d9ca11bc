"""Agents trained inside the world model (BC only, Real RL, Sim RL, the paper's warm-up, BC from
the world model), scored on held-out tasks in the real environment (docs/agents.md): results.json,
results.md and success_vs_episodes.png in the run folder.

The settings are a variant of configs/agent_experiment.py (tiny, full), each overridable field
by field; the logic is lwm_jax/recipe/agent_experiment.py.

  python launch/agent_experiment.py --config=configs/agent_experiment.py:tiny
  python launch/agent_experiment.py --config=configs/agent_experiment.py:full \
      --config.world_model=WM_HF --config.tokenizer=WM_HF/tokenizer.model \
      --config.seeds=3 --config.arms=bc,real,sim,warmup,bc_from_wm
"""
import os
import sys

from absl import app, flags
from ml_collections import config_flags

import configs
from lwm_jax.recipe import agent_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "agent_experiment.py")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, after our own check of the variant and the override names (one line
  naming the field instead of a traceback). The flag is defined here, after the check: without
  --config, config_flags applies the overrides to the default as it defines the flag."""
  try:
    configs.check_command_line(argv, default=CONFIG)
    config_flags.DEFINE_config_file("config", CONFIG, "the settings: configs/agent_experiment.py"
                                    "[:tiny|full] (default tiny)", lock_config=True)
    return flags.FLAGS(argv)
  except (ValueError, flags.Error) as e:
    print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else repr(e)}",
          file=sys.stderr)
    sys.exit(2)


def main(argv):
  del argv
  agent_experiment.run(flags.FLAGS.config)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
