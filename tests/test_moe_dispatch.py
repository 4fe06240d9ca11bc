"""The gather-only MoE dispatch (`sorted`, `blocked` and `tiled` backends) against the dense
reference: forward, gradients, drops, and no scatter of rows in the backward pass; the tiled grouped
matmul against `jax.lax.ragged_dot`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lwm_jax.model.config import get_preset
from lwm_jax.model.dispatch import sorted_slots, take_rows, tiled_matmul
from lwm_jax.model.moe import MoE
from lwm_jax.model.transformer import Transformer


def test_take_rows_value_and_gradient_by_hand():
  x = jnp.arange(12.0).reshape(4, 3)
  idx = jnp.array([2, 0, 4, 2, 1])           # 4 is out of range: a zero row
  inv = jnp.array([[1, 5], [4, 5], [0, 3], [5, 5]])  # every m with idx[m] == r (5 = none)
  out = take_rows(x, idx, inv)
  np.testing.assert_array_equal(out, [[6, 7, 8], [0, 1, 2], [0, 0, 0], [6, 7, 8], [3, 4, 5]])
  g = jnp.arange(15.0).reshape(5, 3) + 1
  _, vjp = jax.vjp(lambda v: take_rows(v, idx, inv), x)
  (dx,) = vjp(g)
  # Row 2 was read twice (m=0 and m=3), row 3 never; m=2 read nothing.
  np.testing.assert_array_equal(dx, [[4, 5, 6], [13, 14, 15], [1 + 10, 2 + 11, 3 + 12], [0, 0, 0]])


@pytest.mark.parametrize("rows,sizes,tile", [
    (37, [9, 0, 13, 12], 8),    # an empty group; 3 rows past the last group
    (200, [50, 61, 0, 0, 89], 16),
    (20, [3, 17], 128),         # tiles larger than every group
])
def test_tiled_matmul_matches_ragged_dot(rows, sizes, tile):
  rng = np.random.default_rng(rows)
  d, f = 6, 5
  x = jnp.asarray(rng.standard_normal((rows, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((len(sizes), d, f)), jnp.float32)
  gs = jnp.asarray(sizes, jnp.int32)
  used = sum(sizes)
  c = jnp.asarray(rng.standard_normal((rows, f)), jnp.float32)

  def ref(x, w):  # XLA's grouped matmul on the grouped rows; the rest are 0
    return jnp.concatenate([jax.lax.ragged_dot(x[:used], w, gs), jnp.zeros((rows - used, f))])

  ours = lambda x, w: tiled_matmul(x, w, gs, tile)
  np.testing.assert_allclose(jax.jit(ours)(x, w), ref(x, w), atol=1e-5)
  g_ours = jax.jit(jax.grad(lambda x, w: jnp.sum(ours(x, w) * c), (0, 1)))(x, w)
  g_ref = jax.grad(lambda x, w: jnp.sum(ref(x, w) * c), (0, 1))(x, w)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert float(jnp.abs(g_ours[0][used:]).max(initial=0.0)) == 0.0
  for e, n in enumerate(sizes):  # an empty group's weights get exactly no gradient
    assert (float(jnp.abs(g_ours[1][e]).max()) == 0.0) == (n == 0)


def _row_scatters(jaxpr, width):
  """Scatter equations (any kind) into a float [rows, width] array, recursively (the blocked
  backend's per-block expert weights are summed back by a scatter-add into [E, *, *]: not a row
  move)."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name.startswith("scatter"):
      aval = eqn.invars[0].aval
      if jnp.issubdtype(aval.dtype, jnp.floating) and aval.ndim == 2 and aval.shape[1] == width:
        found.append(eqn.primitive.name)
    for v in eqn.params.values():
      for sub in v if isinstance(v, (tuple, list)) else (v,):
        if hasattr(sub, "eqns"):
          found += _row_scatters(sub, width)
        elif hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
          found += _row_scatters(sub.jaxpr, width)
  return found


@pytest.mark.parametrize("backend,want", [("sorted", 0), ("blocked", 0), ("tiled", 0), ("capacity", 1)])
def test_backward_pass_moves_rows_without_scatter(backend, want):
  cfg = get_preset("tiny", moe_backend=backend)
  moe = MoE(cfg, rngs=nnx.Rngs(1))
  x = jax.random.normal(jax.random.key(0), (2, 8, cfg.hidden_size))
  jaxpr = jax.make_jaxpr(jax.grad(lambda v: jnp.sum(moe(v)[0] ** 2)))(x).jaxpr
  # The capacity backend scatters [*, D] rows; sorted and blocked only gather them.
  found = _row_scatters(jaxpr, cfg.hidden_size)
  assert (len(found) >= 1) == bool(want), found


