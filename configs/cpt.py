"""CPT training config: `python launch/train.py --config=configs/cpt.py:tiny --workdir=DIR`.

Presets: tiny (seconds on CPU), small (minutes on CPU), demo (launch/demo.py), qwen3_30b_a3b and
the Qwen3.5 sizes (pods). See configs/common.py.
"""
from configs import common


def get_config(arg: str | None = None):
  c = common.get_stage_config("cpt", arg)
  c.data.pipeline.loss_masking = True
  return c
