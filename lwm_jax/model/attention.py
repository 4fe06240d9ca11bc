"""Grouped-query attention of Qwen3-MoE and the gated full attention of Qwen3.5-MoE.

Masks: in training, attention is causal by index and block-diagonal by `segment_ids` (packed
documents never see each other). With a KV cache, slot j of the cache holds position j, so a query
at position p sees the slots j <= p; rows of a batch may sit at different positions. The cache is
stored with kv heads before time, keys [B, G, T, K] and values [B, G, K, T], so that both products
of a decode step contract each operand's contiguous last dim: XLA on CPU otherwise copies the
cache transposed, or runs a slow strided product, every step (about 20% of a decode step).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from lwm_jax.model import platform
from lwm_jax.model.config import ModelConfig
from lwm_jax.model.layers import DTYPES, Linear, RMSNorm, apply_rope, rope_cos_sin, rows_matmul

NEG_INF = -1e30
# Axis order of the cached keys and values (b batch, g kv heads, t time, k head dim).
CACHE_LAYOUT = {"k": "bgtk", "v": "bgkt"}


def masked_softmax(scores, mask, scale: float, dtype):
  """Softmax over the last axis of the scaled fp32 scores where `mask` holds (broadcast)."""
  return jax.nn.softmax(jnp.where(mask, scores * scale, NEG_INF), axis=-1).astype(dtype)


def dot_attention(q_BxSxHxK, k, v, mask_BxSxT, scale: float, k_layout: str = "btgk",
                  v_layout: str = "btgk"):
  """Softmax attention in fp32 with GQA (H query heads share G kv heads). `k` and `v` are
  [B, T, G, K] ("btgk") or laid out as the cache stores them: keys [B, G, T, K] ("bgtk") and
  values [B, G, K, T] ("bgkt"), so that both products contract each operand's last dim."""
  b, s, h, kd = q_BxSxHxK.shape
  g = k.shape[k_layout.index("g")]
  q = q_BxSxHxK.reshape(b, s, g, h // g, kd)
  scores = jnp.einsum(f"bsgrk,{k_layout}->bgrst", q, k, preferred_element_type=jnp.float32)
  probs = masked_softmax(scores, mask_BxSxT[:, None, None], scale, v.dtype)
  out = jnp.einsum(f"bgrst,{v_layout}->bsgrk", probs, v)
  return out.reshape(b, s, h, -1)


def causal_attention(q_BxSxHxK, k_BxSxGxK, v_BxSxGxK, segment_ids_BxS, scale: float,
                     chunk: int = 128):
  """Causal (and segment-blocked) attention that skips the fully masked upper blocks: query chunk
  i only scores keys [0, (i + 1) * chunk). Same result as `dot_attention` with `training_mask`.

  The heads are moved before time once, for the whole sequence (queries [B, G, S * R, K] with the
  R query heads of a kv group next to each other, keys and values [B, G, T, K]), so each chunk's
  two products are plain batched matmuls over contiguous rows. Slicing and contracting the
  [B, S, G, R, K] layout per chunk made XLA copy every chunk's operands and probabilities
  transposed: 40% of a `demo`-preset CPT step at 4 x 2048 (benchmarks/results/speed.md)."""
  b, s, h, kd = q_BxSxHxK.shape
  if s <= chunk:
    return dot_attention(q_BxSxHxK, k_BxSxGxK, v_BxSxGxK, training_mask(segment_ids_BxS, b, s),
                         scale)
  g = k_BxSxGxK.shape[2]
  r = h // g
  q = q_BxSxHxK.reshape(b, s, g, r, kd).transpose(0, 2, 1, 3, 4).reshape(b, g, s * r, kd)
  k = k_BxSxGxK.transpose(0, 2, 1, 3)
  v = v_BxSxGxK.transpose(0, 2, 1, 3)
  outs = []
  for start in range(0, s, chunk):
    end = min(start + chunk, s)
    c = end - start
    scores = jnp.einsum("bgqk,bgtk->bgqt", q[:, :, start * r:end * r], k[:, :, :end],
                        preferred_element_type=jnp.float32)
    mask = (jnp.arange(end)[None, :] <= jnp.arange(start, end)[:, None])[None]
    if segment_ids_BxS is not None:
      mask = mask & (segment_ids_BxS[:, start:end, None] == segment_ids_BxS[:, None, :end])
    # one mask row per query position, shared by its R heads (rows are position-major): the
    # scores are viewed [B, G, C, R, T] so the mask broadcasts over R inside the softmax's fusion
    # instead of being materialised at the scores' size
    probs = masked_softmax(scores.reshape(b, g, c, r, end), mask[:, None, :, None], scale,
                           v.dtype).reshape(b, g, c * r, end)
    outs.append(jnp.einsum("bgqt,bgtk->bgqk", probs, v[:, :, :end]))
  out = jnp.concatenate(outs, axis=2).reshape(b, g, s, r, kd).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, s, h, kd)


