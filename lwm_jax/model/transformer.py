"""The decoder-only MoE transformer shared by both Qwen families.

`Transformer(cfg, rngs=...)(tokens, positions=None, segment_ids=None, cache=None)` returns a
`ModelOutput` with `logits` [B, S, V], the load-balancing `aux_loss` (HF's definition, over all MoE
layers' token rows together), the router z-loss, dropped-assignment count, per-layer expert load,
and the updated cache when one was given.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from lwm_jax.model.attention import Attention
from lwm_jax.model.config import ModelConfig
from lwm_jax.model.layers import DTYPES, Linear, RMSNorm, SwiGLU, param, rows_matmul
from lwm_jax.model.moe import MoE
from lwm_jax import sharding


@dataclasses.dataclass
class ModelOutput:
  logits: jax.Array
  aux_loss: jax.Array
  router_z_loss: jax.Array
  dropped_tokens: jax.Array
  expert_load: jax.Array     # [num MoE layers, E]: share of top-k assignments per expert
  cache: Any = None


jax.tree_util.register_dataclass(
    ModelOutput, data_fields=["logits", "aux_loss", "router_z_loss", "dropped_tokens",
                              "expert_load", "cache"], meta_fields=[])


class SparseMLP(nnx.Module):
  """Routed experts, plus the sigmoid-gated shared expert of Qwen3.5-MoE when configured."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.experts = MoE(cfg, rngs=rngs)
    self.has_shared = cfg.is_hybrid and cfg.shared_expert_intermediate_size > 0
    if self.has_shared:
      kw = dict(rngs=rngs, dtype=DTYPES[cfg.dtype], param_dtype=DTYPES[cfg.param_dtype])
      self.shared_expert = SwiGLU(cfg.hidden_size, cfg.shared_expert_intermediate_size, **kw)
      self.shared_expert_gate = Linear(cfg.hidden_size, 1, ("embed", None), **kw)

  def __call__(self, x, mask):
    y, stats = self.experts(x, mask)
    if self.has_shared:
      gate = jax.nn.sigmoid(self.shared_expert_gate(x).astype(jnp.float32)).astype(x.dtype)
      y = y + gate * self.shared_expert(x)
    return y, stats


class Block(nnx.Module):
  def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
    self.input_layernorm = RMSNorm.for_model(cfg, cfg.hidden_size)
    self.post_attention_layernorm = RMSNorm.for_model(cfg, cfg.hidden_size)
    self.kind = cfg.layer_type(layer)
    if self.kind == "linear_attention":
      from lwm_jax.model.deltanet import GatedDeltaNet  # pylint: disable=import-outside-toplevel
      self.linear_attn = GatedDeltaNet(cfg, rngs=rngs)
    else:
      self.self_attn = Attention(cfg, rngs=rngs, gated=cfg.is_hybrid)
    self.is_moe = cfg.is_moe_layer(layer)
    if self.is_moe:
      self.mlp = SparseMLP(cfg, rngs=rngs)
    else:
      self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, rngs=rngs,
                        dtype=DTYPES[cfg.dtype], param_dtype=DTYPES[cfg.param_dtype])

  def __call__(self, x, positions, segment_ids, token_mask, cache):
    h = self.input_layernorm(x)
    if self.kind == "linear_attention":
      h, new_cache = self.linear_attn(h, segment_ids=segment_ids, cache=cache)
    else:
      h, new_cache = self.self_attn(h, positions, segment_ids, cache)
    x = x + h
    h = self.post_attention_layernorm(x)
    stats = None
    if self.is_moe:
      h, stats = self.mlp(h, token_mask)
    else:
      h = self.mlp(h)
    x = sharding.constrain_batch(x + h)
    return x, stats, new_cache


def segment_positions(segment_ids_BxS: jax.Array) -> jax.Array:
  """Positions that restart at 0 at each new segment."""
  s = segment_ids_BxS.shape[1]
  idx = jnp.broadcast_to(jnp.arange(s), segment_ids_BxS.shape)
  starts = jnp.concatenate([jnp.ones_like(segment_ids_BxS[:, :1], bool),
                            segment_ids_BxS[:, 1:] != segment_ids_BxS[:, :-1]], axis=1)
  start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
  return idx - start_idx


