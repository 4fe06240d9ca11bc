"""Basic layers: parameters with logical axis names, linear maps, RMSNorm, RoPE, SwiGLU.

Every parameter carries `axes`, a tuple of logical axis names (one per dimension). `lwm_jax.sharding`
maps those names to mesh axes with rules from the config, so the modules never mention a mesh.
"""
from __future__ import annotations

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


class RMSNorm(nnx.Module):
  """RMSNorm in fp32. `zero_centered=True` scales by (1 + w) with w stored near 0 (Qwen3.5)."""

  def __init__(self, dim: int, eps: float, *, zero_centered: bool = False,
               param_dtype=jnp.float32, axes: tuple[str | None] = ("norm",)):
    self.scale = param(None, (dim,), axes, init="zeros" if zero_centered else "ones",
                       dtype=param_dtype)
    self.eps = eps
    self.zero_centered = zero_centered

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    w = self.scale[...].astype(jnp.float32)
    if self.zero_centered:
      return (x32 * (1.0 + w)).astype(dtype)
    # HF casts the normalised value back to the input dtype before the weight multiply.
    return (w * x32.astype(dtype).astype(jnp.float32)).astype(dtype)


def rope_cos_sin(positions_BxS: jax.Array, rotary_dim: int, theta: float):
  """cos/sin tables [B, S, rotary_dim] in the rotate-half ("halves") layout of HF."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
  freqs = positions_BxS.astype(jnp.float32)[..., None] * inv_freq  # [B, S, rotary_dim/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


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
