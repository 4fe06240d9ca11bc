"""Gated DeltaNet: the linear-attention layer of Qwen3.5-MoE.

Pure functions first (causal depthwise conv, the gated delta rule in chunked and recurrent form, a single
decode step), then the NNX layer. All recurrence math runs in float32.

Shapes: B batch, S sequence, C conv channels, K conv kernel, Hk key heads, Hv value heads, Dk key head dim,
Dv value head dim, N chunk size.

Packed sequences: `segment_ids_BxS` (int, 0 = padding). A token whose id differs from the previous token's
and is not 0 starts a new segment: the delta state and the conv window restart from zero there. Position 0
never starts a segment: it continues the carried state (zero unless one is passed in). Padding tokens are
transparent: they get `g = 0` and `beta = 0`, so the delta state passes through them unchanged, and the
conv state returned is the one at each row's last non-padding token. Ids are expected to be contiguous runs
with padding only at the end of a row (a run resumed after padding counts as a new segment).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lwm_jax.model.config import ModelConfig
from lwm_jax.model.layers import DTYPES, Linear, RMSNorm, normalize_rows, param

Array = jax.Array
F32 = jnp.float32


# ------------------------------------------------------------------------------------------- helpers
def segment_groups(segment_ids_BxS: Array) -> Array:
  """Group index per token: increments at every segment start; padding joins the group before it."""
  seg = segment_ids_BxS.astype(jnp.int32)
  prev = jnp.concatenate([seg[:, :1], seg[:, :-1]], axis=1)
  start = (seg != prev) & (seg != 0)
  return jnp.cumsum(start.astype(jnp.int32), axis=1)


def l2norm(x: Array, eps: float = 1e-6, written_backward: bool = False) -> Array:
  """x / sqrt(sum(x^2) + eps) over the last axis (the form `transformers` and FLA use); with
  `written_backward`, in fp32 with `layers.normalize_rows`' gradient."""
  if written_backward:
    return normalize_rows(x, eps, False)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _prepare_qk(q: Array, k: Array, num_v_heads: int, use_qk_l2norm: bool) -> tuple[Array, Array]:
  """Repeats key heads to the value heads (each key head serves consecutive value heads), fp32,
  optional L2 norm, and the Dk**-0.5 query scale. Head axis is -2."""
  rep = num_v_heads // k.shape[-2]
  if rep * k.shape[-2] != num_v_heads:
    raise ValueError(f"gated delta rule: {num_v_heads} value heads are not a multiple of "
                     f"{k.shape[-2]} key heads")
  q, k = q.astype(F32), k.astype(F32)
  if rep > 1:
    q = jnp.repeat(q, rep, axis=-2)
    k = jnp.repeat(k, rep, axis=-2)
  if use_qk_l2norm:
    q, k = l2norm(q), l2norm(k)
  return q * (q.shape[-1] ** -0.5), k


@jax.custom_vjp
def unit_lower_inverse(a_NxN: Array) -> Array:
  """(I + A)^-1 for strictly lower-triangular A (last two axes; only the strictly lower part is
  read), by recursive 2x2 blocking: inv([[P, 0], [C, Q]]) = [[P^-1, 0], [-Q^-1 C P^-1, Q^-1]];
  log2(N) levels of batched matmuls (XLA's CPU triangular_solve and its gradient are far slower).
  N that is not a power of two falls back to a triangular solve. The gradient is written out
  (`_unit_lower_inverse_bwd`): two full-size matmuls instead of differentiating every level."""
  return _unit_lower_inverse(a_NxN)


