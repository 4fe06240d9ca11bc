"""RL (GSPO) training config: `python launch/train.py --config=configs/rl.py:PRESET --workdir=DIR`.

Presets: tiny (the synthetic toy task, seconds on CPU: tests and smoke runs), demo (rollouts of
the demo-sized model on the bundled corpus's RL pool, minutes on CPU; set data.tokenizer and
init_from_hf to an SFT export, see experiments/gspo_vs_sft/), small, and the released sizes on
pods (qwen3_30b_a3b, qwen35_35b_a3b, qwen35_397b_a17b; start from an SFT checkpoint with
--config.init_from_hf=PATH and name a judge with --config.rl.judge_endpoint=URL). Every preset
but tiny samples its batches from the live policy (data.source="rollouts").
"""
from configs import common

# preset -> rollout shape (prompts per process, group size, updates per batch, reply tokens),
# matching the preset's train.batch_size on one process (pods: per process x processes)
ROLLOUTS = {
    "demo": dict(prompts_per_batch=8, group_size=4, updates_per_batch=4, max_new_tokens=160),
    "small": dict(prompts_per_batch=4, group_size=8, updates_per_batch=4, max_new_tokens=128),
    # pods: 16 prompts x 16 replies per process, 4 updates; the batch is per process x processes
    "qwen3_30b_a3b": dict(prompts_per_batch=16, group_size=16, updates_per_batch=4,
                          max_new_tokens=4096),
    "qwen35_35b_a3b": dict(prompts_per_batch=16, group_size=16, updates_per_batch=4,
                           max_new_tokens=4096),
    "qwen35_397b_a17b": dict(prompts_per_batch=16, group_size=16, updates_per_batch=4,
                             max_new_tokens=4096),
}


def get_config(arg: str | None = None):
  c = common.get_stage_config("rl", arg)
  # GSPO as in the paper: clip band [1 - 3e-4, 1 + 4e-4], no KL.
  c.rl.algo = "gspo"
  c.optim.lr = c.optim.lr / 10
  c.optim.warmup_steps = 0
  c.optim.weight_decay = 0.0
  preset = arg or "tiny"
  if preset in ROLLOUTS:
    r = ROLLOUTS[preset]
    c.rl.update(r)
    c.data.source = "rollouts"
    c.train.micro_batches = min(c.train.micro_batches,
                                r["prompts_per_batch"] * r["group_size"] // r["updates_per_batch"])
    if preset in ("demo", "small"):
      # no judge on a CPU: the rule verifier and the judge-free similarity
      c.rl.reward = "rule=0.5,reference=0.5"
      c.train.batch_size = r["prompts_per_batch"] * r["group_size"] // r["updates_per_batch"]
      c.train.seq_len = max(c.train.seq_len, 1024)  # room for v0 prompts with history
      c.train.eval_every = 10
      c.rl.eval_prompts = 32
    else:
      c.optim.lr = 1e-6
      c.train.eval_every = 50
      c.rl.eval_prompts = 256
      c.rl.engine.update(dict(chunk_steps=64))
  return c