# ------------------------------------------------------------ the same, recomputed in the backward
# `causal_attention` differentiated by XLA keeps every chunk's probabilities for the backward pass:
# B x H x S^2 / 2 values a layer (4.3 GB for one 16,384-token row of 16 heads in bf16), which
# decided whether the hybrid preset's CPT step fitted a v5p chip (benchmarks/results/pods.md).
# `recomputed_causal_attention` is FlashAttention's scheme in plain JAX: the sequence is cut into
# blocks of `chunk` positions; the forward pass runs, for each query block, an online softmax over
# the key blocks up to the diagonal and keeps only the output and each query's log-partition
# (fp32); the backward pass runs, for each key block, over the query blocks from the diagonal on,
# recomputing their scores. Both are `fori_loop`s (the backward is written out, never
# differentiated), so one block pair's scores are alive at a time: O(chunk^2) memory where the
# unrolled chunks let the compiler keep several [chunk, S] score blocks at once (6 GB more than
# the stored probabilities on the hybrid preset, measured). The model takes it where the step is
# built for a TPU or GPU (`model.attention_backward`); on CPU the stored probabilities stay faster.


def _queries_first(x_BxSxHxK, g: int, pad: int):
  """[B, S, H, K] -> [B, G, (S + pad) * R, K]: the R query heads of a kv group next to each other,
  position-major, padded with `pad` positions."""
  b, s, h, kd = x_BxSxHxK.shape
  x = jnp.pad(x_BxSxHxK, ((0, 0), (0, pad), (0, 0), (0, 0)))
  return x.reshape(b, s + pad, g, h // g, kd).transpose(0, 2, 1, 3, 4).reshape(b, g, -1, kd)


def _blocked(q_BxSxHxK, k_BxSxGxK, v_BxSxGxK, segment_ids_BxS, chunk: int):
  """Heads-first operands padded to whole blocks: queries [B, G, S'*R, K] (`_queries_first`),
  keys and values [B, G, S', K], segment ids [B, S'] (padding -1: it sees only itself)."""
  b, s = q_BxSxHxK.shape[:2]
  pad = -s % chunk
  seg = (jnp.zeros((b, s), jnp.int32) if segment_ids_BxS is None
         else segment_ids_BxS.astype(jnp.int32))
  seg = jnp.pad(seg, ((0, 0), (0, pad)), constant_values=-1)
  k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
          for x in (k_BxSxGxK, v_BxSxGxK))
  return _queries_first(q_BxSxHxK, k_BxSxGxK.shape[2], pad), k, v, seg


def _block_mask(seg, i, j, chunk: int):
  """[B, C, C]: query block i against key block j (causal by position, same segment)."""
  sq = jax.lax.dynamic_slice_in_dim(seg, i * chunk, chunk, axis=1)
  sk = jax.lax.dynamic_slice_in_dim(seg, j * chunk, chunk, axis=1)
  causal = (j * chunk + jnp.arange(chunk))[None, :] <= (i * chunk + jnp.arange(chunk))[:, None]
  return causal[None] & (sq[:, :, None] == sk[:, None, :])