def _pair(norm=True, cf=2.0, seed=1, backend="sorted", chunk=0):
  base = get_preset("tiny", norm_topk_prob=norm)
  dense = MoE(base.replace(moe_backend="dense"), rngs=nnx.Rngs(seed))
  fast = MoE(base.replace(moe_backend=backend, sorted_capacity_factor=cf, moe_chunk_tokens=chunk),
             rngs=nnx.Rngs(seed))
  return base, dense, fast


# chunk: the 33 tokens go through the MoE 8 at a time (5 rematerialised chunks, the last padded
# with 7 masked rows): values, gradients and router statistics as in one pass
@pytest.mark.parametrize("backend,norm,chunk", [
    ("sorted", True, 0), ("sorted", False, 0), ("blocked", True, 0), ("tiled", True, 0),
    ("tiled", False, 0), ("tiled", True, 8), ("sorted", True, 8)])
def test_matches_dense_forward_and_gradients(backend, norm, chunk):
  cfg, dense, fast = _pair(norm, cf=8.0, backend=backend, chunk=chunk)
  x = jax.random.normal(jax.random.key(3), (3, 11, cfg.hidden_size))
  mask = jnp.arange(11)[None, :] < jnp.array([[11], [7], [2]])  # padded rows route nowhere

  def run(module):
    def f(params, v):
      m = nnx.merge(nnx.graphdef(module), params)
      y, st = m(v, mask)
      # A loss that weighs every output element differently, and the router statistics.
      w = jnp.cos(jnp.arange(y.size, dtype=jnp.float32)).reshape(y.shape)
      return jnp.sum(y * w * mask[..., None]) + jnp.sum(st.prob_sum_E ** 2), (y, st.dropped)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(nnx.state(module), x)

  (l_d, (y_d, _)), (gp_d, gx_d) = run(dense)
  (l_s, (y_s, drop_s)), (gp_s, gx_s) = run(fast)
  assert int(drop_s) == 0
  np.testing.assert_allclose(y_s, y_d, atol=1e-5)
  np.testing.assert_allclose(l_s, l_d, rtol=1e-5)
  np.testing.assert_allclose(gx_s, gx_d, atol=1e-5)
  for name in ("router", "gate_proj", "up_proj", "down_proj"):
    a, b = np.asarray(gp_s[name][...]), np.asarray(gp_d[name][...])
    assert np.abs(b).max() > 0
    np.testing.assert_allclose(a, b, atol=2e-5, err_msg=name)


def test_negative_chunk_is_refused_by_name():
  with pytest.raises(ValueError, match="model.moe_chunk_tokens"):
    get_preset("tiny", moe_chunk_tokens=-1)


def test_sorted_drops_counted_like_capacity_order():
  cfg, _, fast = _pair(cf=0.5)
  x = jax.random.normal(jax.random.key(0), (2, 16, cfg.hidden_size))
  y, stats = fast(x)
  # Independent count: per expert, assignments past C (in token order) are dropped.
  logits = np.asarray(x.reshape(-1, cfg.hidden_size)) @ np.asarray(fast.router[...])
  top = np.argsort(-logits, axis=-1, kind="stable")[:, :cfg.num_experts_per_tok]
  cap = int(np.ceil(0.5 * top.size / cfg.num_experts))
  expected = sum(max(0, int(np.sum(top == e)) - cap) for e in range(cfg.num_experts))
  assert expected > 0 and int(stats.dropped) == expected
  # The kept assignments are the first C of each expert in token order: check one token's slots.
  slot, src_tok, _, dropped = sorted_slots(jnp.asarray(top), jnp.ones(top.shape, bool),
                                           cfg.num_experts, cap)
  assert int(dropped) == expected
  flat, slot, src_tok = top.reshape(-1), np.asarray(slot), np.asarray(src_tok)
  for a in range(flat.size):
    rank = int(np.sum(flat[:a] == flat[a]))
    want = flat[a] * cap + rank if rank < cap else cfg.num_experts * cap
    assert slot[a] == want
    if rank < cap:
      assert src_tok[want] == a // cfg.num_experts_per_tok


@pytest.mark.parametrize("backend", ["sorted", "blocked", "tiled"])
def test_transformer_gradients_match_dense(backend):
  base = get_preset("tiny", num_hidden_layers=1)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, base.vocab_size)

  def grads(backend):
    model = Transformer(base.replace(moe_backend=backend), rngs=nnx.Rngs(0))
    gdef, params = nnx.split(model)

    def loss(p):
      out = nnx.merge(gdef, p)(tokens)
      logp = jax.nn.log_softmax(out.logits[:, :-1])
      return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean() + 0.01 * out.aux_loss
    return jax.jit(jax.value_and_grad(loss))(params)

  (l_d, g_d), (l_s, g_s) = grads("dense"), grads(backend)
  np.testing.assert_allclose(l_s, l_d, rtol=1e-5)
  for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(g_s),
                               jax.tree_util.tree_leaves_with_path(g_d)):
    np.testing.assert_allclose(a, b, atol=2e-5, err_msg=jax.tree_util.keystr(path))
