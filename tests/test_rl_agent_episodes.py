"""Multi-turn agent episodes: ends at finish()/the turn limit with bad actions as observations, one
policy call per turn for the live episodes, weights only on the agent's tokens, the agent GSPO step
equal to the sequence-level formula computed by hand, and one code path for the Sim and Real arms
(the same source class over a fake real env, a SimulatedEnv, and real envs in worker processes)."""
from __future__ import annotations

import functools
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from lwm_jax.data import agent_targets
from lwm_jax.envs import base, verify
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.rl import agent_envs
from lwm_jax.rl.agent_episodes import AgentConfig, AgentEpisodeSource, run_episodes, wilson
from lwm_jax.sampling.params import Generation, SamplingParams
from lwm_jax.sampling.sampler import Sampler
from lwm_jax.sim.env import SimulatedEnv, World
from lwm_jax.train import steps, trainer
from lwm_jax.train.state import TrainState
from tests.test_rl_pool import train_tokenizer

ENGINE = dict(chunk_steps=8, min_prompt_bucket=512, prefill_chunk=512, min_cache_len=512,
              max_batch=4, min_batch_bucket=4)


class FakeShell(base.Env):
  """A scripted world: `echo X` prints X, an empty action or an unknown command is an error
  message, `crash` raises. The goal is to print the seed's word."""
  domain = "terminal"

  def reset(self, seed: int) -> str:
    self.steps, self.goal = 0, {"kind": "echo", "word": f"w{seed}"}
    return self._ready(f"Print the word w{seed}. (task {seed})",
                       "One shell command per turn, e.g. echo WORD.", "$ ")

  def step(self, action: str) -> str:
    self.steps += 1
    if not action.strip():
      return "error: empty command"
    if action == "crash":
      raise RuntimeError("boom")
    if action.startswith("echo "):
      return action[5:]
    return f"error: unknown command: {action[:40]}"


def fake_verdict(env, seed, turns) -> verify.Verdict:
  ok = any(o == f"w{seed}" for _, o in turns)
  return verify.Verdict(ok, 1.0 if ok else 0.25 * any(o == "hi" for _, o in turns), "fake")


class ScriptedPolicy:
  """A stand-in sampler: replies by script per task and turn (read from the prompt), and logs
  each call's batch."""

  def __init__(self, tok, scripts):
    self.tokenizer, self.scripts, self.calls = tok, scripts, []

  def generate(self, prompts, params):
    assert len(prompts) == len(params)
    out = []
    for ids in prompts:
      text = self.tokenizer.decode(ids)
      seed = int(re.search(r"\(task (\d+)\)", text).group(1))
      turn = text.count("Result of your action")
      reply = self.scripts[seed][turn]
      toks = self.tokenizer.encode(reply) + [self.tokenizer.im_end_id]
      out.append(Generation(reply, toks, [-0.5] * len(toks), "stop"))
    self.calls.append([self.tokenizer.decode(p) for p in prompts])
    return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return train_tokenizer(tmp_path_factory.mktemp("sp"))


def test_episodes_end_at_finish_or_turn_limit_and_bad_actions_are_observations(tok):
  scripts = {1: ["echo hi", "", "crash", "echo w1", agent_targets.FINISH_ACTION],
             2: ["%%%"] * 9,
             3: [agent_targets.FINISH_ACTION]}
  policy = ScriptedPolicy(tok, scripts)
  envs = agent_envs.LocalEnvs(lambda seed: FakeShell(), fake_verdict)
  cfg = AgentConfig(domain="terminal", tasks=(1,), max_turns=5, seq_len=1024, max_new_tokens=16)
  eps, _ = run_episodes(policy, envs, "terminal", [1, 2, 3], cfg, SamplingParams())
  e1, e2, e3 = eps
  assert (e1.end, e2.end, e3.end) == ("finish", "turn_limit", "finish")
  assert e1.turns == [("echo hi", "hi"), ("", "error: empty command"),
                      ("crash", "error: RuntimeError: boom"), ("echo w1", "w1")]
  assert len(e2.turns) == 5 and all(o == "error: unknown command: %%%" for _, o in e2.turns)
  assert e3.turns == []
  assert (e1.success, e1.credit, e2.success, e2.credit) == (True, 1.0, False, 0.0)
  # one policy call per turn, for the live episodes only
  assert [len(c) for c in policy.calls] == [3, 2, 2, 2, 2]
  # the observation of turn k is in the prompt of turn k + 1, in the cloned layout
  assert "Result of your action:\nerror: empty command" in policy.calls[2][0]
  assert envs.envs == {}  # every env closed