def _unit_lower_inverse(a_NxN: Array) -> Array:
  n = a_NxN.shape[-1]
  eye = jnp.eye(n, dtype=a_NxN.dtype)
  if n & (n - 1):
    return jax.lax.linalg.triangular_solve(a_NxN + eye, jnp.broadcast_to(eye, a_NxN.shape),
                                           left_side=True, lower=True, unit_diagonal=True)
  lead = a_NxN.shape[:-2]
  inv = jnp.ones(lead + (n, 1, 1), a_NxN.dtype)                # inverses of the 1x1 diagonal blocks
  bs = 1
  while bs < n:
    nb = n // bs
    blocks = a_NxN.reshape(lead + (nb, bs, nb, bs))
    # Sub-diagonal block (2j+1, 2j) of each pair: [..., nb/2, bs, bs].
    c = jnp.moveaxis(jnp.diagonal(blocks[..., 1::2, :, 0::2, :], axis1=-4, axis2=-2), -1, -3)
    p_inv, q_inv = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
    off = -(q_inv @ c @ p_inv)
    top = jnp.concatenate([p_inv, jnp.zeros_like(p_inv)], axis=-1)
    bottom = jnp.concatenate([off, q_inv], axis=-1)
    inv = jnp.concatenate([top, bottom], axis=-2)
    bs *= 2
  return inv[..., 0, :, :]


def _unit_lower_inverse_fwd(a_NxN: Array):
  t = _unit_lower_inverse(a_NxN)
  return t, t


def _unit_lower_inverse_bwd(t_NxN: Array, dt_NxN: Array):
  # T = (I + A)^-1 gives dT = -T dA T, so dL/dA = -T^T (dL/dT) T^T, kept on the strictly lower
  # part (the only entries the forward pass reads).
  tt = jnp.swapaxes(t_NxN, -1, -2)
  return (jnp.tril(-(tt @ dt_NxN @ tt), -1),)


unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


def _mask_padding(g: Array, beta: Array, segment_ids_BxS: Array | None) -> tuple[Array, Array]:
  g, beta = g.astype(F32), beta.astype(F32)
  if segment_ids_BxS is None:
    return g, beta
  real = (segment_ids_BxS != 0)[..., None]
  return jnp.where(real, g, 0.0), jnp.where(real, beta, 0.0)


# --------------------------------------------------------------------------------------- causal conv
def causal_conv1d(x_BxSxC: Array, w_CxK: Array, conv_state_BxCxKm1: Array | None = None,
                  segment_ids: Array | None = None) -> tuple[Array, Array]:
  """Depthwise causal conv, no bias, no activation: y[t] = sum_j w[:, j] * xpad[t + j], where xpad is x
  left-padded with the K-1 carried inputs (zeros when none). With segment ids, inputs from an earlier
  segment are left out of a window. Returns (y_BxSxC, new conv_state_BxCxKm1 = the last K-1 inputs;
  with segment ids, the K-1 inputs ending at each row's last non-padding token)."""
  B, S, C = x_BxSxC.shape
  K = w_CxK.shape[1]
  if w_CxK.shape[0] != C:
    raise ValueError(f"causal_conv1d: weight has {w_CxK.shape[0]} channels, input has {C}")
  x = x_BxSxC.astype(F32)
  if conv_state_BxCxKm1 is None:
    prev = jnp.zeros((B, K - 1, C), F32)
  else:
    prev = jnp.swapaxes(conv_state_BxCxKm1, 1, 2).astype(F32)
  xp = jnp.concatenate([prev, x], axis=1)                      # [B, S+K-1, C]
  w = w_CxK.astype(F32)
  if segment_ids is None:
    y = _conv_taps(xp, w, None)
    new_state = xp[:, S:]                                      # [B, K-1, C]
  else:
    grp = segment_groups(segment_ids)                     # [B, S]; the carried inputs are group 0
    grp_p = jnp.concatenate([jnp.zeros((B, K - 1), grp.dtype), grp], axis=1)
    same_KxBxS = jnp.stack([grp_p[:, j:j + S] == grp for j in range(K)])
    y = _conv_taps(xp, w, same_KxBxS)
    # Window ending at the last real token of each row (index into xp: last + K-1).
    n_real = jnp.sum(segment_ids != 0, axis=1)            # right padding: the real prefix length
    last = jnp.maximum(n_real - 1, -1)                        # -1 = no real token: keep the carried state
    idx = last[:, None] + 1 + jnp.arange(K - 1)[None, :]      # [B, K-1] positions in xp
    win = jnp.take_along_axis(xp, idx[..., None], axis=1)
    gwin = jnp.take_along_axis(grp_p, idx, axis=1)
    glast = jnp.take_along_axis(grp_p, (last + K - 1)[:, None], axis=1)
    new_state = jnp.where((gwin == glast)[..., None], win, 0.0)
  return y.astype(x_BxSxC.dtype), jnp.swapaxes(new_state, 1, 2)


