"""Shared training config and presets (`tiny`, `small`, `demo`, pod sizes) for
configs/{cpt,sft,rl}.py.

Sections: model (ModelConfig fields), mesh, sharding (logical-axis rules), optim, train,
checkpoint, data (the Grain pipeline's fields plus `source`, `tokenizer` and `thinking_target`),
rl, dist. Every field can be overridden on the command line, e.g.
`--config.train.num_steps=100 --config.model.num_hidden_layers=4`.
"""
from __future__ import annotations

import ml_collections

from configs import ConfigError, close_matches
from lwm_jax import sharding
from lwm_jax.model.config import get_preset


def _pod(model: str, *, topology: str, batch_size: int, seq_len: int, micro_batches: int,
         lr: float, expert: int = 8, checkpoint_every: int = 500,
         ep_capacity_factor: float = 2.0, attention_backward: str = "auto") -> tuple[str, dict]:
  """A preset for a released size on a pod: experts split `expert` ways, parameters FSDP over the
  rest of the devices, rematerialised and scanned layers (one compiled layer body: compile time
  flat in depth, docs/pods.md), automatic precision; sized for `topology`.

  The expert exchange's buffers hold twice a device's even share of its tokens for each
  destination (`ep_capacity_factor=2`; a token past that is dropped and counted in the
  `dropped_tokens` metric). Dropless buffers are sized for every token going to one device: on
  the hybrid preset they made 8x the rows the experts need, in memory and in the grouped matmul,
  and the step needed 96 GiB a chip; with 2x, 75 GiB and 2.1x fewer FLOPs
  (benchmarks/results/pods.md)."""
  return (model, dict(
      topology=topology,
      train=dict(num_steps=10000, batch_size=batch_size, seq_len=seq_len,
                 micro_batches=micro_batches, log_every=10, eval_every=500, eval_batches=8,
                 precision="auto"),
      optim=dict(lr=lr, warmup_steps=100),
      mesh=dict(data=1, fsdp=-1, expert=expert, tensor=1),
      checkpoint=dict(every=checkpoint_every, keep=3),
      model=dict(remat=True, scan_layers=True, ep_capacity_factor=ep_capacity_factor,
                 attention_backward=attention_backward)))