@pytest.fixture(scope="module")
def policy_batch(tok):
  """A rollout of the tiny random model against FakeShell: 2 tasks x 2 episodes, 2 turns."""
  cfg = get_preset("tiny", vocab_size=tok.vocab_size, num_hidden_layers=1, num_experts=4)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  acfg = AgentConfig(domain="terminal", tasks=(5, 6), tasks_per_batch=2, group_size=2,
                     max_turns=2, seq_len=512, max_new_tokens=8, seed=3,
                     filter_zero_variance=False, updates_per_batch=1)
  envs = agent_envs.LocalEnvs(lambda seed: FakeShell(), fake_verdict)
  src = AgentEpisodeSource(tok, envs, acfg, **ENGINE)
  src.bind(SimpleNamespace(graphdef=graphdef, mesh=None, seq_len=512, batch_size=4,
                           process_index=0, process_count=1))
  batch = src.next_batch(params)
  return graphdef, params, batch, src.last, src


def test_batch_weights_only_on_agent_tokens(tok, policy_batch):
  _, _, batch, eps, src = policy_batch
  assert batch["tokens"].shape == (4, 512) and src.metrics["episodes"] == 4
  for i, e in enumerate(eps):
    ids, mask = batch["tokens"][i], batch["response_mask"][i]
    assert len(e.turns) == 2 and e.end == "turn_limit"
    # the weighted tokens, run by run, decode to the agent's replies and nothing else
    runs, cur = [], []
    for t, w in zip(ids, mask):
      if w > 0:
        cur.append(int(t))
      elif cur:
        runs, cur = runs + [cur], []
    runs += [cur] if cur else []
    texts = [tok.decode([t for t in r if t != tok.im_end_id]) for r in runs]
    assert len(runs) == 2 and texts == e.replies
    # every observation message the agent acted on is in the row (the last one, after the
    # turn limit, is not needed), all of its tokens unweighted
    row = [int(t) for t in ids]
    for _, obs in e.turns[:-1]:
      msg = tok.encode_message({"role": "user",
                                "content": agent_targets.observation_message(obs)})[0]
      at = [k for k in range(len(row) - len(msg)) if row[k:k + len(msg)] == msg]
      assert len(at) == 1 and not mask[at[0]:at[0] + len(msg)].any()
    assert "Print the word" in tok.decode(row[:row.index(tok.im_end_id, 2)])
    assert np.all(batch["old_logprobs"][i][mask == 0] == 0)
    assert np.all(batch["old_logprobs"][i][mask > 0] < 0)


def test_agent_gspo_step_equals_the_sequence_formula(policy_batch):
  assert trainer.step_kind("agent-rl") is trainer.POLICY  # the stage trains with this step
  graphdef, params, batch, _, _ = policy_batch
  b = dict(batch)
  rng = np.random.default_rng(0)
  mask = b["response_mask"]
  b["old_logprobs"] = (b["old_logprobs"] + rng.normal(0, 0.01, mask.shape) * mask
                       ).astype(np.float32)
  b["advantages"] = np.array([1.0, -1.0, 0.5, -2.0], np.float32)
  logp = np.asarray(jax.jit(functools.partial(steps.sequence_logprobs, graphdef))(params, b),
                    np.float64)
  # by hand: s_i = exp(mean over agent tokens of (logp - old)), clipped objective, mean over rows
  m, old, adv = mask[:, 1:], b["old_logprobs"][:, 1:], b["advantages"]
  log_s = (m * (logp[:, 1:] - old)).sum(1) / m.sum(1)
  s = np.exp(np.minimum(log_s, 10.0))
  obj = np.minimum(s * adv, np.clip(s, 1 - 3e-4, 1 + 4e-4) * adv)
  want = -obj.mean()
  assert np.any(np.clip(s, 1 - 3e-4, 1 + 4e-4) != s)  # the clip is exercised
  tx = optax.sgd(1e-3)  # the loss value does not depend on the optimizer
  state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(steps.gspo_step, graphdef, tx, lambda _: 1e-3,
                                   steps.StepConfig(algo="gspo")))
  _, metrics = step(state, b)
  np.testing.assert_allclose(float(metrics["pg_loss"]), want, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(metrics["ratio_mean"]), s.mean(), rtol=1e-5)


