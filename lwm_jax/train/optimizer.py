"""AdamW with linear warmup + cosine decay, global-norm clipping and a weight-decay mask; precision.

Weight decay applies only to matrices (ndim >= 2): norms, biases and other 1-D parameters are exempt.
`optim.trainable` (optional, "" = every parameter) is a regular expression over parameter paths
(e.g. "self_attn"): the parameters it does not match keep their values.
Precision policy: parameters and optimizer state are always float32; the compute dtype is bfloat16 on
GPU/TPU and float32 on CPU unless `train.precision` names one explicitly.
"""
from __future__ import annotations

from typing import Any

import jax
import optax

from lwm_jax.model import platform
from lwm_jax.model.config import ModelConfig


def lr_schedule(peak_lr: float, warmup_steps: int, total_steps: int,
                end_lr_ratio: float = 0.1) -> optax.Schedule:
  """0 -> peak linearly over `warmup_steps`, then cosine to `end_lr_ratio * peak` at `total_steps`."""
  warmup_steps = max(int(warmup_steps), 0)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak_lr, warmup_steps=warmup_steps,
      decay_steps=max(int(total_steps), warmup_steps + 1), end_value=peak_lr * end_lr_ratio)


def decay_mask(params: Any) -> Any:
  """True for leaves that get weight decay: every parameter with two or more dimensions."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(optim_cfg: Any, total_steps: int) -> tuple[optax.GradientTransformation,
                                                                optax.Schedule]:
  """The optax chain of a config's `optim` section, and its learning-rate schedule."""
  schedule = lr_schedule(optim_cfg.lr, optim_cfg.warmup_steps,
                         optim_cfg.decay_steps or total_steps, optim_cfg.end_lr_ratio)
  parts = []
  if optim_cfg.grad_clip and optim_cfg.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(optim_cfg.grad_clip))
  parts.append(optax.adamw(schedule, b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps,
                           weight_decay=optim_cfg.weight_decay, mask=decay_mask))
  tx = optax.chain(*parts)
  trainable = optim_cfg.get("trainable", "") if hasattr(optim_cfg, "get") else ""
  if trainable:
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()},
                               lambda params: trainable_labels(params, trainable))
  return tx, schedule


def trainable_labels(params: Any, pattern: str) -> Any:
  """'train' for each parameter whose path ('layers/0/self_attn/q_proj/kernel') matches
  `pattern`, else 'frozen'; a pattern matching no parameter is an error naming it."""
  import re  # pylint: disable=import-outside-toplevel
  rx = re.compile(pattern)
  def path_of(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                    for k in path)
  labels = jax.tree_util.tree_map_with_path(
      lambda p, _: "train" if rx.search(path_of(p)) else "frozen", params)
  if "train" not in jax.tree.leaves(labels):
    raise ValueError(f"optim.trainable: {pattern!r} matches no parameter path")
  return labels


def compute_dtype(precision: str, backend: str | None = None) -> str:
  """`auto` -> bfloat16 on GPU/TPU, float32 on CPU; otherwise the named dtype."""
  if precision == "auto":
    backend = backend or platform.target_platform()
    return "float32" if backend == "cpu" else "bfloat16"
  if precision not in ("float32", "bfloat16"):
    raise ValueError(f"train.precision: '{precision}' is not auto, float32 or bfloat16")
  return precision


def apply_precision(cfg: ModelConfig, precision: str, backend: str | None = None) -> ModelConfig:
  """fp32 parameters, compute dtype from the policy (for `backend`, default the target platform,
  `lwm_jax.model.platform`)."""
  return cfg.replace(dtype=compute_dtype(precision, backend), param_dtype="float32")
