"""A training run's config: checks before anything is compiled, and its files in the workdir.

`validate_config` names the bad field of a config; `sharding_rules` reads `config.sharding.rules`;
`check_workdir` proves the workdir writable; `save_run_config` writes config.json without ever
overwriting the config of an earlier start of the same run.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

import ml_collections

from lwm_jax import sharding as shd
from lwm_jax import stages as stages_lib
from lwm_jax.model.config import ModelConfig

THINKING_TARGETS = ("empty", "recorded", "instruction")
DATA_SOURCES = ("synthetic", "pipeline", "rollouts", "drills")


def validate_config(c: ml_collections.ConfigDict) -> ModelConfig:
  """Checks the config before anything is compiled; errors name the field. Returns the model config."""
  def need(cond: bool, field: str, why: str):
    if not cond:
      raise ValueError(f"config.{field}: {why}")
  try:
    stage = stages_lib.get_stage(c.stage)
  except ValueError as e:
    raise ValueError(f"config.stage: {e}") from None
  try:
    model = ModelConfig.from_dict(c.model.to_dict()).validate()
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.{e}" if str(e).startswith("model.") else f"config.model: {e}") from e
  t, o = c.train, c.optim
  for f in ("num_steps", "batch_size", "seq_len", "micro_batches"):
    need(int(t[f]) > 0, f"train.{f}", f"must be positive, got {t[f]}")
  need(t.batch_size % t.micro_batches == 0, "train.micro_batches",
       f"{t.micro_batches} does not divide train.batch_size={t.batch_size}")
  # from init_from_hf the model is the folder's, its context extended to longer rows (trainer)
  need(c.get("init_from_hf") or t.seq_len <= model.max_position_embeddings, "train.seq_len",
       f"{t.seq_len} exceeds model.max_position_embeddings={model.max_position_embeddings}")
  need(int(t.get("xent_chunk", 0)) >= 0, "train.xent_chunk",
       f"must be >= 0 (0 = off), got {t.get('xent_chunk', 0)}")
  need(t.precision in ("auto", "float32", "bfloat16"), "train.precision",
       f"'{t.precision}' is not auto, float32 or bfloat16")
  need(o.lr > 0, "optim.lr", f"must be positive, got {o.lr}")
  need(o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
  need(0 <= o.b1 < 1 and 0 <= o.b2 < 1, "optim.b1", "b1 and b2 must lie in [0, 1)")
  need(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
  for ax in ("data", "fsdp", "expert", "tensor"):
    need(c.mesh[ax] == -1 or c.mesh[ax] >= 1, f"mesh.{ax}", f"must be >= 1 or -1, got {c.mesh[ax]}")
  if c.mesh.expert > 1:
    need(model.num_experts % c.mesh.expert == 0, "mesh.expert",
         f"{c.mesh.expert} does not divide model.num_experts={model.num_experts}")
  need(c.data.source in DATA_SOURCES, "data.source",
       f"'{c.data.source}' is not one of {', '.join(DATA_SOURCES)}")
  if stage.policy:
    need(c.data.source not in ("pipeline", "drills"), "data.source",
         f"the {c.stage} stage samples its batches: 'rollouts' (from the policy, on the RL "
         "pool of data.pipeline.jsonl, or agent episodes) or 'synthetic' (a toy task)")
  else:
    need(c.data.source != "rollouts", "data.source",
         f"'rollouts' is for a stage that trains a policy on its samples, not {c.stage}")
  if c.data.source in ("pipeline", "rollouts"):
    need(bool(c.data.tokenizer), "data.tokenizer", "a tokenizer path is required for the pipeline")
    need(os.path.exists(c.data.tokenizer), "data.tokenizer", f"{c.data.tokenizer} does not exist")
    # agent-rl plays episodes in environments: its tasks are seeds, not trajectories
    need(not stage.needs_trajectories or bool(c.data.pipeline.jsonl or c.data.pipeline.tfds_dir),
         "data.pipeline.jsonl", "set data.pipeline.jsonl or data.pipeline.tfds_dir")
  if c.data.source == "drills":
    need("drills" in c.data, "data.drills", "the drill's section is missing "
         "(lwm_jax.data.drill_sources.default_config())")
    if c.data.drills.get("kind") not in ("induction", "flag"):  # random ids need no tokenizer
      need(bool(c.data.tokenizer), "data.tokenizer", "a tokenizer path is required for the drills")
      need(os.path.exists(c.data.tokenizer), "data.tokenizer", f"{c.data.tokenizer} does not exist")
  if stage.policy and not stage.kl_reference:
    need(c.rl.kl_coef == 0, "rl.kl_coef", f"{c.stage} has no reference policy term (set 0)")
  if stage.policy:
    if "agent" in c and c.agent.get("credit", "episode") == "turn":
      need(c.rl.algo in ("gspo_token", "grpo"), "rl.algo",
           f"agent.credit='turn' gives each turn its own advantage, which needs a per-token "
           f"loss: gspo_token or grpo, not '{c.rl.algo}'")
  if stage.policy:
    need(c.rl.algo in ("gspo", "gspo_token", "grpo"), "rl.algo",
         f"'{c.rl.algo}' is not gspo, gspo_token or grpo")
    need(c.rl.eps_low == -1 or 0 < c.rl.eps_low < 1, "rl.eps_low",
         f"{c.rl.eps_low} is out of range (0, 1); -1 takes the algorithm's own")
    need(c.rl.eps_high == -1 or c.rl.eps_high > 0, "rl.eps_high",
         f"{c.rl.eps_high} must be > 0; -1 takes the algorithm's own")
    # the rollout batch (train.batch_size x rl.updates_per_batch rows) holds whole groups
    rollout_rows = t.batch_size * (int(c.rl.get("updates_per_batch", 1))
                                   if c.data.source == "rollouts" else 1)
    need(c.rl.group_size >= 2 and rollout_rows % c.rl.group_size == 0, "rl.group_size",
         f"{c.rl.group_size} must be >= 2 and divide the rollout batch's {rollout_rows} rows "
         f"(train.batch_size x rl.updates_per_batch)")
    if c.data.source == "synthetic":
      need(0 < c.rl.response_len < t.seq_len, "rl.response_len", "must be in (0, train.seq_len)")
      need(c.rl.kl_coef == 0, "rl.kl_coef", "the KL term needs reference log-probs, which the "
           "rollouts source computes (data.source='rollouts')")
    else:
      need(0 < c.rl.max_new_tokens < t.seq_len, "rl.max_new_tokens",
           f"{c.rl.max_new_tokens} must be in (0, train.seq_len={t.seq_len})")
  thinking = c.data.get("thinking_target", "empty")
  need(thinking in THINKING_TARGETS, "data.thinking_target",
       f"'{thinking}' is not one of {THINKING_TARGETS}")
  sharding_rules(c)
  need(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
  if c.init_from_hf:
    need(os.path.isdir(c.init_from_hf), "init_from_hf", f"{c.init_from_hf} is not a directory")
  return model


def sharding_rules(c: ml_collections.ConfigDict) -> tuple[tuple[str, Any], ...]:
  """`config.sharding.rules` as (logical axis, mesh axis | None | tuple of mesh axes) pairs, checked:
  every logical axis a parameter can carry and every mesh axis must exist."""
  sec = c.get("sharding")
  if sec is None or "rules" not in sec:
    return shd.DEFAULT_RULES
  known = {name for name, _ in shd.DEFAULT_RULES}
  out = []
  for i, rule in enumerate(sec.rules):
    where = f"config.sharding.rules[{i}]"
    if not isinstance(rule, (tuple, list)) or len(rule) != 2 or not isinstance(rule[0], str):
      raise ValueError(f"{where}: {rule!r} is not a (logical axis, mesh axes) pair")
    name, target = rule
    if name not in known:
      raise ValueError(f"{where}: unknown logical axis '{name}'{_close(name, known)}")
    axes = (target,) if isinstance(target, str) or target is None else tuple(target)
    for ax in axes:
      if ax is not None and ax not in shd.MESH_AXES:
        raise ValueError(f"{where}: '{ax}' is not a mesh axis{_close(str(ax), shd.MESH_AXES)}")
    out.append((name, target if isinstance(target, str) or target is None else tuple(target)))
  return tuple(out)


def _close(name: str, candidates) -> str:
  import difflib  # pylint: disable=import-outside-toplevel
  near = difflib.get_close_matches(name, list(candidates), n=3)
  return f" (close matches: {', '.join(near)})" if near else f" (known: {', '.join(sorted(candidates))})"


def check_workdir(workdir: str) -> str:
  """Creates the workdir and proves it writable, or fails naming it."""
  workdir = os.path.abspath(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test_{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise PermissionError(f"workdir {workdir} is not writable: {e}") from e
  return workdir


def save_run_config(workdir: str, resolved: dict[str, Any], start_step: int) -> str:
  """Writes the resolved config and returns the file's path. The first start of a run writes
  config.json; a later start (a resume) whose config differs keeps config.json as it is and writes
  config.resume-<step>.json beside it, logging the fields that changed."""
  resolved = json.loads(json.dumps(resolved, default=str))
  first = os.path.join(workdir, "config.json")
  previous = None
  if os.path.exists(first):
    try:
      with open(first, encoding="utf-8") as f:
        previous = json.load(f)
    except ValueError:
      previous = {}
  if previous is None:
    _write_json(first, resolved)
    return first
  changed = _changed_fields(previous, resolved)
  if not changed:
    logging.info("config unchanged since %s", first)
    return first
  path = os.path.join(workdir, f"config.resume-{start_step}.json")
  k = 1
  while os.path.exists(path) and _changed_fields(_read_json(path), resolved):
    k += 1
    path = os.path.join(workdir, f"config.resume-{start_step}.{k}.json")
  _write_json(path, resolved)
  shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
  logging.warning("this start at step %d changes the config (%s); kept %s and wrote %s",
                  start_step, shown, first, path)
  return path


def _changed_fields(a: Any, b: Any, prefix: str = "") -> list[str]:
  if isinstance(a, dict) and isinstance(b, dict):
    out = []
    for k in sorted(set(a) | set(b)):
      out += _changed_fields(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{prefix}{k}.")
    return out
  return [] if a == b else [prefix.rstrip(".")]


def _read_json(path: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except ValueError:
    return {}


def _write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)
