"""Basic layers: parameters with logical axis names, linear maps, RMSNorm, RoPE, SwiGLU.

Every parameter carries `axes`, a tuple of logical axis names (one per dimension). `lwm_jax.sharding`
maps those names to mesh axes with rules from the config, so the modules never mention a mesh.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def param(rngs: nnx.Rngs | None, shape: tuple[int, ...], axes: tuple[str | None, ...],
          init: str = "normal", scale: float = 0.02, dtype=jnp.float32) -> nnx.Param:
  """A parameter with logical axis names. `init` is normal(scale), zeros or ones."""
  assert len(shape) == len(axes), (shape, axes)
  if init == "zeros":
    value = jnp.zeros(shape, dtype)
  elif init == "ones":
    value = jnp.ones(shape, dtype)
  else:
    value = (scale * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, axes=tuple(axes))


def rows_matmul(x_NxI: jax.Array, w_OxI: jax.Array, out_dtype=None) -> jax.Array:
  """x @ w.T for a weight stored [out, in], in the form that streams weights fastest on CPU when
  x has few rows (decoding): the weight is the left operand, both operands contract their
  contiguous last dim, and accumulation is fp32 whatever the weight dtype (x is cast to it).

  XLA would fold the final transpose into the dot by swapping its operands, a form that reads a
  bfloat16 weight 2-20x slower (benchmarks/results/sampling.json); the optimization barrier keeps
  the product [out, N] as computed, and only the small result is transposed."""
  lead = x_NxI.shape[:-1]
  x2 = x_NxI.reshape(-1, x_NxI.shape[-1]).astype(w_OxI.dtype)
  n = x2.shape[0]
  if n == 1 and w_OxI.dtype != jnp.float32:
    x2 = jnp.concatenate([x2, x2])  # XLA's one-row bfloat16 kernel is ~10x slower than two rows
  y = jax.lax.dot_general(w_OxI, x2, (((1,), (1,)), ((), ())),
                          preferred_element_type=jnp.float32)
  y = jax.lax.optimization_barrier(y)[:, :n].T
  return y.reshape(*lead, w_OxI.shape[0]).astype(out_dtype or x_NxI.dtype)


class Linear(nnx.Module):
  """y = x @ kernel, kernel stored [in, out] (Hugging Face stores the transpose).

  `lwm_jax.model.decode_layout` may store the kernel [out, in] instead (`transposed=True`), in the
  layout `rows_matmul` reads fastest when decoding a few rows at a time."""

  def __init__(self, d_in: int, d_out: int, axes: tuple[str | None, str | None], *,
               rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32, scale: float = 0.02):
    self.kernel = param(rngs, (d_in, d_out), axes, scale=scale, dtype=param_dtype)
    self.dtype = dtype
    self.transposed = False

  def __call__(self, x: jax.Array) -> jax.Array:
    if self.transposed:
      return rows_matmul(x, self.kernel[...], self.dtype)
    return jnp.dot(x.astype(self.dtype), self.kernel[...].astype(self.dtype))


# ------------------------------------------------------------------------- normalisation
# Row normalisation and the per-channel scale with written-out backward passes, used where
# `model.norm_backward` says so (ModelConfig.written_norms). Differentiated by XLA on CPU, their sums
# (over a row for the normaliser, over every row for the scale's gradient) can become reduction
# fusions that run 10-20x slower than the same sums taken as products with a vector of ones (an
# RMSNorm over [2048, 512]: 18 ms forward+backward differentiated, 1 ms written out; about 0.3 s of
# a `small_hybrid` step at 1 x 2048). At other shapes the products are the slower form (the `demo`
# CPT step at 4 x 2048, hidden 128: 1.68 -> 2.10 s), hence the switch (benchmarks/results/speed.md).
# The forward values are the same either way.


def _row_sum(a: jax.Array) -> jax.Array:
  """Sum over the last axis, kept: a product with a ones vector."""
  return jnp.dot(a, jnp.ones((a.shape[-1], 1), a.dtype), preferred_element_type=jnp.float32)


def _column_sum(a: jax.Array) -> jax.Array:
  """Sum over every axis but the last: a product with a ones array over the leading axes."""
  lead = a.ndim - 1
  return jnp.tensordot(jnp.ones(a.shape[:-1], a.dtype), a, axes=(tuple(range(lead)),) * 2)


def _inverse_norm(x32: jax.Array, eps: float, mean: bool) -> jax.Array:
  return jax.lax.rsqrt((jnp.mean if mean else jnp.sum)(x32 * x32, axis=-1, keepdims=True) + eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def normalize_rows(x: jax.Array, eps: float, mean: bool = True) -> jax.Array:
  """x * rsqrt(mean(x^2) + eps) over the last axis (RMS; `mean=False`: the sum, an L2 norm), in
  fp32."""
  x32 = x.astype(jnp.float32)
  return x32 * _inverse_norm(x32, eps, mean)


def _normalize_rows_fwd(x, eps, mean):
  x32 = x.astype(jnp.float32)
  r = _inverse_norm(x32, eps, mean)
  return x32 * r, (x, r)


def _normalize_rows_bwd(eps, mean, res, dy):
  # y = x r with r = (agg + eps)^-1/2: dx = r (dy - y <y, dy> / n), n = row length (RMS) or 1 (L2).
  del eps
  x, r = res
  y = x.astype(jnp.float32) * r
  n = x.shape[-1] if mean else 1
  dy = dy.astype(jnp.float32)
  return ((r * (dy - y * (_row_sum(y * dy) / n))).astype(x.dtype),)


normalize_rows.defvjp(_normalize_rows_fwd, _normalize_rows_bwd)


@jax.custom_vjp
def scale_channels(x: jax.Array, w: jax.Array) -> jax.Array:
  """x * w with w over the last axis (the weight gradient a sum over every row)."""
  return x * w


def _scale_channels_fwd(x, w):
  return x * w, (x, w)


def _scale_channels_bwd(res, dy):
  x, w = res
  return (dy * w).astype(x.dtype), _column_sum(x * dy).astype(w.dtype)


scale_channels.defvjp(_scale_channels_fwd, _scale_channels_bwd)


class RMSNorm(nnx.Module):
  """RMSNorm in fp32. `zero_centered=True` scales by (1 + w) with w stored near 0 (Qwen3.5).
  `written_backward=True` takes the gradients from `normalize_rows` / `scale_channels` (same values)."""

  def __init__(self, dim: int, eps: float, *, zero_centered: bool = False,
               param_dtype=jnp.float32, axes: tuple[str | None] = ("norm",),
               written_backward: bool = False):
    self.scale = param(None, (dim,), axes, init="zeros" if zero_centered else "ones",
                       dtype=param_dtype)
    self.eps = eps
    self.zero_centered = zero_centered
    self.written_backward = written_backward

  @classmethod
  def for_model(cls, cfg, dim: int) -> "RMSNorm":
    """The model's own RMSNorm over `dim` for a ModelConfig `cfg`: zero-centred in the hybrid,
    parameters in its param dtype, the backward form `cfg.norm_backward` picks."""
    return cls(dim, cfg.rms_norm_eps, zero_centered=cfg.is_hybrid,
               param_dtype=DTYPES[cfg.param_dtype], written_backward=cfg.written_norms)

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    if self.written_backward:
      x32, scale = normalize_rows(x, self.eps), scale_channels
    else:
      x32 = x.astype(jnp.float32)
      x32, scale = x32 * _inverse_norm(x32, self.eps, True), jnp.multiply
    w = self.scale[...].astype(jnp.float32)
    if self.zero_centered:
      return scale(x32, 1.0 + w).astype(dtype)
    # HF casts the normalised value back to the input dtype before the weight multiply.
    return scale(x32.astype(dtype).astype(jnp.float32), w).astype(dtype)


ROPE_TYPES = ("default", "linear", "yarn")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
  # YaRN's attention temperature: sqrt(1/t) = 0.1 ln(s) + 1 for a context stretched s times
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(rotary_dim: int, theta: float, scaling=None, max_position_embeddings: int = 0):
  """(inverse frequencies [rotary_dim / 2] float32, attention factor) for a RoPE scaling.

  `scaling` is ModelConfig.rope_scaling: None (plain RoPE) or pairs / a dict with `rope_type`
  "linear" (every frequency divided by `factor`) or "yarn" (the low frequencies divided by
  `factor`, the high ones kept, a linear ramp between them chosen by `beta_fast` / `beta_slow`
  rotations over the original context; cos and sin scaled by the attention factor). The
  formulas are those of transformers' `modeling_rope_utils` for the same fields, computed in
  float32 as it does.
  """
  base = jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim
  inv_freq = 1.0 / (theta ** base)
  sc = dict(scaling or ())
  kind = sc.get("rope_type", "default")
  if kind == "default":
    return inv_freq, 1.0
  if kind == "linear":
    return inv_freq / float(sc["factor"]), 1.0
  if kind != "yarn":
    raise ValueError(f"model.rope_scaling: rope_type '{kind}' is not supported "
                     f"(supported: {', '.join(ROPE_TYPES)})")
  # the pretrained context defaults to the model's; without `factor` the stretch is the ratio of
  # the two lengths (transformers 5 does the same; a given `factor` wins over the ratio)
  original = sc.get("original_max_position_embeddings") or max_position_embeddings
  factor = sc.get("factor")
  factor = float(factor) if factor is not None else max_position_embeddings / original
  attn = sc.get("attention_factor")
  if attn is None:
    m, m_all = sc.get("mscale"), sc.get("mscale_all_dim")
    attn = (_yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) if m and m_all
            else _yarn_mscale(factor))
  fast, slow = sc.get("beta_fast") or 32.0, sc.get("beta_slow") or 1.0

  def dim_for(rotations: float) -> float:
    # the rotary dimension whose wavelength fits `rotations` turns into the original context
    return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

  low, high = dim_for(fast), dim_for(slow)
  if sc.get("truncate", True):
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, rotary_dim - 1)
  if low == high:
    high += 0.001
  ramp = jnp.clip((jnp.arange(rotary_dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
  keep = 1 - ramp   # 1: the frequency is kept (extrapolated), 0: divided by factor
  pos_freqs = theta ** base
  inv_freq = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
  return inv_freq, float(attn)


def rope_cos_sin(positions_BxS: jax.Array, rotary_dim: int, theta: float, scaling=None,
                 max_position_embeddings: int = 0):
  """cos/sin tables [B, S, rotary_dim] in the rotate-half ("halves") layout of HF; `scaling` as in
  `rope_inv_freq` (None: plain RoPE, the tables as before scaling existed)."""
  if scaling is None:
    inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
    attn = 1.0
  else:
    inv_freq, attn = rope_inv_freq(rotary_dim, theta, scaling, max_position_embeddings)
  freqs = positions_BxS.astype(jnp.float32)[..., None] * inv_freq  # [B, S, rotary_dim/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  if attn == 1.0:
    return jnp.cos(emb), jnp.sin(emb)
  return jnp.cos(emb) * attn, jnp.sin(emb) * attn


def apply_rope(x_BxSxHxK: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates the first `cos.shape[-1]` dims of each head (partial RoPE leaves the rest)."""
  rd = cos.shape[-1]
  x_rot, x_pass = x_BxSxHxK[..., :rd], x_BxSxHxK[..., rd:]
  half = rd // 2
  rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
  c, s = cos[:, :, None, :], sin[:, :, None, :]
  out = (x_rot.astype(jnp.float32) * c + rotated.astype(jnp.float32) * s).astype(x_BxSxHxK.dtype)
  return jnp.concatenate([out, x_pass], axis=-1) if x_pass.shape[-1] else out


class SwiGLU(nnx.Module):
  """down(silu(gate x) * up x): the dense MLP and the Qwen3.5 shared expert."""

  def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.gate_proj = Linear(d_model, d_ff, ("embed", "mlp"), **kw)
    self.up_proj = Linear(d_model, d_ff, ("embed", "mlp"), **kw)
    self.down_proj = Linear(d_ff, d_model, ("mlp", "embed"), **kw)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))