# name -> (model preset, overrides of train/optim/mesh/checkpoint)
PRESETS = {
    # seconds on one CPU: synthetic data unless data.source says otherwise
    "tiny": ("tiny", dict(train=dict(num_steps=40, batch_size=8, seq_len=64, log_every=5,
                                     eval_every=20, eval_batches=2),
                          optim=dict(lr=3e-3, warmup_steps=5),
                          checkpoint=dict(every=20, keep=2))),
    # the model and schedule of `make demo` (launch/demo.py): a 4-layer, 8-expert MoE trained
    # on the bundled corpus for minutes on CPU; the demo sets the data, steps and vocabulary
    "demo": ("tiny", dict(model=dict(hidden_size=128, intermediate_size=256,
                                     moe_intermediate_size=128, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                     num_experts=8, num_experts_per_tok=2,
                                     max_position_embeddings=4096, rope_theta=1e4),
                          train=dict(num_steps=80, batch_size=8, seq_len=1024, log_every=10,
                                     eval_every=80, eval_batches=2),
                          optim=dict(lr=3e-3, warmup_steps=10),
                          checkpoint=dict(every=80, keep=1))),
    # the CPU benchmark shape (benchmarks/train_step.py): minutes on CPU
    "small": ("small", dict(train=dict(num_steps=200, batch_size=8, seq_len=256, log_every=10,
                                       eval_every=100, eval_batches=4),
                            optim=dict(lr=1e-3, warmup_steps=20),
                            checkpoint=dict(every=100, keep=2))),
    # a released size on a pod: experts split 8 ways, parameters FSDP over the rest
    # attention keeps its probabilities for the backward pass: on 8,192-token rows that costs 7
    # GiB a chip and saves a fifth of the estimated step (HBM bytes of the blockwise recompute;
    # benchmarks/results/pods.md)
    "qwen3_30b_a3b": _pod("qwen3_30b_a3b", topology="v5p:4x4x4", batch_size=256, seq_len=8192,
                          micro_batches=4, lr=1e-5, attention_backward="stored"),
    # the released Qwen-AgentWorld bases (Qwen3.5-MoE hybrid): start from their HF checkpoints
    # with --config.init_from_hf=PATH
    # 4 micro-batches of 64 rows: one row a chip on v5p:4x4x4 (64 chips). With 8 or 16 (32 or 16
    # rows) the rows could not split over fsdp x expert: the activations were replicated over the
    # expert axis and the MoE ran without its all-to-all (benchmarks/results/pods.md)
    "qwen35_35b_a3b": _pod("qwen35_35b_a3b", topology="v5p:4x4x4", batch_size=256,
                           seq_len=16384, micro_batches=4, lr=1e-5),
    # 512 chips (v5p:8x8x8), one 16,384-token row a chip in one micro-batch, exchange buffers of
    # 1.25x a destination's even share: 83.2 GiB a chip. On 128 chips (4 micro-batches) the
    # temporaries alone were 121.7 GiB; on 256 (2 micro-batches, MoE in 4,096-token chunks)
    # 119 GiB in all; on 512 with 2x buffers 93.9 GiB, under 10% headroom
    # (benchmarks/results/pods.md)
    "qwen35_397b_a17b": _pod("qwen35_397b_a17b", topology="v5p:8x8x8", batch_size=512,
                             seq_len=16384, micro_batches=1, lr=5e-6, expert=16,
                             checkpoint_every=250, ep_capacity_factor=1.25),
}


