"""The rollout source: responses come from the parameters handed in (a greedy rollout equals the
model's own Sampler output), the recorded old log-probs are the training forward's (the first GSPO
update has ratio 1), later updates of the same rollout move the ratio and clip, rewards and group
advantages match a hand computation, zero-variance groups are counted and filtered, and a restored
source draws exactly the same batch (also in the middle of a rollout's mini-batches)."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.rl import pool as pool_lib
from lwm_jax.rl import rewards as R
from lwm_jax.rl.rollout import BATCH_KEYS, RolloutConfig, RolloutSource
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler
from lwm_jax.train import steps
from lwm_jax.train.state import TrainState
from tests.test_rl_pool import many_trajs, train_tokenizer

ENGINE = dict(chunk_steps=16, min_prompt_bucket=512, prefill_chunk=512, min_cache_len=1024)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tok = train_tokenizer(tmp_path_factory.mktemp("sp"))
  cfg = get_preset("tiny")
  rc = RolloutConfig(prompts_per_batch=2, group_size=2, seq_len=1024, max_new_tokens=16,
                     temperature=0.0, seed=7)
  pool = pool_lib.build_pool(many_trajs(1), tok, rc.max_prompt_tokens, seed=0)
  return tok, cfg, rc, pool


class _Const(R.Reward):
  def score(self, inputs):
    return [R.Score(3.0) for _ in inputs]


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_greedy_rollout_equals_the_policys_own_generate(setup):
  tok, cfg, rc, pool = setup
  model_a = Transformer(cfg, rngs=nnx.Rngs(0))
  model_b = Transformer(cfg, rngs=nnx.Rngs(1))
  src = RolloutSource(model_a, tok, pool, R.make_reward("reference=1"), rc, **ENGINE)
  graphdef, params_b = nnx.split(model_b)
  src.set_params(params_b)  # the trainer hands its current parameters in place
  batch = next(src)
  assert set(batch) == set(BATCH_KEYS)
  assert batch["tokens"].shape == (4, 1024) and batch["advantages"].shape == (4,)
  ref_b = Sampler(model_b, tok, decode_layout="model", max_batch=4, min_batch_bucket=4, **ENGINE)
  ref_a = Sampler(model_a, tok, decode_layout="model", max_batch=4, min_batch_bucket=4, **ENGINE)
  items = {i.id: i for i in pool.items}
  rows = [items[pid] for pid in src.last["ids"]]
  # The reference starts from the chat messages, an independent path to the prompt ids.
  greedy = SamplingParams(temperature=0, max_new_tokens=16)
  gens_b = ref_b.generate([it.messages for it in rows], greedy)
  gens_a = ref_a.generate([it.messages for it in rows], greedy)
  differs = False
  for row, (item, g, a) in enumerate(zip(rows, gens_b, gens_a)):
    p = len(item.prompt_ids)
    r = int(batch["response_mask"][row].sum())
    assert batch["tokens"][row, :p].tolist() == item.prompt_ids
    assert batch["tokens"][row, p:p + r].tolist() == g.token_ids
    np.testing.assert_allclose(batch["old_logprobs"][row, p:p + r], g.logprobs, atol=1e-5)
    assert src.last["texts"][row] == g.text
    assert (batch["segment_ids"][row] > 0).sum() == p + r
    differs |= a.token_ids != g.token_ids
  assert differs, "the rollout must come from the handed-in parameters, not the initial ones"
  # The trainer's way: no model up front, bind(run), then next_batch(train_state).
  bound = RolloutSource(None, tok, pool, R.make_reward("reference=1"), rc, **ENGINE)
  bound.bind(SimpleNamespace(graphdef=graphdef, mesh=None, seq_len=1024, batch_size=4,
                             process_index=0, process_count=1))
  again = bound.next_batch(SimpleNamespace(params=params_b))
  for k in BATCH_KEYS:
    np.testing.assert_array_equal(again[k], batch[k], err_msg=k)
  with pytest.raises(ValueError, match="batch_size"):
    bound.bind(SimpleNamespace(graphdef=graphdef, mesh=None, seq_len=1024, batch_size=8,
                               process_index=0, process_count=1))
  # Greedy groups are identical: zero variance, zero advantages, counted.
  assert src.metrics["zero_variance_groups"] == 2 and not batch["advantages"].any()
  assert src.metrics["rollout_s"] > 0 and "reward_s" in src.metrics


def test_rewards_advantages_filter_and_exact_resume(setup):
  tok, cfg, rc, pool = setup
  rc = RolloutConfig(**{**rc.__dict__, "temperature": 1.0, "group_size": 2})
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  mix = R.make_reward("reference=0.7,rule=0.3")
  src = RolloutSource(model, tok, pool, mix, rc, **ENGINE)
  first = next(src)
  state = src.get_state()
  second = next(src)
  texts, rewards = src.last["texts"], src.last["rewards"]
  items = {i.id: i for i in pool.items}
  # rewards: the mix on each (item, text), scored independently here
  for pid, text, r in zip(src.last["ids"], texts, rewards):
    it = items[pid]
    want = mix.score([R.RewardInput(it.domain, it.context, it.action, text, it.reference)])
    assert r == pytest.approx(want[0]["total"])
  # advantages by hand: (r - mean) / (sample std + eps) per group of 2
  for g in range(2):
    a, b = rewards[2 * g], rewards[2 * g + 1]
    if a == b:
      assert second["advantages"][2 * g] == 0 and second["advantages"][2 * g + 1] == 0
    else:
      sd = abs(a - b) / np.sqrt(2)
      assert second["advantages"][2 * g] == pytest.approx((a - (a + b) / 2) / (sd + 1e-6),
                                                          rel=1e-5)
  # exact resume: a fresh source restored to the saved state gives the same batch
  again = RolloutSource(Transformer(cfg, rngs=nnx.Rngs(0)), tok, pool, mix, rc, **ENGINE)
  again.set_state(state)
  resumed = next(again)
  for k in BATCH_KEYS:
    np.testing.assert_array_equal(resumed[k], second[k], err_msg=k)
  assert not np.array_equal(first["tokens"], second["tokens"])
  # constant rewards: every group is flat; filtering empties their response masks
  flat = RolloutSource(model, tok, pool, R.MixedReward({"c": 1.0}, {"c": _Const()}),
                       RolloutConfig(**{**rc.__dict__, "filter_zero_variance": True}), **ENGINE)
  b = next(flat)
  assert flat.metrics["zero_variance_groups"] == 2 and flat.metrics["filtered_groups"] == 2
  assert b["response_mask"].sum() == 0 and (b["segment_ids"].sum(axis=1) > 0).all()


def test_bad_setup_is_refused(setup):
  tok, cfg, rc, pool = setup
  with pytest.raises(ValueError, match="max_new_tokens"):
    RolloutConfig(seq_len=16, max_new_tokens=16).validate()
  with pytest.raises(ValueError, match="group_size"):
    RolloutConfig(group_size=1).validate()
  short = RolloutConfig(**{**rc.__dict__, "seq_len": 600})
  with pytest.raises(ValueError, match="longer than"):
    RolloutSource(None, tok, pool, R.make_reward("rule=1"), short)
  with pytest.raises(ValueError, match="updates_per_batch"):
    RolloutConfig(prompts_per_batch=3, group_size=2, updates_per_batch=4).validate()
  with pytest.raises(RuntimeError, match="bind"):
    RolloutSource(None, tok, pool, R.make_reward("rule=1"), rc).next_batch()


@pytest.mark.slow  # heavy (over 10 s): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_four_updates_per_rollout_move_the_ratio_and_resume_mid_rollout(setup):
  """One rollout feeds 4 optimizer updates: the first is on-policy (ratio 1: the sampler's
  log-probs are the training forward's), the later ones see a moved policy (ratio != 1, clipped)."""
  tok, cfg, rc, pool = setup
  rc = RolloutConfig(**{**rc.__dict__, "temperature": 1.0, "group_size": 4,
                        "updates_per_batch": 4})
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  src = RolloutSource(None, tok, pool, R.make_reward("reference=1"), rc, **ENGINE)
  src.bind(SimpleNamespace(graphdef=graphdef, mesh=None, seq_len=1024, batch_size=2,
                           process_index=0, process_count=1))
  tx = optax.adam(3e-3)
  state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(steps.gspo_step, graphdef, tx, lambda _: 3e-3,
                                   steps.StepConfig()))
  ms, saved, second = [], None, None
  for k in range(4):
    b = src.next_batch(state)
    assert b["tokens"].shape == (2, 1024)
    if k == 0:
      saved = src.get_state()
    if k == 1:
      second = b
    state, m = step(state, b)
    ms.append(jax.device_get(m))
  assert src.calls == 1  # one rollout, four updates
  # update 1 is on-policy: every sequence's ratio is 1, so the sampler's log-probs are the
  # training forward's at the response positions (a shifted or wrong layout would move it)
  for k in ("ratio_mean", "ratio_min", "ratio_max"):
    assert abs(float(ms[0][k]) - 1) < 1e-4, (k, ms[0][k])
  assert float(ms[0]["clip_frac"]) == 0
  assert max(abs(float(m["ratio_mean"]) - 1) for m in ms[1:]) > 1e-3
  assert max(float(m["clip_frac"]) for m in ms[1:]) > 0
  # A source restored mid-rollout hands out the same remaining slices without sampling.
  restored = RolloutSource(None, tok, pool, R.make_reward("reference=1"), rc, **ENGINE)
  restored.set_state(saved)
  again = restored.next_batch()
  for k in BATCH_KEYS:
    np.testing.assert_array_equal(again[k], second[k], err_msg=k)
  assert restored.calls == 1 and restored.sampler is None


