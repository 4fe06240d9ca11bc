"""SFT training config: `python launch/train.py --config=configs/sft.py:tiny --workdir=DIR`.

Presets: tiny (seconds on CPU), small (minutes on CPU), demo (launch/demo.py), qwen3_30b_a3b and
the Qwen3.5 sizes (pods). See configs/common.py.
"""
from configs import common


def get_config(arg: str | None = None):
  c = common.get_stage_config("sft", arg)
  c.data.pipeline.thinking = True
  # Targets are <think></think> + the observation: no trajectory carries reasoning yet
  # (see configs/common.py, data.thinking_target).
  c.data.thinking_target = "empty"
  c.optim.lr = c.optim.lr / 3
  return c
