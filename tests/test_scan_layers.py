"""`model.scan_layers`: the layers as one scan over parameters stacked per period of alike layers
give the unrolled loop's logits, losses and gradients (Qwen3-MoE and the hybrid, with and
without remat), and leave the parameter tree (HF mapping, checkpoints) as it was."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer


def _pair(name: str, **kw):
  cfg = get_preset(name, **kw)
  return (Transformer(cfg, rngs=nnx.Rngs(0)),
          Transformer(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("name,layers,period,remat", [
    # both heavy (over 10 s): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
    pytest.param("tiny", 4, 1, False, marks=pytest.mark.slow),
    # the hybrid's period of 4 (3 linear, 1 full) needs 8 layers: a longer compile
    pytest.param("tiny_hybrid", 8, 4, True, marks=pytest.mark.slow)])
def test_scan_matches_the_loop(name, layers, period, remat):
  loop, scan = _pair(name, num_hidden_layers=layers, remat=remat)
  assert scan.scan_period() == period
  cfg = loop.cfg
  tok = jax.random.randint(jax.random.PRNGKey(1), (2, 40), 0, cfg.vocab_size)
  seg = jnp.concatenate([jnp.ones((2, 25), jnp.int32), 2 * jnp.ones((2, 15), jnp.int32)], 1)

  def run(model):
    graphdef, state = nnx.split(model)

    def loss(st):
      out = nnx.merge(graphdef, st)(tok, segment_ids=seg)
      return jnp.mean(out.logits.astype(jnp.float32) ** 2) + out.aux_loss, out
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(state)

  (l1, o1), g1 = run(loop)
  (l2, o2), g2 = run(scan)
  assert float(jnp.max(jnp.abs(o1.logits - o2.logits))) < 1e-5
  assert float(o1.aux_loss) == pytest.approx(float(o2.aux_loss), rel=1e-6)
  assert o2.expert_load.shape == (layers, cfg.num_experts)
  assert float(jnp.max(jnp.abs(o1.expert_load - o2.expert_load))) < 1e-6
  assert float(l1) == pytest.approx(float(l2), rel=1e-5)
  s1, s2 = g1, g2
  assert jax.tree.structure(s1) == jax.tree.structure(s2)  # same parameter tree
  for a, b in zip(jax.tree.leaves(s1), jax.tree.leaves(s2)):
    assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * (float(jnp.max(jnp.abs(a))) + 1e-3)


def test_no_scan_where_it_cannot_help():
  # alike layers only with the whole depth as period (mlp_only_layers breaks the pattern)
  _, scan = _pair("tiny", num_hidden_layers=3, mlp_only_layers=(1,))
  assert scan.scan_period() == 0
  cache = scan.init_cache(1, 8)  # decoding keeps the loop (the cache is per layer)
  out = scan(jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32), cache=cache)
  assert len(out.cache) == 3