def test_on_policy_first_update_has_ratio_one(policy_batch):
  """The recorded log-probs are the training forward's at the agent's tokens."""
  graphdef, params, batch, _, _ = policy_batch
  logp = np.asarray(jax.jit(functools.partial(steps.sequence_logprobs, graphdef))(params, batch))
  mask = batch["response_mask"] > 0
  np.testing.assert_allclose(logp[mask], batch["old_logprobs"][mask], atol=2e-3)


def test_sim_and_real_arms_share_the_code_path(tok):
  scripts = {s: ["echo hi", f"echo w{s}", agent_targets.FINISH_ACTION] for s in (7, 8)}
  model = Transformer(get_preset("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(1))
  wm = Sampler(model, tok, decode_layout="model",
               **ENGINE)
  wm_calls = []
  real_generate = wm.generate
  wm.generate = lambda chats, ps: wm_calls.append(len(chats)) or real_generate(chats, ps)
  greedy = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)

  def sim_env(seed):
    real = FakeShell()
    return SimulatedEnv(wm, World.from_env(real, seed), params=greedy, max_turns=10)

  arms = {"real": agent_envs.LocalEnvs(lambda seed: FakeShell(), fake_verdict),
          "sim": agent_envs.LocalEnvs(sim_env, fake_verdict)}
  out = {}
  for name, envs in arms.items():
    cfg = AgentConfig(domain="terminal", tasks=(7, 8), tasks_per_batch=2, group_size=2,
                      max_turns=4, seq_len=1024, max_new_tokens=16)
    src = AgentEpisodeSource(tok, envs, cfg)
    src.sampler = ScriptedPolicy(tok, scripts)   # the same policy for both arms
    out[name] = (src.next_batch(None), src.last)
  (rb, real_eps), (sb, sim_eps) = out["real"], out["sim"]
  assert type(arms["real"]) is type(arms["sim"])
  assert all(e.end == "finish" for e in real_eps + sim_eps)
  assert [e.success for e in real_eps] == [True] * 4
  # the same actions; the observations of the sim arm came from the world model, one call per turn
  assert [a for e in sim_eps for a, _ in e.turns] == [a for e in real_eps for a, _ in e.turns]
  assert wm_calls == [4, 4]
  assert all(o != f"w{e.seed}" for e in sim_eps for _, o in e.turns)
  assert rb.keys() == sb.keys() and rb["tokens"].shape == sb["tokens"].shape


def test_real_envs_in_worker_processes_match_in_process():
  seeds = list(verify.task_seeds("train", 3))
  pool = agent_envs.ProcessEnvs("search", workers=2)
  local = agent_envs.LocalEnvs(lambda seed: base.make_env("search"))
  try:
    got = []
    for envs in (pool, local):
      infos = envs.open(list(enumerate(seeds)))
      obs = envs.step([(0, 'search(query="json")'), (1, ""), (2, "open(doc_id=")])
      verdicts = envs.verdict([(i, [("a", o)]) for i, o in enumerate(obs)])
      envs.close([0, 1, 2])
      got.append(([i.task for i in infos], obs, verdicts))
    assert got[0] == got[1]
    assert "json" in got[0][1][0] and got[0][1][1] and got[0][1][2]  # errors are observations
  finally:
    pool.shutdown()


def test_wilson_interval():
  lo, hi = wilson(8, 10)  # the textbook value: 0.490 .. 0.943
  assert abs(lo - 0.4902) < 1e-3 and abs(hi - 0.9433) < 1e-3


def test_default_verdicts_real_state_and_simulated_transcript():
  """Search: a real env is judged by verify.check, a simulated one (its world from the real
  env's reset) by the transcript verifier; the same transcript gets the same verdict."""
  seed = verify.task_seeds("train", 1)[0]
  sim = agent_envs.simulated_env_factory(None, "search", max_turns=3)(seed)
  sim.reset(seed)
  real = base.make_env("search")
  real.reset(seed)
  target = real.goal["target"]
  assert sim.goal["target"] == target and sim.describe().task == real.describe().task
  opened = [(f'open(doc_id="{target}")', f"[{target}] page 1/1\n...")]
  listed = [('search(query="x")', f"1. [{target}] some title\n   snippet")]
  for turns, want in ((opened, (True, 1.0)), (listed, (False, 0.5)), ([], (False, 0.0))):
    for env in (sim, real):
      v = agent_envs.default_verdict(env, seed, turns)
      assert (v.success, v.credit) == want, (type(env).__name__, v)
  real.close()


def test_resume_mid_rollout_gives_the_same_minibatch(tok):
  """Two updates per rollout: a source restored after the first hands out the same second half
  without playing; a fresh rollout after it draws the next tasks of the same order."""
  scripts = {s: ["echo hi", agent_targets.FINISH_ACTION] for s in range(20, 26)}
  cfg = AgentConfig(domain="terminal", tasks=tuple(range(20, 26)), tasks_per_batch=2,
                    group_size=2, max_turns=3, seq_len=1024, max_new_tokens=16, seed=5,
                    updates_per_batch=2)

  def source():
    src = AgentEpisodeSource(tok, agent_envs.LocalEnvs(lambda s: FakeShell(), fake_verdict), cfg)
    src.sampler = ScriptedPolicy(tok, scripts)
    return src
  a = source()
  first = a.next_batch()
  saved = a.get_state()
  second, third = a.next_batch(), a.next_batch()
  b = source()
  b.set_state(saved)
  again = b.next_batch()
  assert b.sampler.calls == [] and first["tokens"].shape == (2, 1024)
  for k in second:
    np.testing.assert_array_equal(again[k], second[k], err_msg=k)
  np.testing.assert_array_equal(b.next_batch()["tokens"], third["tokens"])
  assert a.calls == b.calls == 2


def test_finish_and_action_parsing():
  from lwm_jax.rl.agent_episodes import is_finish, parse_action
  assert [is_finish(a) for a in ("finish()", " finish ", 'finish(answer="x")')] == [True] * 3
  assert not any(is_finish(a) for a in ("finished", "finish() ls", 'search(query="finish")', ""))
  assert parse_action("<think>plan</think>\n  open(doc_id=\"re\")\n") == 'open(doc_id="re")'
  assert parse_action("   ") == ""


def test_a_dead_worker_is_a_clear_error():
  pool = agent_envs.ProcessEnvs("search", workers=1, timeout_s=30)
  try:
    pool.procs[0].kill()
    pool.procs[0].join()
    with pytest.raises(RuntimeError, match="search env worker 0"):
      pool.open([(0, verify.task_seeds("train", 1)[0])])
  finally:
    pool.shutdown()


def test_a_batch_without_policy_signal_leaves_the_weights_alone(policy_batch):
  """All groups filtered (response mask all zero): the MoE balance loss still has a gradient, but
  the step must not move the parameters or Adam's moments; a batch with signal does."""
  graphdef, params, batch, _, _ = policy_batch
  tx = optax.adam(1e-3)
  state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(steps.gspo_step, graphdef, tx, lambda _: 1e-3,
                                   steps.StepConfig(algo="gspo")))
  b = dict(batch, advantages=np.array([1.0, -1.0, 0.5, -0.5], np.float32))
  empty = dict(b, response_mask=np.zeros_like(b["response_mask"]))
  leaves = lambda t: [np.asarray(x) for x in jax.tree.leaves(t)]  # noqa: E731
  new, m = step(state, empty)
  assert float(m["grad_norm"]) > 0 and float(m["skipped"]) == 1.0  # the aux loss had a gradient
  for a, c in zip(leaves(new.params), leaves(state.params)):
    np.testing.assert_array_equal(a, c)
  for a, c in zip(leaves(new.opt_state), leaves(state.opt_state)):
    if np.issubdtype(a.dtype, np.integer):
      assert int(a) == int(c) + 1  # the counters advance with the step
    else:
      np.testing.assert_array_equal(a, c)
  assert int(new.step) == 1
  moved, m = step(state, b)
  assert float(m["skipped"]) == 0.0
  assert any(np.any(a != c) for a, c in zip(leaves(moved.params), leaves(state.params)))


