"""RL training config: `python launch/train.py --config=configs/rl.py:tiny --workdir=DIR`.

Presets: tiny (seconds on CPU), small (minutes on CPU), demo (launch/demo.py), qwen3_30b_a3b and
the Qwen3.5 sizes (pods). See configs/common.py.
"""
from configs import common


def get_config(arg: str | None = None):
  c = common.get_stage_config("rl", arg)
  # GSPO as in the paper: clip band [1 - 3e-4, 1 + 4e-4], no KL; a few steps for the synthetic task.
  c.rl.algo = "gspo"
  c.optim.lr = c.optim.lr / 10
  c.optim.warmup_steps = 0
  c.optim.weight_decay = 0.0
  return c
