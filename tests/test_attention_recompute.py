"""The attention whose backward pass recomputes the probabilities (taken on TPU/GPU targets)
against the one XLA differentiates (kept on CPU): same values and gradients, with packed
segments, a partial last chunk and grouped query heads; and it keeps no [query, key] array for
the backward pass."""
import contextlib
import io
import re

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from lwm_jax.model import attention, platform


def _inputs(b=2, s=300, h=4, g=2, kd=8, dtype=jnp.float32, seed=0):
  ks = jax.random.split(jax.random.key(seed), 4)
  q, k, v = (jax.random.normal(ks[i], shape).astype(dtype)
             for i, shape in enumerate([(b, s, h, kd), (b, s, g, kd), (b, s, g, kd)]))
  seg = jnp.stack([jnp.where(jnp.arange(s) < 170, 1, 2),          # two packed documents
                   jnp.where(jnp.arange(s) < 250, 1, 0)])[:b]     # one, then padding
  return q, k, v, seg, jax.random.normal(ks[3], (b, s, h, kd))


@pytest.mark.parametrize("chunk,seg", [(128, True), (64, False), (512, True)])
def test_recomputed_equals_stored_values_and_gradients(chunk, seg):
  q, k, v, segs, w = _inputs()
  segs = segs if seg else None

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v, segs, 8 ** -0.5, chunk=chunk) * w)

  want = jax.jit(jax.value_and_grad(loss(attention.causal_attention), argnums=(0, 1, 2)))(q, k, v)
  got = jax.jit(jax.value_and_grad(loss(attention.recomputed_causal_attention),
                                   argnums=(0, 1, 2)))(q, k, v)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)
  # the plain masked attention is the independent reference for the values
  out = attention.recomputed_causal_attention(q, k, v, segs, 8 ** -0.5, chunk)
  ref = attention.dot_attention(q, k, v, attention.training_mask(segs, 2, 300), 8 ** -0.5)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)


def test_bfloat16_gradients_stay_close():
  q, k, v, segs, w = _inputs(dtype=jnp.bfloat16)
  f = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v, segs, 8 ** -0.5, chunk=128)
                                         .astype(jnp.float32) * w)
  want = jax.grad(f(attention.causal_attention), argnums=(0, 1, 2))(q, k, v)
  got = jax.grad(f(attention.recomputed_causal_attention), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(got, want):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.abs(a - b).max() <= 0.02 * np.abs(b).max(), np.abs(a - b).max()


def _residual_shapes(fn, q, k, v, segs):
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    jax.ad_checkpoint.print_saved_residuals(lambda q, k, v: jnp.sum(fn(q, k, v, segs, 0.3, 64)),
                                            q, k, v)
  return buf.getvalue()


def test_no_probabilities_are_kept_for_the_backward_pass():
  q, k, v, segs, _ = _inputs(s=256)
  kept = _residual_shapes(attention.causal_attention, q, k, v, segs)
  assert "[2,2,128,256]" in kept.replace(" ", "")           # the last chunk's [B, G, C*R, T]
  kept = _residual_shapes(attention.recomputed_causal_attention, q, k, v, segs)
  shapes = [tuple(int(n) for n in m.split(",")) for m in re.findall(r"\[([\d,]+)\]", kept)]
  assert shapes and all(len(x) < 4 or x[-1] != 256 for x in shapes), kept   # no [..., key] array


def test_the_model_takes_it_where_the_target_is_an_accelerator_or_where_asked():
  from lwm_jax.model.config import get_preset  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  def calls(target, choice="auto"):
    cfg = get_preset("tiny", num_hidden_layers=1, attention_backward=choice)
    layer = attention.Attention(cfg, rngs=nnx.Rngs(0))
    x, pos = jnp.ones((1, 200, cfg.hidden_size)), jnp.arange(200)[None]
    with platform.target(target):
      jaxpr = jax.make_jaxpr(lambda x: layer(x, pos)[0])(x)
    return "custom_vjp_call" in str(jaxpr)

  assert not calls("cpu") and calls("gpu") and calls("tpu")
  assert calls("cpu", "recomputed") and not calls("tpu", "stored")
  with pytest.raises(ValueError, match="model.attention_backward: 'flash' is not one of"):
    get_preset("tiny", attention_backward="flash").validate()
