"""SFT training config: `python launch/train.py --config=configs/sft.py:tiny --workdir=DIR`.

Presets: tiny (seconds on CPU), small (minutes on CPU), qwen3_30b_a3b (pods). See configs/common.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  pylint: disable=wrong-import-position


def get_config(arg: str | None = None):
  c = common.get_stage_config("sft", arg)
  c.data.pipeline.thinking = True
  c.optim.lr = c.optim.lr / 3
  return c
