"""One rollout worker under both RL sources: world-model rollouts and agent episodes sample with
the train state's own parameter arrays (no copy), record old log-probs equal to the training
forward's, take the KL reference from the first rollout's policy by the train steps' own
function, split a rollout into mini-batches, and leave a sample without a valid reward out of
its group the same way, whichever source produced it."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flax import nnx

from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.rl import agent_envs
from lwm_jax.rl import pool as pool_lib
from lwm_jax.rl import rewards as R
from lwm_jax.rl.agent_episodes import AgentConfig, AgentEpisodeSource
from lwm_jax.rl.rollout import RolloutConfig, RolloutSource
from lwm_jax.rl.worker import GroupConfig, Rewards, RolloutWorker
from lwm_jax.train import steps
from tests.test_rl_agent_episodes import FakeShell, ScriptedPolicy, fake_verdict
from tests.test_rl_pool import many_trajs, train_tokenizer

ENGINE = dict(chunk_steps=8, min_prompt_bucket=512, prefill_chunk=512, min_cache_len=1024,
              max_batch=4, min_batch_bucket=4)
SEQ = 1024


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tok = train_tokenizer(tmp_path_factory.mktemp("sp"))
  cfg = get_preset("tiny", vocab_size=tok.vocab_size, num_hidden_layers=1, num_experts=4)
  graphdef, first = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  _, moved = nnx.split(Transformer(cfg, rngs=nnx.Rngs(7)))
  return tok, graphdef, first, moved


def _world_model_source(tok, kl=True, **kw):
  rc = RolloutConfig(prompts_per_batch=2, group_size=2, seq_len=SEQ, max_new_tokens=8,
                     temperature=1.0, seed=1, **kw)
  pool = pool_lib.build_pool(many_trajs(1), tok, rc.max_prompt_tokens, seed=0)
  return RolloutSource(None, tok, pool, R.make_reward("reference=1"), rc, kl=kl, **ENGINE)


def _agent_source(tok, kl=True, **kw):
  cfg = AgentConfig(domain="terminal", tasks=(5, 6), tasks_per_batch=2, group_size=2,
                    max_turns=1, seq_len=SEQ, max_new_tokens=8, seed=3,
                    filter_zero_variance=False, **kw)
  envs = agent_envs.LocalEnvs(lambda seed: FakeShell(), fake_verdict)
  return AgentEpisodeSource(tok, envs, cfg, kl=kl, **ENGINE)


def _run(graphdef, rows):
  return SimpleNamespace(graphdef=graphdef, mesh=None, seq_len=SEQ, batch_size=rows,
                         process_index=0, process_count=1)


# the world-model source is heavy (over 10 s): `make test-slow`, which CI runs, keeps `make test`
# under 8 minutes
@pytest.mark.parametrize("make", [pytest.param(_world_model_source, marks=pytest.mark.slow),
                                  _agent_source], ids=["world_model", "agent"])
def test_both_sources_sync_live_parameters_and_take_the_reference_from_train_steps(setup, make):
  tok, graphdef, first, moved = setup
  src = make(tok, updates_per_batch=2)
  assert isinstance(src.worker, RolloutWorker) and isinstance(src.cfg, GroupConfig)
  src.bind(_run(graphdef, 2))
  logprobs = jax.jit(functools.partial(steps.sequence_logprobs, graphdef))
  got = []
  for params in (first, moved):
    halves = [src.next_batch(SimpleNamespace(params=params)) for _ in range(2)]
    assert src.metrics["minibatch"] == 1.0 and all(h["tokens"].shape == (2, SEQ) for h in halves)
    batch = {k: np.concatenate([h[k] for h in halves]) for k in halves[0]}
    # the sampler decodes with the train state's own arrays, handed in place
    engine = src.sampler.engine
    assert all(a is b for a, b in zip(jax.tree.leaves(engine.state), jax.tree.leaves(params)))
    assert engine.decode_state is engine.state
    m = batch["response_mask"] > 0
    assert m.any()
    # old log-probs are the training forward's under the live parameters (ratio 1 at first)
    np.testing.assert_allclose(batch["old_logprobs"][m], np.asarray(logprobs(params, batch))[m],
                               atol=2e-3)
    # the reference is the first rollout's policy, computed by steps.sequence_logprobs
    want = np.asarray(logprobs(first, batch)) * (batch["segment_ids"] > 0)
    np.testing.assert_allclose(batch["ref_logprobs"], want, atol=1e-5)
    got.append(batch)
  assert src.calls == 2
  m = got[1]["response_mask"] > 0
  assert np.abs(got[1]["ref_logprobs"][m] - got[1]["old_logprobs"][m]).max() > 1e-2


class _FailEvery:
  """A reward under the shared protocol that gives no valid reward to the samples listed."""

  def __init__(self, bad):
    self.bad = set(bad)

  def __call__(self, samples):
    values = np.array([np.nan if i in self.bad else float(i) for i in range(len(samples))])
    return Rewards(values, [None] * len(samples), {"judge_failures": float(len(self.bad))})


def test_an_invalid_reward_is_left_out_the_same_way_in_both_sources(setup):
  """Group 0 loses one of two samples (skipped: fewer than 2 valid), group 1 keeps both; in
  either source the rows of group 0 carry no weight and the health metrics count it."""
  tok, graphdef, first, _ = setup
  wm = _world_model_source(tok)
  agent = _agent_source(tok, kl=False)
  agent.sampler = ScriptedPolicy(tok, {s: ["echo hi"] for s in (5, 6)})
  out = {}
  for name, src in (("world_model", wm), ("agent", agent)):
    src.scorer = _FailEvery({1})
    if name == "world_model":
      src.bind(_run(graphdef, 4))
    b = src.rollout(first if name == "world_model" else None)
    out[name] = (b, dict(src.metrics))
  for name, (b, m) in out.items():
    rows = b["response_mask"].sum(axis=1) > 0
    assert rows.tolist() == [False, False, True, True], name
    assert b["advantages"][:2].tolist() == [0.0, 0.0], name
    np.testing.assert_allclose(b["advantages"][2:], [-1 / np.sqrt(2), 1 / np.sqrt(2)],
                               rtol=1e-5, err_msg=name)
    assert (m["groups_skipped"], m["invalid_rewards"], m["judge_failures"]) == (1, 1, 1), name
    assert m["reward_mean"] == pytest.approx(5 / 3), name  # over the valid rewards
