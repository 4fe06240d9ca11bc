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
from ml_collections import config_flags

import configs
from lwm_jax.recipe import perturb_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
config_flags.DEFINE_config_file("config", os.path.join(ROOT, "configs", "perturb_experiment.py"),
                                "the settings: configs/perturb_experiment.py", lock_config=True)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, after our own check of the override names (one line naming the field
  instead of a traceback)."""
  try:
    configs.check_command_line(argv)
    return flags.FLAGS(argv)
  except (ValueError, flags.Error) as e:
    print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else repr(e)}",
          file=sys.stderr)
    sys.exit(2)


def main(argv):
  del argv
  perturb_experiment.run(flags.FLAGS.config, command=" ".join(
      ["python launch/perturb_experiment.py"] + sys.argv[1:]))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