def _masked(a_BxSxC: Array, same_KxBxS: Array | None, j: int) -> Array:
  """`a` with the positions where tap j reads an earlier segment zeroed (all kept without masks)."""
  return a_BxSxC if same_KxBxS is None else jnp.where(same_KxBxS[j][..., None], a_BxSxC, 0.0)


@jax.custom_vjp
def _conv_taps(xp_BxSpxC: Array, w_CxK: Array, same_KxBxS: Array | None) -> Array:
  """y[:, t] = sum_j w[:, j] * xp[:, t + j] (tap j masked by same[j] when given), S = Sp - K + 1.
  The backward pass is written out: differentiated by XLA, the weight gradient became one
  reduction per tap that ran at a few percent of the CPU's speed (about 90 ms of a 2048-token
  layer's backward pass at `small_hybrid`, against 9 ms written out)."""
  k = w_CxK.shape[1]
  s = xp_BxSpxC.shape[1] - k + 1
  return sum(_masked(xp_BxSpxC[:, j:j + s], same_KxBxS, j) * w_CxK[:, j] for j in range(k))


def _conv_taps_fwd(xp_BxSpxC, w_CxK, same_KxBxS):
  return _conv_taps(xp_BxSpxC, w_CxK, same_KxBxS), (xp_BxSpxC, w_CxK, same_KxBxS)


def _conv_taps_bwd(res, dy_BxSxC):
  xp, w, same = res
  k = w.shape[1]
  s = xp.shape[1] - k + 1
  dxp = sum(jnp.pad(_masked(dy_BxSxC * w[:, j], same, j), ((0, 0), (j, k - 1 - j), (0, 0)))
            for j in range(k))
  dw = jnp.stack([jnp.einsum("bsc,bsc->c", _masked(xp[:, j:j + s], same, j), dy_BxSxC)
                  for j in range(k)], axis=1)
  return dxp, dw, None


_conv_taps.defvjp(_conv_taps_fwd, _conv_taps_bwd)


# ---------------------------------------------------------------------------- gated delta rule
def gated_delta_step(q_t: Array, k_t: Array, v_t: Array, g_t: Array, beta_t: Array, state: Array,
                     use_qk_l2norm: bool = True) -> tuple[Array, Array]:
  """One decode step. q_t, k_t [B,Hk,Dk]; v_t [B,Hv,Dv]; g_t, beta_t [B,Hv]; state [B,Hv,Dk,Dv] (fp32).
  Returns (o_t [B,Hv,Dv] in v_t's dtype, new state)."""
  q, k = _prepare_qk(q_t, k_t, v_t.shape[-2], use_qk_l2norm)
  o, s = _delta_update(state.astype(F32), q, k, v_t.astype(F32), g_t.astype(F32),
                       beta_t.astype(F32))
  return o.astype(v_t.dtype), s


def _delta_update(s: Array, q: Array, k: Array, v: Array, g: Array, beta: Array):
  """S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q  (all prepared, fp32)."""
  s = s * jnp.exp(g)[..., None, None]
  kv_mem = jnp.einsum("bhkv,bhk->bhv", s, k)
  delta = (v - kv_mem) * beta[..., None]
  s = s + k[..., :, None] * delta[..., None, :]
  return jnp.einsum("bhkv,bhk->bhv", s, q), s


