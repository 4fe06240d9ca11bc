"""The recipe end to end on the bundled corpus at CPU scale, every stage evaluated free-running
(`make reproduce`; docs/reproduce.md): tokenizer, CPT, SFT (optionally GSPO), free-running
evaluation, report.md and report.json in the run folder.

The settings are a preset of configs/reproduce.py (tiny, full, ablation), each overridable field
by field; the logic is lwm_jax/recipe/reproduce.py.

  python launch/reproduce.py --config=configs/reproduce.py:tiny --config.workdir=runs/reproduce_tiny
  python launch/reproduce.py --config=configs/reproduce.py:full --config.cpt_steps=2000
  python launch/reproduce.py --config=configs/reproduce.py:tiny --plan_only   # plan.json only
"""
import os
import sys

from absl import app, flags

import configs
from lwm_jax.recipe import reproduce

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "reproduce.py")
flags.DEFINE_bool("plan_only", False, "write plan.json (the resolved settings and each run's "
                  "config) and stop before training")


def main(argv):
  del argv
  reproduce.run(flags.FLAGS.config, plan_only=flags.FLAGS.plan_only,
                command=" ".join(sys.argv))


if __name__ == "__main__":
  app.run(main, flags_parser=configs.flags_parser(
      CONFIG, "the settings: configs/reproduce.py[:tiny|full|ablation] (default full)"))
