"""Model unit tests against independent numpy references (HF parity lives in test_hf.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lwm_jax.model import sizes
from lwm_jax.model.config import ModelConfig, get_preset
from lwm_jax.model.moe import MoE
from lwm_jax.model.transformer import Transformer, segment_positions


@nnx.jit
def _forward(model, tokens, positions=None, segment_ids=None, cache=None):
  """The model's forward pass, compiled once per shape: run eagerly, every op of it would be
  compiled on its own, which costs far more on CPU."""
  return model(tokens, positions, segment_ids=segment_ids, cache=cache)


def _moe_numpy(x, router, wg, wu, wd, k, norm):
  """Token-by-token loop: softmax router in float64, top-k, SwiGLU experts."""
  x = np.asarray(x, np.float64)
  logits = x @ np.asarray(router, np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  out = np.zeros_like(x)
  for n in range(x.shape[0]):
    top = np.argsort(-p[n], kind="stable")[:k]
    w = p[n, top] / (p[n, top].sum() if norm else 1.0)
    for e, we in zip(top, w):
      g = x[n] @ wg[e]
      h = g / (1 + np.exp(-g)) * (x[n] @ wu[e])
      out[n] += we * (h @ wd[e])
  return out, p


@pytest.mark.parametrize("backend", ["dense", "blocked", "tiled", "ragged_dot", "capacity"])
@pytest.mark.parametrize("norm", [True, False])
def test_moe_backends_match_numpy(backend, norm):
  cfg = get_preset("tiny", moe_backend=backend, norm_topk_prob=norm, capacity_factor=8.0)
  moe = MoE(cfg, rngs=nnx.Rngs(1))
  x = jax.random.normal(jax.random.key(0), (3, 13, cfg.hidden_size))
  y, stats = moe(x)
  ref, _ = _moe_numpy(x.reshape(-1, cfg.hidden_size), moe.router[...], moe.gate_proj[...],
                      moe.up_proj[...], moe.down_proj[...], cfg.num_experts_per_tok, norm)
  np.testing.assert_allclose(np.asarray(y).reshape(ref.shape), ref, atol=1e-5)
  assert int(stats.dropped) == 0


def test_capacity_drops_are_counted():
  cfg = get_preset("tiny", moe_backend="capacity", capacity_factor=0.5)
  moe = MoE(cfg, rngs=nnx.Rngs(1))
  x = jax.random.normal(jax.random.key(0), (2, 16, cfg.hidden_size))
  _, stats = moe(x)
  # Independent count: assignments beyond capacity C per expert, in token order.
  logits = np.asarray(x.reshape(-1, cfg.hidden_size)) @ np.asarray(moe.router[...])
  top = np.argsort(-logits, axis=-1, kind="stable")[:, :cfg.num_experts_per_tok].reshape(-1)
  cap = int(np.ceil(0.5 * top.size / cfg.num_experts))
  expected = sum(max(0, int(np.sum(top == e)) - cap) for e in range(cfg.num_experts))
  assert expected > 0 and int(stats.dropped) == expected


def test_aux_loss_matches_hf_formula():
  cfg = get_preset("tiny", num_hidden_layers=2)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
  out = _forward(model, tokens)
  # Recompute every MoE layer's router input by hand-running the blocks.
  x = np.asarray(model.embed_tokens[...])[np.asarray(tokens)]
  counts = np.zeros(cfg.num_experts)
  probs = np.zeros(cfg.num_experts)
  rows = 0
  pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
  for blk in model.layers:
    h, _ = blk.self_attn(blk.input_layernorm(jnp.asarray(x)), pos)
    x = x + np.asarray(h)
    hn = np.asarray(blk.post_attention_layernorm(jnp.asarray(x))).reshape(-1, cfg.hidden_size)
    mo = blk.mlp.experts
    y, p = _moe_numpy(hn, mo.router[...], mo.gate_proj[...], mo.up_proj[...], mo.down_proj[...],
                      cfg.num_experts_per_tok, cfg.norm_topk_prob)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :cfg.num_experts_per_tok]
    counts += np.bincount(top.reshape(-1), minlength=cfg.num_experts)
    probs += p.sum(0)
    rows += p.shape[0]
    x = x + y.reshape(x.shape)
  expected = cfg.num_experts * np.sum((counts / rows) * (probs / rows))
  assert abs(float(out.aux_loss) - expected) < 1e-5


def test_packed_segments_equal_separate_sequences():
  cfg = get_preset("tiny")
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  a = jax.random.randint(jax.random.key(1), (1, 7), 0, cfg.vocab_size)
  b = jax.random.randint(jax.random.key(2), (1, 10), 0, cfg.vocab_size)
  packed = jnp.concatenate([a, b, jnp.zeros((1, 3), jnp.int32)], axis=1)
  seg = jnp.array([[1] * 7 + [2] * 10 + [0] * 3])
  out = _forward(model, packed, segment_ids=seg).logits
  np.testing.assert_allclose(out[0, :7], _forward(model, a).logits[0], atol=1e-5)
  np.testing.assert_allclose(out[0, 7:17], _forward(model, b).logits[0], atol=1e-5)


def test_segment_positions_restart():
  seg = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0]])
  assert segment_positions(seg).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]


def test_kv_cache_decode_equals_full_forward():
  cfg = get_preset("tiny")
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  toks = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
  full = _forward(model, toks).logits
  lens = jnp.array([8, 5])
  pos = jnp.broadcast_to(jnp.arange(8), (2, 8))
  out = _forward(model, toks[:, :8], pos, segment_ids=(pos < lens[:, None]).astype(jnp.int32),
                 cache=model.init_cache(2, 16))
  nxt = jnp.stack([toks[0, 8], toks[1, 5]])[:, None]
  step = _forward(model, nxt, lens[:, None], cache=out.cache)
  np.testing.assert_allclose(step.logits[0, 0], full[0, 8], atol=1e-5)
  np.testing.assert_allclose(step.logits[1, 0], full[1, 5], atol=1e-5)


def test_dense_layers_follow_mlp_only_and_sparse_step():
  cfg = get_preset("tiny", num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=(3,))
  assert [cfg.is_moe_layer(i) for i in range(4)] == [False, True, False, False]


def test_tied_embeddings_have_no_lm_head():
  cfg = get_preset("tiny", tie_word_embeddings=True)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  assert not hasattr(model, "lm_head")
  assert _forward(model, jnp.zeros((1, 3), jnp.int32)).logits.shape == (1, 3, cfg.vocab_size)


def test_config_validation_names_the_field():
  with pytest.raises(ValueError, match="model.num_key_value_heads"):
    get_preset("tiny", num_key_value_heads=3)
  with pytest.raises(ValueError, match="model.moe_backend"):
    get_preset("tiny", moe_backend="magic")
  with pytest.raises(ValueError, match="unknown model preset"):
    get_preset("huge")
  with pytest.raises(ValueError, match="unknown model config fields"):
    ModelConfig.from_dict({"hidden": 3})


def test_sizes_match_published_figures():
  small = sizes.count(get_preset("small"))
  # docs/models.md: 34.28M active per token (lookup excluded), 218 MFLOP/token at S=256.
  assert abs(small.active_params / 1e6 - 34.28) < 0.01
  assert abs(small.train_flops_per_token(get_preset("small"), 256) / 1e6 - 218) < 1
  big = sizes.count(get_preset("qwen3_30b_a3b"))
  assert abs(big.total_params / 1e9 - 30.5) < 0.1
  assert abs(big.active_with_embedding / 1e9 - 3.3) < 0.1


@pytest.mark.parametrize("segments", [True, False])
def test_chunked_causal_attention_equals_full_mask(segments):
  """Forward and gradients of the chunked attention against one full masked softmax, with the
  last chunk shorter than the others and (with `segments`) a document boundary inside a chunk."""
  from lwm_jax.model.attention import causal_attention, dot_attention, training_mask
  b, s, h, g, k = 2, 300, 4, 2, 8
  q = jax.random.normal(jax.random.key(0), (b, s, h, k))
  kk = jax.random.normal(jax.random.key(1), (b, s, g, k))
  v = jax.random.normal(jax.random.key(2), (b, s, g, k))
  w = jax.random.normal(jax.random.key(3), (b, s, h, k))
  seg = (jnp.concatenate([jnp.ones((b, 170), jnp.int32), 2 * jnp.ones((b, 130), jnp.int32)], 1)
         if segments else None)

  def full(q, kk, v):
    return dot_attention(q, kk, v, training_mask(seg, b, s), k ** -0.5)

  def chunked(q, kk, v):
    return causal_attention(q, kk, v, seg, k ** -0.5, chunk=64)

  # Compiled: eagerly, each of the five chunk shapes would compile every op again.
  want, got = jax.jit(full)(q, kk, v), jax.jit(chunked)(q, kk, v)
  np.testing.assert_allclose(got, want, atol=1e-5)
  grads = [jax.jit(jax.grad(lambda *a, f=f: (f(*a) * w).sum(), argnums=(0, 1, 2)))(q, kk, v)
           for f in (full, chunked)]
  for want_g, got_g in zip(*grads):
    np.testing.assert_allclose(got_g, want_g, atol=1e-4)



@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_norm_backward_passes_match_autodiff_of_the_plain_formulas(dtype):
  # `normalize_rows` and `scale_channels` write their backward passes out (layers.py says why);
  # here against XLA's autodiff of the same formulas written plainly, for RMS and L2 rows, and
  # through both RMSNorm flavours (the zero-centered one and HF's cast-then-scale one).
  from lwm_jax.model.layers import RMSNorm, normalize_rows, scale_channels
  r = np.random.default_rng(5)
  x = jnp.asarray(r.normal(size=(2, 7, 3, 16)) * 2, dtype)
  w = jnp.asarray(r.normal(size=(16,)), jnp.float32)
  ct = jnp.asarray(r.normal(size=x.shape), jnp.float32)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2

  def plain_rows(x, mean):
    x = x.astype(jnp.float32)
    agg = jnp.mean(x * x, -1, keepdims=True) if mean else jnp.sum(x * x, -1, keepdims=True)
    return x * jax.lax.rsqrt(agg + 1e-6)
  for mean in (True, False):
    ours = jax.grad(lambda x: jnp.sum(jnp.sin(normalize_rows(x, 1e-6, mean)) * ct))(x)
    ref = jax.grad(lambda x: jnp.sum(jnp.sin(plain_rows(x, mean)) * ct))(x)
    assert ours.dtype == dtype
    np.testing.assert_allclose(np.float32(ours), np.float32(ref), atol=tol, rtol=tol)
  xf = x.astype(jnp.float32)
  ours = jax.grad(lambda x, w: jnp.sum(jnp.sin(scale_channels(x, w)) * ct), (0, 1))(xf, w)
  ref = jax.grad(lambda x, w: jnp.sum(jnp.sin(x * w) * ct), (0, 1))(xf, w)
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-5)

  for zc in (True, False):
    norm = RMSNorm(16, 1e-6, zero_centered=zc, written_backward=True)
    norm.scale[...] = w
    g, p, rest = nnx.split(norm, nnx.Param, ...)
    def loss(p, x, plain):
      m = nnx.merge(g, p, rest)
      if not plain:
        return jnp.sum(jnp.sin(m(x).astype(jnp.float32)) * ct)
      s = m.scale[...]
      y = plain_rows(x, True)
      y = y * (1.0 + s) if zc else s * y.astype(x.dtype).astype(jnp.float32)
      return jnp.sum(jnp.sin(y.astype(x.dtype).astype(jnp.float32)) * ct)
    ours = jax.grad(loss, (0, 1))(p, x, False)
    ref = jax.grad(loss, (0, 1))(p, x, True)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
      np.testing.assert_allclose(np.float32(a), np.float32(b), atol=tol * 10, rtol=tol)


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_norm_backward_switch_keeps_the_hybrid_model_s_values_and_gradients():
  # `model.norm_backward` picks how the norms are differentiated, never what they compute: the
  # tiny hybrid (RMSNorms, q/k norms, DeltaNet's L2 and gated norms) under "xla" and "written".
  # two layers, one of each kind, to keep compilation short
  cfg = get_preset("tiny_hybrid").replace(
      num_hidden_layers=2, layer_types=("linear_attention", "full_attention"))
  assert cfg.written_norms and not get_preset("tiny").written_norms   # "auto"
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 24)))
  out = {}
  for form in ("xla", "written"):
    model = Transformer(cfg.replace(norm_backward=form), rngs=nnx.Rngs(3))
    g, p, rest = nnx.split(model, nnx.Param, ...)
    def loss(p):
      logits = nnx.merge(g, p, rest)(tokens).logits
      return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0]), logits
    out[form] = jax.jit(jax.value_and_grad(loss, has_aux=True))(p)
  (l_x, logit_x), g_x = out["xla"]
  (l_w, logit_w), g_w = out["written"]
  np.testing.assert_allclose(logit_w, logit_x, atol=1e-5)
  np.testing.assert_allclose(l_w, l_x, rtol=1e-6)
  leaves_x, leaves_w = jax.tree.leaves(g_x), jax.tree.leaves(g_w)
  assert len(leaves_x) == len(leaves_w) > 0
  for a, b in zip(leaves_w, leaves_x):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-4)
  with pytest.raises(ValueError, match="model.norm_backward"):
    cfg.replace(norm_backward="fast").validate()