def test_kl_reference_is_the_starting_policy(setup):
  """With the KL term on, each batch carries the log-probs of the policy of the first rollout:
  equal to the sampler's at the start, unchanged by later parameters."""
  tok, cfg, rc, pool = setup
  rc = RolloutConfig(**{**rc.__dict__, "temperature": 1.0})
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  _, other = nnx.split(Transformer(cfg, rngs=nnx.Rngs(5)))
  src = RolloutSource(None, tok, pool, R.make_reward("reference=1"), rc, kl=True, **ENGINE)
  src.bind(SimpleNamespace(graphdef=graphdef, mesh=None, seq_len=1024, batch_size=4,
                           process_index=0, process_count=1))
  b = src.next_batch(params)
  m = b["response_mask"] > 0
  np.testing.assert_allclose(b["ref_logprobs"][m], b["old_logprobs"][m], atol=1e-4)
  b2 = src.next_batch(other)  # a moved policy: old log-probs move, the reference does not
  m2 = b2["response_mask"] > 0
  ref_fn = jax.jit(lambda p, t, pos, s: steps.sequence_logprobs(graphdef, p, dict(
      tokens=t, positions=pos, segment_ids=s)))
  want = np.asarray(ref_fn(params, b2["tokens"], b2["positions"], b2["segment_ids"]))
  np.testing.assert_allclose(b2["ref_logprobs"][m2], want[m2], atol=1e-4)
  assert np.abs(b2["ref_logprobs"][m2] - b2["old_logprobs"][m2]).max() > 1e-2