def base_config(stage: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.stage = stage                    # cpt | sft | rl
  c.seed = 0
  c.model_preset = "tiny"
  c.model = ml_collections.ConfigDict(get_preset("tiny").to_dict())
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, expert=1, tensor=1))
  # (logical axis, mesh axis | None | tuple of mesh axes): how parameters split over the mesh
  c.sharding = ml_collections.ConfigDict(dict(rules=sharding.DEFAULT_RULES))
  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-3, warmup_steps=10, decay_steps=0, end_lr_ratio=0.1, b1=0.9, b2=0.95, eps=1e-8,
      weight_decay=0.1, grad_clip=1.0))
  c.train = ml_collections.ConfigDict(dict(
      num_steps=100, batch_size=8, seq_len=128, micro_batches=1, precision="auto",
      z_loss_coef=0.0, aux_loss_coef=-1.0,   # -1: the model's router_aux_loss_coef
      # > 0: CPT/SFT cross-entropy taken about this many tokens at a time, its gradients made in
      # the same pass (no [B*S, V] logits kept or recomputed; same loss and gradients; faster
      # than the plain loss on CPU, benchmarks/results/speed.md); 0: the plain full-logits loss
      xent_chunk=512,
      log_every=10, eval_every=0, eval_batches=2, progress=True, stop_after=0))
  c.checkpoint = ml_collections.ConfigDict(dict(every=100, keep=2, use_async=True, resume=True))
  c.data = ml_collections.ConfigDict(dict(
      source="synthetic",            # synthetic | pipeline
      tokenizer="",                  # sentencepiece .model or HF tokenizer.json (pipeline)
      eval_jsonl="",                 # held-out trajectories for validation (pipeline)
      # SFT in thinking mode: what the <think> block of a target holds. "empty": nothing (the
      # bundled trajectories carry no reasoning; a teacher's will come from rejection sampling);
      # "recorded": the reasoning a trajectory stores in meta["think"], empty where it has none;
      # "instruction": the sample's simulation instruction restated (lwm_jax.data.prompts)
      thinking_target="empty",
      pipeline=_pipeline_defaults()))
  c.rl = ml_collections.ConfigDict(dict(
      # the loss (lwm_jax/train/losses.py) and an optional KL to the start; the clip band's
      # -1 means the algorithm's own (losses.CLIP_BANDS: gspo / gspo_token 3e-4 / 4e-4, grpo
      # 0.2 / 0.27); set both to override; the trainer logs the band it uses
      algo="gspo", eps_low=-1.0, eps_high=-1.0, log_ratio_cap=10.0, kl_coef=0.0,
      # rollouts (data.source="rollouts", lwm_jax/rl/rollout.py): prompts_per_batch prompts per
      # process, group_size replies each, split into updates_per_batch optimizer updates, so
      # train.batch_size = prompts_per_batch x group_size / updates_per_batch x processes
      group_size=4, prompts_per_batch=4, updates_per_batch=4, max_new_tokens=256,
      temperature=1.0, top_p=1.0, top_k=0, filter_zero_variance=True,
      # rewards (lwm_jax/rl/rewards.py): weights of rule / rubric / reference; the rubric's judge
      reward="rubric=0.9,rule=0.1", similarity="mean", flagged="strip",
      judge_endpoint="", judge_model="", judge_checkpoint="",
      # the judge (lwm_jax/rl/stage.py): a reasoning judge thinks before it scores, so its token
      # budget must hold the thinking; `judge_thinking` is sent as the chat template's
      # enable_thinking; a failed, unparseable or cut-off reply is asked again up to
      # `judge_tries` calls in all, then the reply's reward is invalid (excluded, never 0)
      judge_max_tokens=16384, judge_thinking=True, judge_timeout_s=900.0, judge_tries=3,
      judge_concurrency=8,
      # the RL share of data.pipeline.jsonl's trajectories (a split by trajectory id)
      pool_fractions="cpt=0.6,sft=0.3,rl=0.1", pool_seed=0,
      # greedy held-out evaluation every train.eval_every steps (and before the first step)
      eval_jsonl="", eval_prompts=64, eval_max_new_tokens=0,
      # sampling engine options (lwm_jax/sampling/engine.py); 0 keeps the engine's default
      engine=dict(chunk_steps=0, min_prompt_bucket=0, prefill_chunk=0, min_cache_len=0),
      response_len=16))          # the synthetic toy task's response length
  c.dist = ml_collections.ConfigDict(dict(
      coordinator_address="", num_processes=1, process_id=0, timeout_s=300,
      cpu_collectives="", auto=False))
  # The TPU topology a pod preset was sized for (its memory checked by `launch/compile.py`, which
  # takes it as the default --topology; benchmarks/results/pods.md); "" for the CPU presets. The
  # trainer runs on whatever devices it is given.
  c.topology = ""
  c.init_from_hf = ""
  c.export_hf = False
  c.export_hf_dir = ""               # default <workdir>/hf
  return c


def _pipeline_defaults() -> ml_collections.ConfigDict:
  from lwm_jax.data import pipeline  # pylint: disable=import-outside-toplevel
  return pipeline.default_data_config()


def apply_preset(c: ml_collections.ConfigDict, preset: str) -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ConfigError(f"no preset '{preset}'{close_matches(preset, PRESETS)}; "
                      f"presets: {', '.join(PRESETS)}")
  model_name, over = PRESETS[preset]
  c.model_preset = model_name
  model = get_preset(model_name).to_dict()
  model.update(over.get("model", {}))
  c.model = ml_collections.ConfigDict(model)
  for section, fields in over.items():
    if section == "model":
      continue
    if not isinstance(fields, dict):   # a top-level field (topology)
      c[section] = fields
      continue
    for k, v in fields.items():
      c[section][k] = v
  return c


def get_stage_config(stage: str, arg: str | None) -> ml_collections.ConfigDict:
  return apply_preset(base_config(stage), arg or "tiny")
