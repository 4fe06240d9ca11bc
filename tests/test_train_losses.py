"""Losses against numbers worked out by hand (numpy arithmetic on the written-out formulas)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lwm_jax.train import losses


def _seqs(deltas_per_seq, t=4):
  """logp/old_logp/mask [B, T] whose per-token log-ratios are the given deltas (unequal lengths)."""
  b = len(deltas_per_seq)
  old = np.full((b, t), -2.0, np.float32)
  logp = old.copy()
  mask = np.zeros((b, t), np.float32)
  for i, d in enumerate(deltas_per_seq):
    logp[i, :len(d)] += np.asarray(d, np.float32)
    mask[i, :len(d)] = 1
    logp[i, len(d):] = -7.0  # garbage outside the mask must not matter
  return jnp.asarray(logp), jnp.asarray(old), jnp.asarray(mask)


# four sequences of lengths 3, 2, 4, 1 with mean log-ratios 1e-4, 1e-3, -1e-3, -1e-3
DELTAS = [[0.0, 3e-4, 0.0], [2e-3, 0.0], [-4e-3, 0.0, 0.0, 0.0], [-1e-3]]
ADV = jnp.asarray([0.5, 1.0, -2.0, 1.0])


def test_gspo_value_clipped_and_unclipped():
  logp, old, mask = _seqs(DELTAS)
  loss, m = losses.gspo_loss(logp, old, ADV, mask, log_ratio_cap=None)
  # by hand: s = e^{1e-4}, e^{1e-3}, e^{-1e-3}, e^{-1e-3}; bounds [0.9997, 1.0004]
  s0, s1, s2, s3 = math.exp(1e-4), math.exp(1e-3), math.exp(-1e-3), math.exp(-1e-3)
  obj0 = 0.5 * s0                   # inside the band: unclipped
  obj1 = 1.0 * 1.0004               # A>0, s above 1+eps_high: clipped
  obj2 = -2.0 * 0.9997              # A<0, s below 1-eps_low: clipped
  obj3 = 1.0 * s3                   # A>0, s below the band: min keeps the unclipped s*A
  expect = -(obj0 + obj1 + obj2 + obj3) / 4
  assert float(loss) == pytest.approx(expect, abs=1e-6)
  assert float(m["clip_frac"]) == pytest.approx(0.5)
  assert float(m["ratio_max"]) == pytest.approx(s1, abs=1e-6)
  assert float(m["ratio_min"]) == pytest.approx(s2, abs=1e-6)
  assert float(m["ratio_mean"]) == pytest.approx((s0 + s1 + s2 + s3) / 4, abs=1e-6)


def test_gspo_gradient_by_hand():
  logp, old, mask = _seqs(DELTAS)
  g = jax.grad(lambda lp: losses.gspo_loss(lp, old, ADV, mask)[0])(logp)
  g = np.asarray(g)
  # d(-1/4 * s_i A_i)/d logp_it = -1/4 * A_i * s_i / |y_i| on the unclipped sequences, 0 elsewhere
  expect = np.zeros((4, 4), np.float32)
  expect[0, :3] = -0.25 * 0.5 * math.exp(1e-4) / 3
  expect[3, :1] = -0.25 * 1.0 * math.exp(-1e-3) / 1
  np.testing.assert_allclose(g, expect, atol=1e-7)


def test_gspo_log_ratio_cap():
  logp, old, mask = _seqs([[20.0, 20.0], [0.0]], t=2)
  loss, m = losses.gspo_loss(logp, old, jnp.asarray([-1.0, 1.0]), mask, log_ratio_cap=10.0)
  # s_0 = e^10 (capped), A<0: min(-e^10, -1.0004) = -e^10; s_1 = 1
  assert float(loss) == pytest.approx(-(-math.exp(10.0) + 1.0) / 2, rel=1e-5)
  assert float(m["ratio_max"]) == pytest.approx(math.exp(10.0), rel=1e-5)


def test_gspo_token_equals_gspo_with_sequence_advantages():
  logp, old, mask = _seqs(DELTAS)
  f_seq = lambda lp: losses.gspo_loss(lp, old, ADV, mask)[0]
  f_tok = lambda lp: losses.gspo_token_loss(lp, old, ADV, mask)[0]
  assert float(f_tok(logp)) == pytest.approx(float(f_seq(logp)), abs=1e-7)
  np.testing.assert_allclose(np.asarray(jax.grad(f_tok)(logp)), np.asarray(jax.grad(f_seq)(logp)),
                             atol=1e-7)


def test_gspo_token_with_token_advantages():
  logp, old, mask = _seqs([[0.0, 2e-3], [0.0]], t=2)
  adv = jnp.asarray([[1.0, -1.0], [2.0, 0.0]])
  loss, _ = losses.gspo_token_loss(logp, old, adv, mask)
  s0 = math.exp(1e-3)  # every token of sequence 0 carries s_0 in value
  tok = [min(s0 * 1.0, 1.0004 * 1.0), min(s0 * -1.0, 1.0004 * -1.0)]
  expect = -((tok[0] + tok[1]) / 2 + 2.0 * 1.0) / 2
  assert float(loss) == pytest.approx(expect, abs=1e-6)


def test_grpo_token_ratios_both_signs():
  logp, old, mask = _seqs([[0.1, 0.3, -0.3], [-0.3, 0.3]], t=3)
  loss, m = losses.grpo_loss(logp, old, jnp.asarray([1.0, -1.0]), mask)
  e = math.exp
  seq0 = (e(0.1) + 1.27 + e(-0.3)) / 3          # 2nd token clipped at 1+0.27, 3rd kept (A>0)
  seq1 = (-0.8 + -e(0.3)) / 2                    # 1st clipped at 1-0.2 (A<0), 2nd kept
  assert float(loss) == pytest.approx(-(seq0 + seq1) / 2, abs=1e-6)
  assert float(m["clip_frac"]) == pytest.approx((1 / 3 + 1 / 2) / 2, abs=1e-6)
  tok_loss, _ = losses.grpo_loss(logp, old, jnp.asarray([1.0, -1.0]), mask, aggregation="token_mean")
  assert float(tok_loss) == pytest.approx(-(seq0 * 3 + seq1 * 2) / 5, abs=1e-6)


def test_group_advantages_unbiased_std():
  a = np.asarray(losses.group_advantages(jnp.asarray([1., 2., 3., 4., 5., 5., 5., 9.]), 4))
  sd1 = math.sqrt((1.5 ** 2 * 2 + 0.5 ** 2 * 2) / 3)
  exp1 = [(-1.5) / (sd1 + 1e-6), -0.5 / (sd1 + 1e-6), 0.5 / (sd1 + 1e-6), 1.5 / (sd1 + 1e-6)]
  exp2 = [-1 / (2 + 1e-6)] * 3 + [3 / (2 + 1e-6)]
  np.testing.assert_allclose(a, exp1 + exp2, atol=1e-6)
  with pytest.raises(ValueError, match="group_size"):
    losses.group_advantages(jnp.ones(6), 4)


def test_kl_k3_added():
  logp = jnp.asarray([[-1.0, -2.0]])
  ref = jnp.asarray([[-1.5, -1.0]])
  mask = jnp.ones((1, 2))
  base, _ = losses.gspo_loss(logp, logp, jnp.asarray([1.0]), mask)
  with_kl, m = losses.gspo_loss(logp, logp, jnp.asarray([1.0]), mask, ref_logp_BxT=ref, kl_coef=0.1)
  kl = ((math.exp(-0.5) + 0.5 - 1) + (math.exp(1.0) - 1.0 - 1)) / 2
  assert float(m["kl"]) == pytest.approx(kl, abs=1e-6)
  assert float(with_kl - base) == pytest.approx(0.1 * kl, abs=1e-6)


def test_cross_entropy_weights_and_segments():
  # vocab 3, one row of 4 tokens in two segments; logits chosen so log-softmax is easy to write out
  logits = np.zeros((1, 4, 3), np.float32)
  logits[0, 0] = [0.0, 1.0, 0.0]
  logits[0, 1] = [2.0, 0.0, 0.0]
  logits[0, 2] = [0.0, 0.0, 0.0]
  tokens = jnp.asarray([[0, 1, 2, 0]])
  seg = jnp.asarray([[1, 1, 2, 2]])
  w = jnp.asarray([[1.0, 1.0, 1.0, 0.5]])
  loss, m = losses.cross_entropy_loss(jnp.asarray(logits), tokens, seg, w)
  lse0 = math.log(2 + math.e)
  # pair 0->1: target 1, weight 1; pair 1->2 crosses segments: 0; pair 2->3: target 0, weight 0.5
  nll = 1.0 * (lse0 - 1.0) + 0.5 * math.log(3.0)
  assert float(loss) == pytest.approx(nll / 1.5, abs=1e-6)
  assert float(m["weight"]) == pytest.approx(1.5)
  zl, _ = losses.cross_entropy_loss(jnp.asarray(logits), tokens, seg, w, z_loss_coef=0.1)
  z = (1.0 * lse0 ** 2 + 0.5 * math.log(3.0) ** 2) / 1.5
  assert float(zl) == pytest.approx(nll / 1.5 + 0.1 * z, abs=1e-6)
