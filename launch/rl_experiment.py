"""GSPO with real rollouts against a "keep doing SFT" control, on one CPU, from the bundled corpus
(experiments/gspo_vs_sft): results.md, results.json, curves.csv and GSPO's reward.png in the run
folder.

The settings are configs/rl_experiment.py, each overridable field by field; the logic is
lwm_jax/recipe/rl_experiment.py.

  python launch/rl_experiment.py --config=configs/rl_experiment.py --config.rl_steps=96
  python launch/rl_experiment.py --config=configs/rl_experiment.py --config.start=data/world_model
"""
import os
import sys

from absl import app, flags
from ml_collections import config_flags

import configs
from lwm_jax.recipe import rl_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "rl_experiment.py")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, after our own check of the variant and the override names (one line
  naming the field instead of a traceback). The flag is defined here, after the check: without
  --config, config_flags applies the overrides to the default as it defines the flag."""
  try:
    configs.check_command_line(argv, default=CONFIG)
    config_flags.DEFINE_config_file("config", CONFIG, "the settings: configs/rl_experiment.py",
                                    lock_config=True)
    return flags.FLAGS(argv)
  except (ValueError, flags.Error) as e:
    print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else repr(e)}",
          file=sys.stderr)
    sys.exit(2)


def main(argv):
  del argv
  rl_experiment.run(flags.FLAGS.config)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
