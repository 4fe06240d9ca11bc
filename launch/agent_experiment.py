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

from absl import app, flags

import configs
from lwm_jax.recipe import agent_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "agent_experiment.py")


def main(argv):
  del argv
  agent_experiment.run(flags.FLAGS.config)


if __name__ == "__main__":
  app.run(main, flags_parser=configs.flags_parser(
      CONFIG, "the settings: configs/agent_experiment.py[:tiny|full] (default tiny)"))
