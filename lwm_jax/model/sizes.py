"""Parameter counts (total and active per token) and training FLOPs per token, for MFU.

Counts come from the abstract model (`nnx.eval_shape`), so the largest presets cost no memory.
Active parameters per token exclude the embedding lookup (a gather, no FLOPs) and count only the
`num_experts_per_tok` routed experts of each MoE layer (plus shared experts, router, attention,
norms and the LM head).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from lwm_jax.model.config import ModelConfig


@dataclasses.dataclass
class ModelSizes:
  total_params: int
  active_params: int        # per token, embedding lookup excluded
  expert_params: int        # all routed experts
  embedding_params: int

  @property
  def active_with_embedding(self) -> int:
    """Active parameters counting the embedding table, as model names do ("A3B")."""
    return self.active_params + (self.embedding_params if self.embedding_params else 0)

  def train_flops_per_token(self, cfg: ModelConfig, seq_len: int) -> float:
    """6 x active params, plus attention scores/values over the sequence: 12 x L x H x K x S for
    full attention layers (causal halving ignored, as is customary), and for linear-attention layers
    the state read/update, 6 x 2 x Hv x dk x dv per token."""
    full = sum(cfg.layer_type(i) == "full_attention" for i in range(cfg.num_hidden_layers))
    linear = cfg.num_hidden_layers - full
    attn = 12 * full * cfg.num_attention_heads * cfg.head_dim * seq_len
    lin = 12 * linear * cfg.linear_num_value_heads * cfg.linear_key_head_dim * \
        cfg.linear_value_head_dim
    return 6.0 * self.active_params + attn + lin


def abstract_model(cfg: ModelConfig):
  from lwm_jax.model.transformer import Transformer  # pylint: disable=import-outside-toplevel
  return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))


def count(cfg: ModelConfig) -> ModelSizes:
  model = abstract_model(cfg)
  total = expert = embed = 0
  for path, var in nnx.iter_graph(model):
    if not isinstance(var, nnx.Param):
      continue
    n = int(np.prod(var.get_value().shape))
    total += n
    name = "/".join(str(p) for p in path)
    if name.endswith(("experts/gate_proj", "experts/up_proj", "experts/down_proj")):
      expert += n
    if name == "embed_tokens":
      embed = n
  e = max(cfg.num_experts, 1)
  active_experts = expert * cfg.num_experts_per_tok // e
  active = total - expert + active_experts
  if not cfg.tie_word_embeddings:
    active -= embed  # the lookup; a tied table is still used by the LM head
  return ModelSizes(total, active, expert, embed)


def describe(cfg: ModelConfig, seq_len: int = 4096) -> str:
  s = count(cfg)
  return (f"total {s.total_params / 1e6:,.2f}M params, active per token {s.active_params / 1e6:,.2f}M "
          f"({s.active_with_embedding / 1e6:,.2f}M with the embedding table), "
          f"{s.train_flops_per_token(cfg, seq_len) / 1e6:,.1f} MFLOP/token to train at S={seq_len}")


if __name__ == "__main__":
  from lwm_jax.model.config import PRESETS, get_preset
  for name in PRESETS:
    print(f"{name:>16}: {describe(get_preset(name), 256 if name in ('tiny', 'small') else 4096)}")
  jax.clear_caches()


def per_device_bytes(cfg: ModelConfig, mesh_axes: dict[str, int], rules=None) -> dict[str, float]:
  """Bytes per device of parameters, gradients and AdamW moments under a mesh, from the logical
  axis rules (no devices needed). Parameters and moments in param_dtype; gradients likewise."""
  from jax.sharding import AbstractMesh, AxisType  # pylint: disable=import-outside-toplevel
  from lwm_jax import sharding  # pylint: disable=import-outside-toplevel
  rules = rules or sharding.DEFAULT_RULES
  sizes_ = [mesh_axes.get(a, 1) for a in sharding.MESH_AXES]
  mesh = AbstractMesh(tuple(sizes_), sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 4)
  model = abstract_model(cfg)
  itemsize = np.dtype(cfg.param_dtype if cfg.param_dtype != "bfloat16" else np.float16).itemsize
  shard_elems = 0.0
  for _, var in nnx.iter_graph(model):
    if not isinstance(var, nnx.Param):
      continue
    shape = var.get_value().shape
    axes = var.get_metadata().get("axes") or (None,) * len(shape)
    spec = sharding.spec_for(axes, shape, mesh, rules)
    split = 1
    for entry in spec:
      for ax in (entry if isinstance(entry, tuple) else (entry,)):
        if ax is not None:
          split *= mesh.shape[ax]
    shard_elems += np.prod(shape) / split
  params = shard_elems * itemsize
  return {"params": params, "grads": params, "adam": 2 * shard_elems * 4,
          "total": 2 * params + 2 * shard_elems * 4}