def recurrent_gated_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array,
                               initial_state: Array | None = None,
                               segment_ids: Array | None = None,
                               use_qk_l2norm: bool = True) -> tuple[Array, Array]:
  """Token-by-token reference form (a lax.scan). q, k [B,S,Hk,Dk]; v [B,S,Hv,Dv]; g, beta [B,S,Hv]
  (g is the log decay, <= 0); initial_state [B,Hv,Dk,Dv]. Returns (o [B,S,Hv,Dv], final state fp32)."""
  B, S, Hv, Dv = v.shape
  Dk = k.shape[-1]
  qf, kf = _prepare_qk(q, k, Hv, use_qk_l2norm)
  g, beta = _mask_padding(g, beta, segment_ids)
  s0 = jnp.zeros((B, Hv, Dk, Dv), F32) if initial_state is None else initial_state.astype(F32)
  if segment_ids is None:
    reset = jnp.zeros((B, S), bool)
  else:
    grp = segment_groups(segment_ids)
    reset = grp != jnp.concatenate([jnp.zeros((B, 1), grp.dtype), grp[:, :-1]], axis=1)

  def body(s, xs):
    q_t, k_t, v_t, g_t, b_t, r_t = xs
    s = jnp.where(r_t[:, None, None, None], 0.0, s)
    o_t, s = _delta_update(s, q_t, k_t, v_t, g_t, b_t)
    return s, o_t

  xs = tuple(jnp.moveaxis(a, 1, 0) for a in (qf, kf, v.astype(F32), g, beta, reset))
  s_final, o = jax.lax.scan(body, s0, xs)
  return jnp.moveaxis(o, 0, 1).astype(v.dtype), s_final


def chunk_gated_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array, chunk_size: int = 64,
                           initial_state: Array | None = None, segment_ids: Array | None = None,
                           use_qk_l2norm: bool = True) -> tuple[Array, Array]:
  """Chunked parallel form: per chunk a UT transform (a unit-lower-triangular inverse) and a few matmuls,
  then a lax.scan over chunks that carries the [Dk, Dv] state. Same arguments and results as
  `recurrent_gated_delta_rule`; S need not be a multiple of `chunk_size` (zero padding, which leaves the
  state unchanged since g = beta = 0 there)."""
  B, S, Hv, Dv = v.shape
  Dk = k.shape[-1]
  N = chunk_size
  qf, kf = _prepare_qk(q, k, Hv, use_qk_l2norm)
  g, beta = _mask_padding(g, beta, segment_ids)
  grp = (jnp.zeros((B, S), jnp.int32) if segment_ids is None else segment_groups(segment_ids))
  pad = (-S) % N
  if pad:
    # Padded tail: zeros for q/k/v/g/beta, group continued, so the final state is the one at token S-1.
    qf, kf, vf = (jnp.pad(a, ((0, 0), (0, pad), (0, 0), (0, 0))) for a in (qf, kf, v.astype(F32)))
    g, beta = (jnp.pad(a, ((0, 0), (0, pad), (0, 0))) for a in (g, beta))
    grp = jnp.pad(grp, ((0, 0), (0, pad)), mode="edge")
  else:
    vf = v.astype(F32)
  T = (S + pad) // N

  def chunks(a):  # [B, S', H, ...] -> [B, H, T, N, ...]
    return jnp.moveaxis(a.reshape((B, T, N) + a.shape[2:]), 3, 1)

  qc, kc, vc = chunks(qf), chunks(kf), chunks(vf)              # [B,H,T,N,D]
  gc, bc = chunks(g), chunks(beta)                             # [B,H,T,N]
  grp_c = grp.reshape(B, T, N)                                 # [B,T,N] (same for every head)
  grp_prev = jnp.concatenate([jnp.zeros((B, 1), grp.dtype), grp_c[:, :-1, -1]], axis=1)  # [B,T]

  tri = jnp.tril(jnp.ones((N, N), bool))                       # i >= j
  same = (grp_c[..., :, None] == grp_c[..., None, :]) & tri    # [B,T,N,N]
  same = same[:, None]                                         # [B,1,T,N,N]
  carry_in = (grp_c == grp_prev[..., None])[:, None, ..., None]  # [B,1,T,N,1]: reads the old state
  in_last = (grp_c == grp_c[..., -1:])[:, None, ..., None]     # [B,1,T,N,1]: survives to the chunk end
  keep_old = (grp_c[..., -1] == grp_prev)[:, None, :, None, None]  # [B,1,T,1,1]: no reset in chunk

  gam = jnp.cumsum(gc, axis=-1)                                # [B,H,T,N] log decay from chunk start
  diff = gam[..., :, None] - gam[..., None, :]
  decay = jnp.where(same, jnp.exp(jnp.where(same, diff, 0.0)), 0.0)  # [B,H,T,N,N]
  k_beta = kc * bc[..., None]
  v_beta = vc * bc[..., None]
  strict = same & ~jnp.eye(N, dtype=bool)
  a_mat = jnp.where(strict, jnp.einsum("bhtid,bhtjd->bhtij", k_beta, kc) * decay, 0.0)
  t_inv = unit_lower_inverse(a_mat)                            # (I + A)^-1, the UT transform
  u = t_inv @ v_beta                                           # new values
  w = t_inv @ (k_beta * (jnp.exp(gam)[..., None] * carry_in))  # decayed keys that read the old state
  attn = jnp.einsum("bhtid,bhtjd->bhtij", qc, kc) * decay      # intra-chunk, diagonal included
  q_dec = qc * (jnp.exp(gam)[..., None] * carry_in)
  k_dec = kc * (jnp.exp(gam[..., -1:] - gam)[..., None] * in_last)
  chunk_decay = jnp.exp(gam[..., -1])[..., None, None] * keep_old  # [B,H,T,1,1]

  s0 = jnp.zeros((B, Hv, Dk, Dv), F32) if initial_state is None else initial_state.astype(F32)

  def body(s, xs):
    u_t, w_t, q_t, k_t, a_t, d_t = xs
    v_new = u_t - jnp.einsum("bhnk,bhkv->bhnv", w_t, s)
    o_t = jnp.einsum("bhnk,bhkv->bhnv", q_t, s) + jnp.einsum("bhij,bhjv->bhiv", a_t, v_new)
    s = s * d_t + jnp.einsum("bhnk,bhnv->bhkv", k_t, v_new)
    return s, o_t

  xs = tuple(jnp.moveaxis(a, 2, 0) for a in
             (u, w, q_dec, k_dec, attn, jnp.broadcast_to(chunk_decay, (B, Hv, T, 1, 1))))
  s_final, o = jax.lax.scan(body, s0, xs)                     # o [T,B,H,N,Dv]
  o = jnp.moveaxis(o, 0, 2).reshape(B, Hv, T * N, Dv)[:, :, :S]
  return jnp.swapaxes(o, 1, 2).astype(v.dtype), s_final


