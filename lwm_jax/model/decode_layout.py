"""A copy of a model with its weights laid out for decoding a few tokens per step on CPU.

A decode step multiplies a handful of rows by every weight matrix once, so its speed is the speed
at which the weights stream from memory. On CPU, XLA streams a weight fastest when it is the left
operand stored [out, in] and the rows are contracted along their contiguous dim (see
`layers.rows_matmul`); the [in, out] kernels used for training run 1.5-3x slower in that regime,
and a bfloat16 copy halves the bytes again. `for_decoding(model, dtype)` returns a new
`Transformer` that shares the config, norms, router and embedding with `model` and holds:

- every `Linear` kernel transposed to [out, in] (optionally cast to `dtype`), and each attention
  layer's q, k and v projections stacked into one [q | k | v] matrix (one matmul instead of three);
- each MoE layer's experts as two matrices, gate/up [E*2I, D] (per expert: I gate rows, then I up
  rows) and down [D, E*I], run by the `rows` MoE backend (every expert on every row, weighted by
  the routing matrix that is zero for unchosen experts: the same sum as the sparse backends);
- with tied embeddings, the output projection reads the embedding, already [vocab, hidden].

Prefill keeps the original model: the cache format is the same. The copy costs one more set of
weights in memory (half of it in bfloat16). With `dtype=None` the results equal the original
model's up to float summation order; with bfloat16 the rows are rounded to bfloat16 before each
matmul and products accumulate in fp32.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lwm_jax.model.attention import Attention
from lwm_jax.model.layers import DTYPES, Linear
from lwm_jax.model.moe import MoE


def resolve_dtype(name: str | None):
  """The jnp dtype for a decode dtype name (None or '' keeps each weight's own dtype)."""
  if not name:
    return None
  if name not in DTYPES:
    raise ValueError(f"decode dtype '{name}' is not one of {sorted(DTYPES)}")
  return DTYPES[name]


def _weight(value, dtype):
  return nnx.Param(value if dtype is None else value.astype(dtype))


def for_decoding(model, dtype: str | None = None):
  """The decode-layout copy of `model` (a `Transformer`); `dtype` is None (keep each weight's
  dtype) or a name in `layers.DTYPES`."""
  dt = resolve_dtype(dtype)
  if model.decode_layout:
    raise ValueError("for_decoding: the model is already a decode-layout copy")
  graphdef, state = nnx.split(model)
  copy = nnx.merge(graphdef, state)  # new module objects over the same arrays
  modules = [module for _, module in nnx.iter_modules(copy)]  # listed before any is changed
  for module in modules:
    if isinstance(module, Linear):
      module.kernel = _weight(module.kernel[...].T, dt)
      module.transposed = True
    elif isinstance(module, MoE):
      e, d, i = module.gate_proj.shape
      gate_up = jnp.stack([module.gate_proj[...], module.up_proj[...]], axis=1)  # [E, 2, D, I]
      module.gate_up_rows = _weight(gate_up.transpose(0, 1, 3, 2).reshape(e * 2 * i, d), dt)
      module.down_rows = _weight(module.down_proj[...].transpose(2, 0, 1).reshape(d, e * i), dt)
      del module.gate_proj, module.up_proj, module.down_proj
      module.backend = "rows"
  for module in modules:  # q, k and v are [out, in] by now: stack their rows
    if isinstance(module, Attention):
      projs = (module.q_proj, module.k_proj, module.v_proj)
      module.qkv_rows = nnx.Param(jnp.concatenate([p.kernel[...] for p in projs], axis=0))
      del module.q_proj, module.k_proj, module.v_proj
  if copy.cfg.tie_word_embeddings:
    copy.tied_head = _weight(copy.embed_tokens[...], dt)
  copy.decode_layout = True
  return copy
