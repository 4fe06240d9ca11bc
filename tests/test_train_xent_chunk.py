"""The CPT/SFT train step with `xent_chunk` > 0 (cross-entropy in token slices from the final
hidden states, gradients made in the same pass) against the plain full-logits step: same loss,
metrics and updated parameters."""
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from lwm_jax import sharding as shd
from lwm_jax.model.config import get_preset
from lwm_jax.train import optimizer, state as st, steps, synthetic

OPTIM = dict(lr=1e-3, warmup_steps=0, decay_steps=10, end_lr_ratio=0.1, b1=0.9, b2=0.95, eps=1e-8,
             weight_decay=0.1, grad_clip=1.0)


def _setup(tied: bool):
  cfg = get_preset("tiny", num_hidden_layers=1, num_experts=4, tie_word_embeddings=tied)
  tx, sch = optimizer.make_optimizer(ml_collections.ConfigDict(OPTIM), 10)
  mesh = shd.make_mesh(devices=jax.devices()[:1])
  g, s, _ = st.create_train_state(cfg, tx, mesh, 0)
  batch = synthetic.synthetic_batch(0, 0, 4, 24, cfg.vocab_size)
  # a masked batch: SFT-like weights (zero on a prefix, 0.5 on some targets) and padding
  lw = np.ones(batch["loss_weights"].shape, np.float32)
  lw[:, :5] = 0.0
  lw[1, 10:14] = 0.5
  seg = np.array(batch["segment_ids"])
  seg[2, -6:] = 0
  batch = dict(batch, loss_weights=lw, segment_ids=seg)
  return cfg, g, s, tx, sch, {k: jnp.asarray(v) for k, v in batch.items()}


@pytest.mark.parametrize("tied,micro", [pytest.param(False, 2, marks=pytest.mark.slow), (True, 1)])
def test_chunked_step_equals_plain_step(tied, micro):
  cfg, g, s0, tx, sch, batch = _setup(tied)
  results = {}
  for chunk in (0, 48):
    sc = steps.StepConfig(micro_batches=micro, z_loss_coef=1e-3, xent_chunk=chunk)
    f = jax.jit(functools.partial(steps.xent_step, g, tx, sch, sc))
    s = jax.tree.map(lambda x: x.copy(), s0)
    s, m = f(s, batch)
    results[chunk] = (s, m)
  (sp, mp), (sc_, mc) = results[0], results[48]
  positions = batch["tokens"].shape[1] - 1  # 23 predicted positions, 48 // 4 rows = 12 a slice:
  assert positions % (48 // batch["tokens"].shape[0]) != 0  # two slices, a padded last one
  assert set(mp) == set(mc)
  for k in mp:
    np.testing.assert_allclose(np.asarray(mc[k]), np.asarray(mp[k]), rtol=1e-5, atol=1e-5,
                               err_msg=k)
  assert float(mp["kept_tokens"]) > 0 and float(mp["loss"]) > 0
  # (Adam divides by sqrt(v): a near-zero gradient's rounding can move its update by ~1e-5)
  for a, b in zip(jax.tree.leaves(sp.params), jax.tree.leaves(sc_.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=3e-5)
  # the update really moved the parameters (the comparison is not between two unchanged states)
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
              zip(jax.tree.leaves(s0.params), jax.tree.leaves(sp.params)))
  assert moved > 1e-5


def jaxpr_shapes(jx):
  """The shape of every value a jaxpr computes, its nested jaxprs (scan, remat, pjit) included."""
  for eqn in jx.eqns:
    for var in eqn.outvars:
      yield tuple(getattr(var.aval, "shape", ()))
    for val in eqn.params.values():
      for sub in val if isinstance(val, (tuple, list)) else (val,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from jaxpr_shapes(inner)


@pytest.mark.parametrize("tied", [False, True])
def test_chunked_step_has_no_full_logits(tied):
  cfg, g, s0, tx, sch, batch = _setup(tied)
  v, b, s = cfg.vocab_size, *batch["tokens"].shape

  def big(chunk):
    sc = steps.StepConfig(micro_batches=1, xent_chunk=chunk)
    jx = jax.make_jaxpr(functools.partial(steps.xent_step, g, tx, sch, sc))(s0, batch)
    return [sh for sh in jaxpr_shapes(jx.jaxpr) if v in sh and np.prod(sh) >= b * (s - 1) * v]

  assert big(0), "the plain step should hold [B, S, V] logits (the check would be vacuous)"
  assert not big(48)


@pytest.mark.parametrize("tied", [False, True])
def test_head_matrix_matches_logits(tied):
  cfg, g, s0, *_ = _setup(tied)
  tok = jnp.arange(10, dtype=jnp.int32)[None] % cfg.vocab_size

  @jax.jit
  def both(params):
    m = nnx.merge(g, params)
    return m(tok, return_hidden=True).logits @ m.head_DxV(), m(tok).logits

  via_head, logits = both(s0.params)
  assert logits.shape == (1, 10, cfg.vocab_size)
  np.testing.assert_allclose(np.asarray(via_head), np.asarray(logits), rtol=1e-5, atol=1e-5)


def test_config_option_reaches_the_step_and_is_checked():
  from configs import cpt
  from lwm_jax.train import run_config, trainer
  c = cpt.get_config("tiny")
  assert c.train.xent_chunk == 512  # on by default (0: the plain loss)
  c.train.xent_chunk = 64
  model_cfg = run_config.validate_config(c)
  assert trainer._step_config(c, model_cfg).xent_chunk == 64  # pylint: disable=protected-access
  c.train.xent_chunk = -1
  with pytest.raises(ValueError, match=r"train\.xent_chunk"):
    run_config.validate_config(c)
