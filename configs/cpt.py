"""CPT training config: `python launch/train.py --config=configs/cpt.py:tiny --workdir=DIR`.

Presets: tiny (seconds on CPU), small (minutes on CPU), qwen3_30b_a3b (pods). See configs/common.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  pylint: disable=wrong-import-position


def get_config(arg: str | None = None):
  c = common.get_stage_config("cpt", arg)
  c.data.pipeline.loss_masking = True
  return c