# ------------------------------------------------------------ issue 64: updates and turn credit


def test_agent_rl_takes_four_updates_per_rollout_like_world_model_rl():
  from configs import agent_rl, rl
  for preset in ("tiny", "demo"):
    c = agent_rl.get_config(preset)
    assert c.rl.updates_per_batch == rl.get_config("demo").rl.updates_per_batch == 4
    assert c.train.batch_size * 4 == c.agent.tasks_per_batch * c.rl.group_size
  assert AgentConfig(tasks=(1,)).updates_per_batch == 4


def test_per_turn_credit_is_the_discounted_return_normalised_over_the_group():
  from lwm_jax.rl.agent_episodes import Episode, turn_advantages, turn_spans

  def ep(replies):  # context 3 tokens, then per reply: n agent tokens and 2 context tokens
    e = Episode(0, 0)
    e.add([1, 2, 3], 0.0)
    for n in replies:
      e.add([5] * n, 1.0)
      e.add([6, 7], 0.0)
    return e
  eps = [ep([2, 3]), ep([1, 1, 2]), ep([4]), ep([2, 2])]
  rewards = np.array([1.0, 0.0, 0.5, 0.0])
  gamma = 0.5
  adv, flat = turn_advantages(eps, rewards, 4, 64, gamma)
  # returns by hand: ep0 turns (0.5, 1); ep1 (0, 0, 0); ep2 (0.5); ep3 (0, 0)
  g = np.array([0.5, 1.0, 0, 0, 0, 0.5, 0, 0])
  want = (g - g.mean()) / (g.std(ddof=1) + 1e-6)
  got = [adv[i, a] for i, e in enumerate(eps) for a, _ in turn_spans(e)]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert turn_spans(eps[0]) == [(3, 5), (7, 10)] and not flat.any()
  for i, e in enumerate(eps):  # only the agent's tokens carry a value
    assert np.all(adv[i][np.array(e.agent + [0.0] * (64 - len(e.agent))) == 0] == 0)
  # every episode failed: no signal
  _, flat = turn_advantages(eps, np.zeros(4), 4, 64, gamma)
  assert flat.all()