# ------------------------------------------------------------------------------------------ NNX layer
class GatedDeltaNet(nnx.Module):
  """The linear-attention layer of Qwen3.5-MoE; parameter names follow Hugging Face.

  in_proj_qkv -> causal depthwise conv1d -> SiLU -> split q|k|v per head; beta = sigmoid(in_proj_b x);
  g = -exp(A_log) * softplus(in_proj_a x + dt_bias); gated delta rule (L2-normalised q/k, q scaled by
  Dk**-0.5); out_proj(norm(o) * silu(in_proj_z x)) with a plain-weight RMSNorm over Dv.
  """

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    cfg = config
    d = cfg.hidden_size
    self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    self.kernel_size = cfg.linear_conv_kernel_dim
    self.chunk_size = cfg.linear_attn_chunk_size
    self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
    self.conv_dim = 2 * self.key_dim + self.value_dim
    if self.hv % self.hk:
      raise ValueError(f"model.linear_num_value_heads: {self.hv} is not a multiple of "
                       f"linear_num_key_heads={self.hk}")
    pdt = DTYPES[cfg.param_dtype]
    self.dtype = DTYPES[cfg.dtype]
    kw = dict(rngs=rngs, dtype=self.dtype, param_dtype=pdt)
    self.in_proj_qkv = Linear(d, self.conv_dim, ("embed", "linear_qkv"), **kw)
    self.in_proj_z = Linear(d, self.value_dim, ("embed", "linear_v"), **kw)
    self.in_proj_b = Linear(d, self.hv, ("embed", "linear_heads"), **kw)
    self.in_proj_a = Linear(d, self.hv, ("embed", "linear_heads"), **kw)
    # HF stores conv1d.weight as [C, 1, K]; here [C, K]. Init matches torch's default Conv1d std.
    self.conv1d = param(rngs, (self.conv_dim, self.kernel_size), ("linear_qkv", "conv_kernel"),
                        scale=(3 * self.kernel_size) ** -0.5, dtype=pdt)
    a = jax.random.uniform(rngs.params(), (self.hv,), jnp.float32, 0.01, 16.0)
    self.A_log = nnx.Param(jnp.log(a).astype(pdt), axes=("linear_heads",))
    self.dt_bias = param(None, (self.hv,), ("linear_heads",), init="ones", dtype=pdt)
    self.written_norms = cfg.written_norms
    self.norm = RMSNorm(self.dv, cfg.rms_norm_eps, zero_centered=False, param_dtype=pdt,
                        written_backward=self.written_norms)
    self.out_proj = Linear(self.value_dim, d, ("linear_v", "embed"), **kw)

  def init_cache(self, batch: int, dtype=None) -> dict[str, Array]:
    """Zeroed decode cache: conv_state [B, C, K-1] (in `dtype`, default the compute dtype) and
    ssm_state [B, Hv, Dk, Dv] (always fp32). Its size does not depend on the sequence length."""
    return {"conv_state": jnp.zeros((batch, self.conv_dim, self.kernel_size - 1), dtype or self.dtype),
            "ssm_state": jnp.zeros((batch, self.hv, self.dk, self.dv), F32)}

  def __call__(self, x_BxSxD: Array, segment_ids: Array | None = None,
               cache: dict[str, Array] | None = None) -> tuple[Array, dict[str, Array] | None]:
    """Training (cache None): chunked form over the whole sequence, packed segments reset the state.
    With a cache: continues from its conv/ssm state (prefill uses the chunked form, one token the
    recurrent step) and returns the updated cache; padding tokens (segment id 0) leave it unchanged."""
    b, s, _ = x_BxSxD.shape
    mixed = self.in_proj_qkv(x_BxSxD)                          # [B, S, C]
    conv_state = None if cache is None else cache["conv_state"]
    mixed, new_conv = causal_conv1d(mixed, self.conv1d[...], conv_state, segment_ids)
    mixed = jax.nn.silu(mixed.astype(F32))
    q = mixed[..., :self.key_dim].reshape(b, s, self.hk, self.dk)
    k = mixed[..., self.key_dim:2 * self.key_dim].reshape(b, s, self.hk, self.dk)
    v = mixed[..., 2 * self.key_dim:].reshape(b, s, self.hv, self.dv)
    # q, k L2-normalised here (per key head, before the rule repeats them to the value heads) so
    # that the norm's backward form follows the config
    q, k = (l2norm(a, written_backward=self.written_norms) for a in (q, k))
    z = self.in_proj_z(x_BxSxD).reshape(b, s, self.hv, self.dv)
    beta = jax.nn.sigmoid(self.in_proj_b(x_BxSxD).astype(F32))
    a = self.in_proj_a(x_BxSxD).astype(F32)
    g = -jnp.exp(self.A_log[...].astype(F32)) * jax.nn.softplus(a + self.dt_bias[...].astype(F32))
    state = None if cache is None else cache["ssm_state"]
    if cache is not None and s == 1:
      o, new_state = recurrent_gated_delta_rule(q, k, v, g, beta, state, segment_ids,
                                                use_qk_l2norm=False)
    else:
      o, new_state = chunk_gated_delta_rule(q, k, v, g, beta, self.chunk_size, state, segment_ids,
                                            use_qk_l2norm=False)
    o = self.norm(o.astype(self.dtype))
    o = (o.astype(F32) * jax.nn.silu(z.astype(F32))).astype(self.dtype)
    y = self.out_proj(o.reshape(b, s, self.value_dim))
    if cache is None:
      return y, None
    return y, {"conv_state": new_conv.astype(cache["conv_state"].dtype), "ssm_state": new_state}
