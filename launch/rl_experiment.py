"""GSPO with real rollouts against a "keep doing SFT" control, on one CPU, from the bundled corpus
(experiments/gspo_vs_sft): results.md, results.json, curves.csv and GSPO's reward.png in the run
folder.

The settings are configs/rl_experiment.py, each overridable field by field; the logic is
lwm_jax/recipe/rl_experiment.py.

  python launch/rl_experiment.py --config=configs/rl_experiment.py --config.rl_steps=96
  python launch/rl_experiment.py --config=configs/rl_experiment.py --config.start=data/world_model
"""
import os

from absl import app, flags

import configs
from lwm_jax.recipe import rl_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "rl_experiment.py")


def main(argv):
  del argv
  rl_experiment.run(flags.FLAGS.config)


if __name__ == "__main__":
  app.run(main, flags_parser=configs.flags_parser(
      CONFIG, "the settings: configs/rl_experiment.py"))
