"""Does a world model learn to follow simulation instructions from perturbed real trajectories?
Two SFT runs from the same start at equal compute, one on a corpus copy with half its episodes
played under a perturbation and one on a copy without any, then the instruction fidelity of the
start and of both runs: results.md, results.json and fidelity.png in the run folder
(docs/perturbations.md).

The settings are configs/perturb_experiment.py, each overridable field by field; the logic is
lwm_jax/recipe/perturb_experiment.py.

  python launch/perturb_experiment.py --config=configs/perturb_experiment.py
  python launch/perturb_experiment.py --config=configs/perturb_experiment.py \\
      --config.start=data/world_model --config.workdir=runs/perturb_vs_plain --config.paired=True
"""
import os
import sys

from absl import app, flags

import configs
from lwm_jax.recipe import perturb_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "perturb_experiment.py")


def main(argv):
  del argv
  perturb_experiment.run(flags.FLAGS.config, command=" ".join(
      ["python launch/perturb_experiment.py"] + sys.argv[1:]))


if __name__ == "__main__":
  app.run(main, flags_parser=configs.flags_parser(
      CONFIG, "the settings: configs/perturb_experiment.py"))
