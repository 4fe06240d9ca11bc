"""Agent behaviour cloning: `python launch/train.py --config=configs/agent_bc.py:PRESET
--workdir=DIR --config.data.tokenizer=TOKENIZER`.

The policy learns the scripted agents' actions of the bundled corpus (stage "agent-bc",
lwm_jax/data/agent_targets.py): task, action space and history are context, the loss is on the
actions (and the final `finish()`) only. The data defaults to one domain's training and validation
files (`data.pipeline.jsonl`, `data.eval_jsonl`; search, the domain of the agent experiment,
docs/agents.md), every recorded turn cloned; to clone each trajectory only up to the turn that
meets its task, cut the files first (`python launch/data.py goal-cut --inputs=FILE --out=CUT`,
docs/agents.md) and point `data.pipeline.jsonl` at the output. Presets as for SFT: tiny (seconds on CPU), demo (the demo model, minutes on CPU),
small, and the released sizes on pods (start from a checkpoint with --config.init_from_hf=PATH).
"""
import os

from configs import common

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "corpus")

# preset -> (seq_len, batch_size): agent samples hold the whole history before an action
SHAPES = {"tiny": (512, 4), "demo": (1024, 8), "small": (1024, 8)}


def get_config(arg: str | None = None):
  preset = arg or "tiny"
  c = common.get_stage_config("agent-bc", preset)
  c.data.source = "pipeline"
  c.data.pipeline.jsonl = os.path.join(CORPUS, "search_train.jsonl.gz")
  c.data.eval_jsonl = os.path.join(CORPUS, "search_validation.jsonl.gz")
  # "turns": one sample per action (history before it as context); "trajectory": one per episode
  c.data.pipeline.agent_layout = "turns"
  # a sample over the limit keeps its newest history (its oldest turns are dropped and counted)
  c.data.pipeline.overlong = "truncate_history"
  if preset in SHAPES:
    c.train.seq_len, c.train.batch_size = SHAPES[preset]
  c.optim.lr = c.optim.lr / 3
  return c