class Transformer(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    cfg.validate()
    self.cfg = cfg
    pdt = DTYPES[cfg.param_dtype]
    self.embed_tokens = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"),
                              dtype=pdt)
    self.layers = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.num_hidden_layers)])
    self.norm = RMSNorm.for_model(cfg, cfg.hidden_size)
    if not cfg.tie_word_embeddings:
      self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, ("embed", "vocab"), rngs=rngs,
                            dtype=DTYPES[cfg.dtype], param_dtype=pdt)
    self.decode_layout = False  # True in the copies made by `decode_layout.for_decoding`

  def __call__(self, tokens_BxS: jax.Array, positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None, cache: list | None = None,
               logits_at: jax.Array | None = None, return_hidden: bool = False) -> ModelOutput:
    """`logits_at` [B] (optional): return logits only at that position of each row, [B, 1, V]
    (prefill then never builds the [B, S, V] tensor). `return_hidden`: skip the output head; the
    `logits` field then holds the final normed hidden states [B, S, D] (pair with `head_DxV`)."""
    cfg = self.cfg
    b, s = tokens_BxS.shape
    if positions is None:
      positions = (segment_positions(segment_ids) if segment_ids is not None
                   else jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s)))
    token_mask = segment_ids != 0 if segment_ids is not None else None
    x = jnp.take(self.embed_tokens[...], tokens_BxS, axis=0).astype(DTYPES[cfg.dtype])
    x = sharding.constrain_batch(x)
    all_stats, new_cache = [], []
    period = self.scan_period() if cfg.scan_layers and cache is None else 0
    if period:
      x, all_stats = self._scanned(x, positions, segment_ids, token_mask, period)
    for i, layer in enumerate(self.layers if not period else ()):
      layer_cache = None if cache is None else cache[i]
      if cfg.remat and cache is None:
        x, stats, c = nnx.remat(lambda blk, *a: blk(*a))(layer, x, positions, segment_ids,
                                                         token_mask, layer_cache)
      else:
        x, stats, c = layer(x, positions, segment_ids, token_mask, layer_cache)
      new_cache.append(c)
      if stats is not None:
        all_stats.append(stats)
    if logits_at is not None:
      x = x[jnp.arange(b), logits_at][:, None]
    x = self.norm(x)
    if return_hidden:
      return self._output(x, all_stats, new_cache if cache is not None else None)
    if cfg.tie_word_embeddings and self.decode_layout:
      logits = rows_matmul(x, self.tied_head[...])
    elif cfg.tie_word_embeddings:
      logits = jnp.dot(x, self.embed_tokens[...].astype(x.dtype).T)
    else:
      logits = self.lm_head(x)
    return self._output(logits, all_stats, new_cache if cache is not None else None)

  def scan_period(self) -> int:
    """The smallest p such that layer i and layer i + p are alike (same kind of attention, same
    kind of MLP) for every i and p divides the depth; 0 when scanning would not help (the
    period is the whole depth) or the model is a decode-layout copy."""
    if self.decode_layout:
      return 0
    sig = [(layer.kind, layer.is_moe) for layer in self.layers]
    n = len(sig)
    for p in range(1, n // 2 + 1):
      if n % p == 0 and all(sig[i] == sig[i % p] for i in range(n)):
        return p
    return 0

  def _scanned(self, x, positions, segment_ids, token_mask, period: int):
    """The layers as one `lax.scan` over groups of `period` layers whose parameters are stacked
    here (a [groups, ...] array per parameter of each position in the period); rematerialised
    per group when `cfg.remat`. Returns (x, router stats per MoE layer in layer order)."""
    n = len(self.layers)
    groups = n // period
    graphdefs, stacked = [], []
    for j in range(period):
      graphdefs.append(nnx.graphdef(self.layers[j]))
      states = [nnx.state(self.layers[g * period + j]) for g in range(groups)]
      stacked.append(jax.tree.map(lambda *xs: jnp.stack(xs), *states))

    def layer_call(gd, st, h):
      h, st_j, _ = nnx.merge(gd, st)(h, positions, segment_ids, token_mask, None)
      return h, st_j

    # remat each layer of the group on its own, not the group as one: the backward then holds
    # one layer's intermediates at a time (a hybrid's group of 4 layers held all four's), and
    # the scan keeps the input of every layer, one [B, S, D] array each
    call = jax.checkpoint(layer_call, static_argnums=(0,)) if self.cfg.remat else layer_call

    def body(h, states):
      stats = []
      for gd, st in zip(graphdefs, states):
        h, st_j = call(gd, st, h)
        stats.append(st_j)
      return h, stats

    x, stats = jax.lax.scan(body, x, stacked)
    ordered = []
    for g in range(groups):
      for st in stats:
        if st is not None:
          ordered.append(jax.tree.map(lambda v, g=g: v[g], st))
    return x, ordered

  def head_DxV(self) -> jax.Array:
    """The output head as a [D, V] matrix in the compute dtype: the embedding transposed when tied."""
    dt = DTYPES[self.cfg.dtype]
    if self.decode_layout:
      raise ValueError("head_DxV: not available on a decode-layout copy of the model")
    if self.cfg.tie_word_embeddings:
      return self.embed_tokens[...].astype(dt).T
    return self.lm_head.kernel[...].astype(dt)

  def _output(self, logits, all_stats, cache) -> ModelOutput:
    cfg = self.cfg
    if not all_stats:
      z = jnp.zeros((), jnp.float32)
      return ModelOutput(logits, z, z, jnp.zeros((), jnp.int32),
                         jnp.zeros((0, max(cfg.num_experts, 1))), cache)
    counts = jnp.stack([st.counts_E for st in all_stats])
    probs = jnp.stack([st.prob_sum_E for st in all_stats])
    rows = jnp.stack([st.rows for st in all_stats])
    total = jnp.maximum(jnp.sum(rows), 1.0)
    aux = cfg.num_experts * jnp.sum((counts.sum(0) / total) * (probs.sum(0) / total))
    z_loss = sum(st.z_sum for st in all_stats) / total
    load = counts / jnp.maximum(rows[:, None] * cfg.num_experts_per_tok, 1.0)
    dropped = sum(st.dropped for st in all_stats)
    return ModelOutput(logits, aux, z_loss, dropped, load, cache)

  def init_cache(self, batch: int, max_len: int, dtype=None) -> list:
    """A zeroed decoding cache: KV for attention layers, conv/recurrent state for linear ones."""
    dtype = dtype or DTYPES[self.cfg.dtype]
    out = []
    for layer in self.layers:
      if layer.kind == "linear_attention":
        out.append(layer.linear_attn.init_cache(batch, dtype))
      else:
        out.append(layer.self_attn.init_cache(batch, max_len, dtype))
    return out