def _recomputed_fwd(q_BxSxHxK, k_BxSxGxK, v_BxSxGxK, segment_ids_BxS, scale, chunk):
  b, s, h, kd = q_BxSxHxK.shape
  g = k_BxSxGxK.shape[2]
  r, c = h // g, chunk
  q, k, v, seg = _blocked(q_BxSxHxK, k_BxSxGxK, v_BxSxGxK, segment_ids_BxS, c)
  n = seg.shape[1] // c
  rows = lambda x, i: jax.lax.dynamic_slice_in_dim(x, i * c * r, c * r, axis=2)
  keys = lambda x, j: jax.lax.dynamic_slice_in_dim(x, j * c, c, axis=2)

  def query_block(i, carry):
    out, lse = carry
    qi = rows(q, i)

    def key_block(j, state):
      m, l, acc = state
      scores = jnp.einsum("bgqk,bgtk->bgqt", qi, keys(k, j),
                          preferred_element_type=jnp.float32).reshape(b, g, c, r, c) * scale
      mask = _block_mask(seg, i, j, c)[:, None, :, None, :]
      m_new = jnp.maximum(m, jnp.max(jnp.where(mask, scores, NEG_INF), axis=-1))
      p = jnp.where(mask, jnp.exp(scores - m_new[..., None]), 0.0)
      fade = jnp.exp(m - m_new)
      pv = jnp.einsum("bgqt,bgtk->bgqk", p.reshape(b, g, c * r, c).astype(v.dtype), keys(v, j),
                      preferred_element_type=jnp.float32).reshape(b, g, c, r, kd)
      return m_new, l * fade + jnp.sum(p, axis=-1), acc * fade[..., None] + pv

    init = (jnp.full((b, g, c, r), NEG_INF, jnp.float32), jnp.zeros((b, g, c, r), jnp.float32),
            jnp.zeros((b, g, c, r, kd), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, i + 1, key_block, init)
    o = (acc / l[..., None]).astype(v.dtype).reshape(b, g, c * r, kd)
    out = jax.lax.dynamic_update_slice_in_dim(out, o, i * c * r, axis=2)
    lse = jax.lax.dynamic_update_slice_in_dim(lse, (m + jnp.log(l)).reshape(b, g, c * r),
                                              i * c * r, axis=2)
    return out, lse

  out, lse = jax.lax.fori_loop(0, n, query_block, (jnp.zeros(q.shape, v.dtype),
                                                   jnp.zeros(q.shape[:3], jnp.float32)))
  res = (q, k, v, seg, out, lse)      # in the blocked layout, for the backward pass
  y = out.reshape(b, g, -1, r, kd)[:, :, :s].transpose(0, 2, 1, 3, 4)
  return y.reshape(b, s, h, kd), res


def _recomputed_bwd(scale, chunk, res, dout_BxSxHxK):
  q, k, v, seg, out, lse = res
  b, s, h, kd = dout_BxSxHxK.shape
  g = k.shape[1]
  r, c = h // g, chunk
  n = seg.shape[1] // c
  do = _queries_first(dout_BxSxHxK, g, n * c - s)
  # sum_t p_t * dp_t per query, from the output: the softmax's backward needs nothing else
  delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
  rows = lambda x, i: jax.lax.dynamic_slice_in_dim(x, i * c * r, c * r, axis=2)
  keys = lambda x, j: jax.lax.dynamic_slice_in_dim(x, j * c, c, axis=2)

  def key_block(j, carry):
    dq, dk, dv = carry
    kj, vj = keys(k, j), keys(v, j)

    def query_block(i, state):
      dq, dkj, dvj = state
      qi, doi = rows(q, i), rows(do, i)
      scores = jnp.einsum("bgqk,bgtk->bgqt", qi, kj,
                          preferred_element_type=jnp.float32).reshape(b, g, c, r, c) * scale
      mask = _block_mask(seg, i, j, c)[:, None, :, None, :]
      p = jnp.where(mask, jnp.exp(scores - rows(lse, i).reshape(b, g, c, r)[..., None]), 0.0)
      p = p.reshape(b, g, c * r, c)
      dvj = dvj + jnp.einsum("bgqt,bgqk->bgtk", p.astype(v.dtype), doi,
                             preferred_element_type=jnp.float32)
      dp = jnp.einsum("bgqk,bgtk->bgqt", doi, vj, preferred_element_type=jnp.float32)
      ds = (p * (dp - rows(delta, i)[..., None]) * scale).astype(q.dtype)
      dkj = dkj + jnp.einsum("bgqt,bgqk->bgtk", ds, qi, preferred_element_type=jnp.float32)
      dqi = rows(dq, i) + jnp.einsum("bgqt,bgtk->bgqk", ds, kj, preferred_element_type=jnp.float32)
      return jax.lax.dynamic_update_slice_in_dim(dq, dqi, i * c * r, axis=2), dkj, dvj

    zeros = jnp.zeros(kj.shape, jnp.float32)
    dq, dkj, dvj = jax.lax.fori_loop(j, n, query_block, (dq, zeros, zeros))
    return (dq, jax.lax.dynamic_update_slice_in_dim(dk, dkj, j * c, axis=2),
            jax.lax.dynamic_update_slice_in_dim(dv, dvj, j * c, axis=2))

  dq, dk, dv = jax.lax.fori_loop(
      0, n, key_block, (jnp.zeros(q.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32),
                        jnp.zeros(v.shape, jnp.float32)))
  dq = dq.reshape(b, g, -1, r, kd)[:, :, :s].transpose(0, 2, 1, 3, 4).reshape(b, s, h, kd)
  unpad = lambda x, like: x[:, :, :s].transpose(0, 2, 1, 3).astype(like.dtype)
  return dq.astype(q.dtype), unpad(dk, k), unpad(dv, v), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def recomputed_causal_attention(q_BxSxHxK, k_BxSxGxK, v_BxSxGxK, segment_ids_BxS, scale: float,
                                chunk: int = 512):
  """`causal_attention`'s values, with a backward pass that recomputes each block's scores from
  the stored output and log-partition instead of keeping the probabilities (see above)."""
  return _recomputed_fwd(q_BxSxHxK, k_BxSxGxK, v_BxSxGxK, segment_ids_BxS, scale, chunk)[0]


recomputed_causal_attention.defvjp(_recomputed_fwd, _recomputed_bwd)


def training_mask(segment_ids_BxS: jax.Array | None, b: int, s: int) -> jax.Array:
  causal = jnp.tril(jnp.ones((s, s), bool))[None]
  if segment_ids_BxS is None:
    return jnp.broadcast_to(causal, (b, s, s))
  same = segment_ids_BxS[:, :, None] == segment_ids_BxS[:, None, :]
  return causal & same


def cache_mask(positions_BxS: jax.Array, cache_len: int) -> jax.Array:
  return jnp.arange(cache_len)[None, None, :] <= positions_BxS[:, :, None]


def write_cache(cache: jax.Array, new_BxSxGxK: jax.Array, positions_BxS: jax.Array,
                layout: str):
  """Writes the new keys/values at their positions (slot == position), per row, into a cache laid
  out as `layout` ("bg" then "t" and "k" in either order)."""
  b, s = positions_BxS.shape
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, s))
  # Index arrays around slices: the indexed view is [B, S, G, K], the layout of the new values.
  index = [rows] + [slice(None)] * (len(layout) - 1)
  index[layout.index("t")] = positions_BxS
  return cache.at[tuple(index)].set(new_BxSxGxK.astype(cache.dtype), mode="drop")


