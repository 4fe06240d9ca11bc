"""Gated DeltaNet: chunked == recurrent, segment resets, conv state continuation, HF parity (fixtures
from tools/make_deltanet_fixtures.py), and the NNX layer's decode cache."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lwm_jax.model import deltanet as dn
from lwm_jax.model.config import ModelConfig

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "deltanet_ref.npz")
TOL = 1e-5
# Jitted once per shape: eager dispatch of the many small ops is far slower on CPU than compiling.
CHUNK = jax.jit(dn.chunk_gated_delta_rule, static_argnames=("chunk_size", "use_qk_l2norm"))
REC = jax.jit(dn.recurrent_gated_delta_rule, static_argnames=("use_qk_l2norm",))
CONV = jax.jit(dn.causal_conv1d)
STEP = jax.jit(dn.gated_delta_step)


@nnx.jit
def _apply(m, x, segment_ids=None, cache=None):
  return m(x, segment_ids=segment_ids, cache=cache)


@pytest.fixture(scope="module")
def ref():
  return dict(np.load(FIXTURE))


def _inputs(seed: int, b=2, s=150, hk=2, hv=4, dk=8, dv=12):
  r = np.random.default_rng(seed)
  q = r.normal(size=(b, s, hk, dk)).astype(np.float32)
  k = r.normal(size=(b, s, hk, dk)).astype(np.float32)
  v = r.normal(size=(b, s, hv, dv)).astype(np.float32)
  g = (-np.exp(r.normal(size=(b, s, hv))) * 0.4).astype(np.float32)
  beta = (1 / (1 + np.exp(-r.normal(size=(b, s, hv))))).astype(np.float32)
  s0 = (0.5 * r.normal(size=(b, hv, dk, dv))).astype(np.float32)
  return q, k, v, g, beta, s0


def _np_delta_rule(q, k, v, g, beta, s0=None):
  """Independent numpy reference of the delta rule (docs/models.md), one row:
  q, k [S,Hk,Dk]; v [S,Hv,Dv]."""
  rep = v.shape[1] // k.shape[1]
  q, k = (np.repeat(a.astype(np.float64), rep, axis=1) for a in (q, k))
  q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(q.shape[-1])
  k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
  st = np.zeros((v.shape[1], k.shape[-1], v.shape[-1])) if s0 is None else s0.astype(np.float64)
  o = np.zeros(v.shape)
  for t in range(v.shape[0]):
    st = st * np.exp(g[t])[:, None, None]
    err = v[t] - np.einsum("hkv,hk->hv", st, k[t])
    st = st + np.einsum("hk,hv->hkv", k[t], beta[t][:, None] * err)
    o[t] = np.einsum("hkv,hk->hv", st, q[t])
  return o, st


def _close(a, b, tol=TOL):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=0)


# ----------------------------------------------------------------------------- delta rule
def test_rule_matches_transformers(ref):
  args = [ref["rule_" + n] for n in ("q", "k", "v", "g", "beta")]
  o, s = CHUNK(*args, chunk_size=64, initial_state=ref["rule_s0"])
  _close(o, ref["rule_o_chunk"]); _close(s, ref["rule_s_chunk"])
  o, s = REC(*args, initial_state=ref["rule_s0"])
  _close(o, ref["rule_o_rec"]); _close(s, ref["rule_s_rec"])


@pytest.mark.parametrize("chunk,with_state", [(64, True), (16, False)])
def test_chunked_equals_recurrent(chunk, with_state):
  q, k, v, g, beta, s0 = _inputs(1)
  init = s0 if with_state else None
  oc, sc = CHUNK(q, k, v, g, beta, chunk_size=chunk, initial_state=init)
  orr, sr = REC(q, k, v, g, beta, initial_state=init)
  _close(oc, orr); _close(sc, sr)


def test_single_step_equals_recurrent():
  q, k, v, g, beta, s0 = _inputs(2, s=5)
  orr, sr = REC(q, k, v, g, beta, initial_state=s0)
  state = jnp.asarray(s0)
  for t in range(5):
    o_t, state = STEP(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
    _close(o_t, orr[:, t])
  _close(state, sr)
  o_np, s_np = _np_delta_rule(q[0], k[0], v[0], g[0], beta[0], s0[0])
  _close(orr[0], o_np); _close(sr[0], s_np)


def _packed_ids(s=150):
  seg = np.ones((2, s), np.int32)
  seg[0, 40:] = 2; seg[0, 64:] = 3; seg[0, 100:140] = 4; seg[0, 140:] = 0   # starts at a chunk edge
  seg[1, 63:] = 5; seg[1, 65:] = 6; seg[1, 128:] = 7                        # one-token-long segments
  return seg


def _runs(row):
  """(start, end, id) of each non-padding run."""
  out, start = [], 0
  for t in range(1, len(row) + 1):
    if t == len(row) or row[t] != row[start]:
      if row[start] != 0:
        out.append((start, t, row[start]))
      start = t
  return out


def test_segment_resets_match_separate_runs():
  q, k, v, g, beta, _ = _inputs(3)
  seg = _packed_ids()
  oc, sc = CHUNK(q, k, v, g, beta, chunk_size=64, segment_ids=seg)
  orr, sr = REC(q, k, v, g, beta, segment_ids=seg)
  _close(oc, orr); _close(sc, sr)
  for b in range(2):
    for start, end, _ in _runs(seg[b]):
      o_sep, s_sep = _np_delta_rule(*(a[b, start:end] for a in (q, k, v, g, beta)))
      _close(oc[b, start:end], o_sep)
    _close(sc[b], s_sep)   # final state = state at the row's last real token (padding is transparent)


def test_padding_leaves_state_unchanged_and_initial_state_continues():
  q, k, v, g, beta, s0 = _inputs(4, s=70)
  seg = np.ones((2, 70), np.int32)
  seg[1, 30:] = 0
  _, s_pad = CHUNK(q, k, v, g, beta, chunk_size=64, initial_state=s0, segment_ids=seg)
  _, s_ref = _np_delta_rule(*(a[1, :30] for a in (q, k, v, g, beta)), s0=s0[1])
  _close(s_pad[1], s_ref)


def test_chunked_gradients_match_recurrent():
  q, k, v, g, beta, _ = _inputs(5, b=1, s=30)
  seg = np.ones((1, 30), np.int32); seg[0, 19:] = 2

  def loss(fn, q, k, v, g, beta):
    o, s = fn(q, k, v, g, beta)
    return jnp.sum(jnp.sin(o)) + jnp.sum(s ** 2)
  chunk = lambda *a: dn.chunk_gated_delta_rule(*a, chunk_size=8, segment_ids=seg)
  rec = lambda *a: dn.recurrent_gated_delta_rule(*a, segment_ids=seg)
  gc = jax.jit(jax.grad(lambda *a: loss(chunk, *a), argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta)
  gr = jax.jit(jax.grad(lambda *a: loss(rec, *a), argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta)
  for a, b in zip(gc, gr):
    _close(a, b, 1e-4)


def test_unit_lower_inverse_matches_numpy():
  r = np.random.default_rng(8)
  for n in (1, 16, 64, 12):                    # 12: the triangular-solve fallback
    a = np.tril(r.normal(size=(2, n, n)) * 0.3, -1).astype(np.float32)
    ref = np.linalg.inv(a.astype(np.float64) + np.eye(n))
    _close(dn.unit_lower_inverse(jnp.asarray(a)), ref, 1e-5 * max(1.0, np.abs(ref).max()))


def test_unit_lower_inverse_gradient_matches_a_dense_inverse():
  # The written-out gradient against autodiff of a dense inverse of I + tril(A, -1): equal on the
  # strictly lower part, zero on and above the diagonal (entries the forward pass never reads).
  r = np.random.default_rng(9)
  for n in (16, 12):
    a = jnp.asarray(r.normal(size=(3, n, n)) * 0.3, jnp.float32)
    w = jnp.asarray(r.normal(size=(3, n, n)), jnp.float32)
    ours = jax.grad(lambda x: jnp.sum(jnp.sin(dn.unit_lower_inverse(x)) * w))(a)
    dense = lambda x: jnp.linalg.inv(jnp.tril(x, -1) + jnp.eye(n))
    ref = jax.grad(lambda x: jnp.sum(jnp.sin(dense(x)) * w))(a)
    _close(ours, ref, 1e-4)
    assert float(jnp.max(jnp.abs(jnp.triu(ours)))) == 0.0


# ----------------------------------------------------------------------------------- conv
def test_conv_matches_transformers(ref):
  x, w = ref["conv_x"], ref["conv_w"]
  y, _ = CONV(x, w)
  _close(y, ref["conv_y"])
  state = np.ascontiguousarray(x[:, 4:7].transpose(0, 2, 1))   # the last K-1 inputs before t=7
  y2, _ = CONV(x[:, 7:], w, state)
  _close(y2, ref["conv_y_update"])


def test_conv_state_continuation():
  r = np.random.default_rng(6)
  x, w = r.normal(size=(2, 23, 5)).astype(np.float32), r.normal(size=(5, 4)).astype(np.float32)
  y_all, st_all = CONV(x, w)
  y1, st = CONV(x[:, :9], w)
  y2, st = CONV(x[:, 9:10], w, st)
  y3, st = CONV(x[:, 10:], w, st)
  _close(jnp.concatenate([y1, y2, y3], axis=1), y_all)
  _close(st, st_all)
  _close(st_all, x[:, -3:].transpose(0, 2, 1))


def test_conv_segments_and_padding():
  r = np.random.default_rng(7)
  x, w = r.normal(size=(2, 20, 3)).astype(np.float32), r.normal(size=(3, 4)).astype(np.float32)
  seg = np.array([[1] * 6 + [2] * 2 + [3] * 12, [1] * 15 + [0] * 5], np.int32)
  y, st = CONV(x, w, None, seg)
  for start, end, _ in _runs(seg[0]):
    y_sep, _ = CONV(x[:1, start:end], w)
    _close(y[0, start:end], y_sep[0])
  _, st_ref = CONV(x[1:, :15], w)
  _close(st[1], st_ref[0])                       # state at the real end of the padded row
  seg2 = np.array([[1] * 18 + [2] * 2], np.int32)  # last segment shorter than K-1: zeros before it
  _, st2 = CONV(x[:1], w, None, seg2)
  _close(st2[0], np.concatenate([np.zeros((3, 1)), x[0, 18:].T], axis=1))


def test_conv_gradients_match_a_reference_convolution():
  # The written-out backward pass against autodiff of XLA's own grouped convolution (one channel
  # per group, the window padded on the left by the carried state), for x, w and the state; and,
  # with segments, against the sum of each segment convolved on its own.
  r = np.random.default_rng(11)
  x = jnp.asarray(r.normal(size=(2, 20, 3)), jnp.float32)
  w = jnp.asarray(r.normal(size=(3, 4)), jnp.float32)
  st = jnp.asarray(r.normal(size=(2, 3, 3)), jnp.float32)
  ct = jnp.asarray(r.normal(size=(2, 20, 3)), jnp.float32)

  def reference(x, w, st):
    xp = jnp.concatenate([jnp.swapaxes(st, 1, 2), x], axis=1)       # [B, S+K-1, C]
    return jax.lax.conv_general_dilated(xp, w.T[:, None, :], (1,), "VALID",
                                        dimension_numbers=("NWC", "WIO", "NWC"),
                                        feature_group_count=3)
  ours = jax.grad(lambda *a: jnp.sum(jnp.sin(CONV(*a)[0]) * ct), argnums=(0, 1, 2))(x, w, st)
  ref = jax.grad(lambda *a: jnp.sum(jnp.sin(reference(*a)) * ct), argnums=(0, 1, 2))(x, w, st)
  for a, b in zip(ours, ref):
    _close(a, b, 1e-5)

  seg = np.array([[1] * 6 + [2] * 2 + [3] * 12, [1] * 15 + [0] * 5], np.int32)
  ct = ct * (seg != 0)[..., None]                   # padding outputs are not part of the reference
  ours = jax.grad(lambda x, w: jnp.sum(jnp.sin(CONV(x, w, None, seg)[0]) * ct),
                  argnums=(0, 1))(x, w)
  def separate(x, w):
    total = 0.0
    for row in range(2):
      for start, end, sid in _runs(seg[row]):
        if sid:
          y = CONV(x[row:row + 1, start:end], w)[0]
          total = total + jnp.sum(jnp.sin(y) * ct[row:row + 1, start:end])
    return total
  ref = jax.grad(separate, argnums=(0, 1))(x, w)
  for a, b in zip(ours, ref):
    _close(a, b, 1e-5)


# ---------------------------------------------------------------------------------- layer
def _layer_config(chunk=64) -> ModelConfig:
  return ModelConfig(model_type="qwen3_5_moe_text", vocab_size=64, hidden_size=32,
                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                     num_experts=4, num_experts_per_tok=2, linear_num_key_heads=2,
                     linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                     linear_conv_kernel_dim=4, linear_attn_chunk_size=chunk).validate()


@pytest.fixture(scope="module")
def layer(ref):
  m = dn.GatedDeltaNet(_layer_config(), nnx.Rngs(0))
  p = {k[len("layer."):]: v for k, v in ref.items() if k.startswith("layer.")}
  for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
    getattr(m, name).kernel[...] = jnp.asarray(p[name + ".weight"].T)
  m.conv1d[...] = jnp.asarray(p["conv1d.weight"][:, 0, :])
  m.A_log[...] = jnp.asarray(p["A_log"])
  m.dt_bias[...] = jnp.asarray(p["dt_bias"])
  m.norm.scale[...] = jnp.asarray(p["norm.weight"])
  return m


def test_layer_matches_transformers(layer, ref):
  y, cache = _apply(layer, jnp.asarray(ref["layer_x"]))
  assert cache is None
  _close(y, ref["layer_y"])


def test_layer_decode_cache_matches_full_sequence(layer, ref):
  x = jnp.asarray(ref["layer_x"])
  y_full, _ = _apply(layer, x)
  cache = layer.init_cache(1)
  y0, cache = _apply(layer, x[:, :100], cache=cache)                 # chunked prefill
  ys = [y0]
  for t in range(100, 102):                                    # recurrent single steps
    y_t, cache = _apply(layer, x[:, t:t + 1], cache=cache)
    ys.append(y_t)
  y_rest, cache = _apply(layer, x[:, 102:], cache=cache)              # chunked continuation
  ys.append(y_rest)
  _close(jnp.concatenate(ys, axis=1), y_full)


def test_layer_right_padded_prefill_and_packing(layer, ref):
  # Shapes reuse the compilations of the decode test where they can.
  x = jnp.asarray(ref["layer_x"])
  xb = jnp.concatenate([x, x], axis=0)[:, :120]
  seg = np.ones((2, 120), np.int32); seg[1, 100:] = 0
  _, cache = _apply(layer, xb, segment_ids=seg, cache=layer.init_cache(2))
  _, cache_ref = _apply(layer, x[:, :100], cache=layer.init_cache(1))
  _close(cache["conv_state"][1], cache_ref["conv_state"][0])
  _close(cache["ssm_state"][1], cache_ref["ssm_state"][0])
  # The next token of the padded row continues from its real end (HF output as reference).
  y_next, _ = _apply(layer, x[:, 100:101], cache=jax.tree.map(lambda a: a[1:], cache))
  _close(y_next[0, 0], ref["layer_y"][0, 100])
  # Packed training: the second document behaves as if alone (a zero cache is no cache).
  seg = np.array([[1] * 50 + [2] * 100], np.int32)
  y_packed, _ = _apply(layer, x, segment_ids=seg)
  y_alone, _ = _apply(layer, x[:, 50:], cache=layer.init_cache(1))
  _close(y_packed[0, :50], ref["layer_y"][0, :50])
  _close(y_packed[0, 50:], y_alone[0])