def test_per_turn_advantages_train_with_a_per_token_loss(policy_batch):
  """[B, S] advantages equal on every token of a row give the [B] step's loss (gspo_token); a
  sequence-level GSPO run with per-turn credit is refused by the config check."""
  graphdef, params, batch, _, _ = policy_batch
  b = dict(batch)
  rows = np.array([1.0, -1.0, 0.5, -2.0], np.float32)
  tx = optax.sgd(1e-3)
  state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(steps.gspo_step, graphdef, tx, lambda _: 1e-3,
                                   steps.StepConfig(algo="gspo_token")))
  _, m_rows = step(state, dict(b, advantages=rows))
  state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
  per_token = (rows[:, None] * np.ones_like(b["response_mask"])).astype(np.float32)
  _, m_tok = step(state, dict(b, advantages=per_token))
  np.testing.assert_allclose(float(m_tok["pg_loss"]), float(m_rows["pg_loss"]), rtol=1e-5)
  from configs import agent_rl
  from lwm_jax.train.run_config import validate_config
  c = agent_rl.get_config("tiny")
  c.agent.credit, c.data.tokenizer = "turn", __file__
  assert trainer.token_advantages(c)
  with pytest.raises(ValueError, match="rl.algo"):
    validate_config(c)


def test_agent_rl_carries_a_kl_term_against_the_first_rollouts_policy(tok):
  from configs import agent_rl  # pylint: disable=import-outside-toplevel
  from lwm_jax.train.run_config import validate_config  # pylint: disable=import-outside-toplevel
  c = agent_rl.get_config("tiny")
  c.rl.kl_coef, c.data.tokenizer = 0.05, __file__
  validate_config(c)  # refused while agent-rl had no reference policy
  assert "ref_logprobs" in trainer.run_step_kind(c).keys
  c.rl.kl_coef = 0.0
  assert "ref_logprobs" not in trainer.run_step_kind(c).keys
  cfg = get_preset("tiny", vocab_size=tok.vocab_size, num_hidden_layers=1, num_experts=4)
  graphdef, first = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  _, moved = nnx.split(Transformer(cfg, rngs=nnx.Rngs(7)))
  acfg = AgentConfig(domain="terminal", tasks=(5, 6), tasks_per_batch=2, group_size=2,
                     max_turns=1, seq_len=512, max_new_tokens=8, seed=3,
                     filter_zero_variance=False, updates_per_batch=1)
  src = AgentEpisodeSource(tok, agent_envs.LocalEnvs(lambda seed: FakeShell(), fake_verdict),
                           acfg, kl=True, **ENGINE)
  src.bind(SimpleNamespace(graphdef=graphdef, mesh=None, seq_len=512, batch_size=4,
                           process_index=0, process_count=1))
  tx = optax.sgd(1e-3)
  step = jax.jit(functools.partial(steps.gspo_step, graphdef, tx, lambda _: 1e-3,
                                   steps.StepConfig(algo="gspo", kl_coef=0.05)))
  kls = []
  for params in (first, moved):  # the policy moves between the two rollouts
    batch = src.next_batch(params)
    assert "ref_logprobs" in batch
    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
    _, m = step(state, batch)
    kls.append(float(m["kl"]))
  # on the first rollout the reference is the policy itself; after it moved, the term is not 0
  assert abs(kls[0]) < 1e-4 and kls[1] > 1e-3