class Attention(nnx.Module):
  """Qwen3-MoE attention; with `gated=True` the Qwen3.5 variant whose q_proj also yields a gate."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, gated: bool = False):
    d, h, g, k = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    kw = dict(rngs=rngs, dtype=DTYPES[cfg.dtype], param_dtype=DTYPES[cfg.param_dtype])
    self.gated = gated
    # Gated: per head, [query (K) | gate (K)], as Qwen3.5 lays out q_proj.
    self.q_proj = Linear(d, h * k * (2 if gated else 1), ("embed", "q_heads"), **kw)
    self.k_proj = Linear(d, g * k, ("embed", "kv_heads"), **kw)
    self.v_proj = Linear(d, g * k, ("embed", "kv_heads"), **kw)
    self.o_proj = Linear(h * k, d, ("q_heads", "embed"), **kw)
    self.q_norm = RMSNorm.for_model(cfg, k)
    self.k_norm = RMSNorm.for_model(cfg, k)
    self.h, self.g, self.k = h, g, k
    self.rotary_dim = cfg.rotary_dim
    self.theta = cfg.rope_theta
    # static: a tuple of (field, value) pairs, or None for plain RoPE
    self.rope_scaling = cfg.rope_scaling_items
    self.max_position_embeddings = cfg.max_position_embeddings
    self.dtype = DTYPES[cfg.dtype]
    self.attention_backward = cfg.attention_backward

  def _project(self, x_BxSxD):
    """(q, k, v) before normalisation: three matmuls, or one over the [q | k | v] rows that
    `decode_layout.for_decoding` stacks into `qkv_rows`."""
    if not hasattr(self, "qkv_rows"):
      return self.q_proj(x_BxSxD), self.k_proj(x_BxSxD), self.v_proj(x_BxSxD)
    qkv = rows_matmul(x_BxSxD, self.qkv_rows[...], self.dtype)
    nq, nkv = self.qkv_rows.shape[0] - 2 * self.g * self.k, self.g * self.k
    return qkv[..., :nq], qkv[..., nq:nq + nkv], qkv[..., nq + nkv:]

  def __call__(self, x_BxSxD, positions_BxS, segment_ids_BxS=None, cache=None):
    b, s, _ = x_BxSxD.shape
    q, k, v = self._project(x_BxSxD)
    gate = None
    if self.gated:
      q = q.reshape(b, s, self.h, 2 * self.k)
      q, gate = q[..., :self.k], q[..., self.k:]
    q = self.q_norm(q.reshape(b, s, self.h, self.k))
    k = self.k_norm(k.reshape(b, s, self.g, self.k))
    v = v.reshape(b, s, self.g, self.k)
    cos, sin = rope_cos_sin(positions_BxS, self.rotary_dim, self.theta, self.rope_scaling,
                            self.max_position_embeddings)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if cache is None:
      # query chunks of 128 suit CPU caches; on TPU larger chunks fill the matrix units and
      # keep the unrolled chunk loop (and its compile time) 4x shorter
      # on an accelerator the backward recomputes the probabilities rather than store them
      recompute = (self.attention_backward == "recomputed"
                   or (self.attention_backward == "auto" and not platform.is_cpu()))
      attend = recomputed_causal_attention if recompute else causal_attention
      out = attend(q, k, v, segment_ids_BxS, self.k ** -0.5,
                   chunk=512 if platform.is_tpu() else 128)
      new_cache = None
    else:
      new_cache = {n: write_cache(cache[n], x, positions_BxS, CACHE_LAYOUT[n])
                   for n, x in (("k", k), ("v", v))}
      k, v = new_cache["k"].astype(q.dtype), new_cache["v"].astype(q.dtype)
      t = k.shape[CACHE_LAYOUT["k"].index("t")]
      out = dot_attention(q, k, v, cache_mask(positions_BxS, t), self.k ** -0.5,
                          k_layout=CACHE_LAYOUT["k"], v_layout=CACHE_LAYOUT["v"])
    if gate is not None:
      out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
    return self.o_proj(out.reshape(b, s, self.h * self.k)), new_cache

  def init_cache(self, batch: int, max_len: int, dtype) -> dict:
    size = {"b": batch, "g": self.g, "t": max_len, "k": self.k}
    return {n: jnp.zeros(tuple(size[a] for a in layout), dtype)
            for n, layout in CACHE_LAYOUT.items()}
