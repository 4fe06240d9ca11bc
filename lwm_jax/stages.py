"""The training stages: one record per stage, read by the trainer, the config check and the batch
sources instead of comparing stage names.

A stage (`config.stage`) says how a run trains and what it learns from: the kind of step it
compiles (`xent`: weighted next-token cross-entropy; `policy`: the GSPO/GRPO policy-gradient step
over sampled rollouts), which rows the data pipeline makes for it, whether it trains a policy on
its own samples (rewards, policy evaluation), and whether it may carry a KL term against a
reference policy. A new stage is one `register_stage` call (here or in the user's own module,
imported before the run) plus a config preset; a new kind of batch adds a source in
lwm_jax/train/sources.py.

This module imports nothing of ours: configs, the data layer and the trainer may all read it.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib

STEP_KINDS = ("xent", "policy")
ROWS = ("cpt", "sft", "rl-prompts", "agent", "")


@dataclasses.dataclass(frozen=True)
class Stage:
  """How a stage trains.

  name: the value of `config.stage`.
  step: one of STEP_KINDS (`trainer.STEP_KINDS` maps it to the compiled step).
  rows: what the Grain pipeline makes for it from trajectories (`data.source = "pipeline"`):
    "cpt" (whole trajectories as documents, loss by information-theoretic masking), "sft"
    (chat samples, loss on the reply), "rl-prompts" (prompts to sample replies for), "agent"
    (the agent's view of a trajectory, loss on its actions), or "" when its batches come from
    somewhere else (episodes played in environments).
  policy: trains a policy on its own samples (batches from a rollout source; reward curves and
    the source's policy evaluation).
  kl_reference: may add a KL term against the first rollout's policy (`rl.kl_coef > 0`).
  thinking: its replies follow `data.pipeline.thinking` (SFT's thinking mode and targets).
  needs_trajectories: the pipeline source needs `data.pipeline.jsonl` or `tfds_dir`.
  rollouts: for a policy stage, "module:function" that builds its batch source from the config
    when `data.source = "rollouts"` (`rollout_source`; entry points such as launch/train.py call
    it and hand the source to the trainer, which sits below the RL code).
  """
  name: str
  step: str
  rows: str = ""
  policy: bool = False
  kl_reference: bool = False
  thinking: bool = False
  needs_trajectories: bool = True
  rollouts: str = ""

  def __post_init__(self):
    if self.step not in STEP_KINDS:
      raise ValueError(f"stage {self.name!r}: step {self.step!r} is not one of "
                       f"{', '.join(STEP_KINDS)}")
    if self.rows not in ROWS:
      raise ValueError(f"stage {self.name!r}: rows {self.rows!r} is not one of "
                       f"{', '.join(repr(r) for r in ROWS)}")


_REGISTRY: dict[str, Stage] = {}


def register_stage(stage: Stage) -> Stage:
  """Adds `stage`; a name already taken by a different record is an error."""
  old = _REGISTRY.get(stage.name)
  if old is not None and old != stage:
    raise ValueError(f"stage {stage.name!r} is already registered as {old}")
  _REGISTRY[stage.name] = stage
  return stage


def get_stage(name: str) -> Stage:
  """The record of stage `name`; an unknown name is an error that lists the known ones."""
  try:
    return _REGISTRY[name]
  except KeyError:
    close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown stage {name!r}{hint}; stages: {', '.join(_REGISTRY)}") from None


def stage_names() -> tuple[str, ...]:
  return tuple(_REGISTRY)


def rollout_source(config):
  """The batch source of `config`'s stage when `config.data.source = "rollouts"` (built by the
  factory its record names, imported only now), else None: the trainer builds the other sources
  itself."""
  if config.data.source != "rollouts":
    return None
  stage = get_stage(config.stage)
  if not stage.rollouts:
    raise ValueError(f"config.data.source: stage {stage.name!r} names no rollout source "
                     f"(its record's `rollouts`)")
  module, _, function = stage.rollouts.partition(":")
  return getattr(importlib.import_module(module), function)(config)


register_stage(Stage("cpt", "xent", rows="cpt"))
register_stage(Stage("sft", "xent", rows="sft", thinking=True))
register_stage(Stage("rl", "policy", rows="rl-prompts", policy=True, kl_reference=True,
                     rollouts="lwm_jax.rl.stage:rollout_source"))
register_stage(Stage("agent-bc", "xent", rows="agent"))
register_stage(Stage("agent-rl", "policy", policy=True, kl_reference=True,
                     needs_trajectories=False, rollouts="lwm_jax.rl.agent_stage:agent_source"))
