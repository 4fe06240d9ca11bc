"""SimulatedEnv on a tiny random model and the real Sampler: the Env contract it shares with the
real environments, episode state (done, reward, info), batched stepping and misuse."""
from __future__ import annotations

import random

import pytest

from lwm_jax.data import bench_records as awb
from lwm_jax.data import prompts
from lwm_jax.data.reply import parse_prediction
from lwm_jax.envs import base, recorder
from lwm_jax.envs.search.env import SearchEnv
from lwm_jax.sim.env import SimulatedBatch, SimulatedEnv, World, action_name, step_many
from tests.sim_helpers import GREEDY, terminal_world, tiny_sampler


@pytest.fixture(scope="module")
def sampler():
  return tiny_sampler()


@pytest.fixture(scope="module")
def search_env():
  env = SearchEnv()
  yield env
  env.close()


def _sim(sampler, **kw):
  return SimulatedEnv(sampler, terminal_world(), params=GREEDY, **kw)


# -- the contract every Env keeps, checked on a real environment and on the simulated one -------
@pytest.fixture(params=["real-search", "simulated"])
def any_env(request, sampler, search_env):
  if request.param == "real-search":
    return search_env, 'search(query="json")'
  return _sim(sampler), "ls -la"


def test_env_contract_shared_with_real_environments(any_env):
  env, action = any_env
  assert isinstance(env, base.Env)
  fresh = type(env).__new__(type(env))  # describe() before any reset is an error for both
  base.Env.__init__(fresh)
  with pytest.raises(RuntimeError, match="reset"):
    fresh.describe()
  first = env.reset(3)
  info = env.describe()
  assert isinstance(first, str) and first == info.initial_state
  assert info.task and info.action_space
  obs = env.step(action)
  assert isinstance(obs, str)
  assert env.steps == 1
  # The same seed and action give the same episode (greedy world model; a real program).
  again = env.reset(3)
  assert again == first and env.step(action) == obs and env.steps == 1


def test_world_from_a_real_env_describe(sampler, search_env):
  world = World.from_env(search_env, seed=5)
  assert world.domain == "search" and world.task == search_env.goal["text"]
  sim = SimulatedEnv(sampler, world, params=GREEDY)
  assert sim.reset(5) == search_env.describe().initial_state
  sim.step('search(query="signature")')
  assert sim.trajectory().turns[0].action == 'search(query="signature")'


def test_a_real_envs_scripted_agent_plays_the_simulated_world(sampler, search_env):
  world = World.from_env(search_env, seed=5)
  assert world.goal == search_env.goal and "target" in world.goal
  sim = SimulatedEnv(sampler, world, params=GREEDY, max_turns=4)
  traj = recorder.run_episode(sim, base.make_agent("search", random.Random(5)), 5, "sim-5",
                              max_turns=2)
  assert traj.domain == "search" and traj.task == world.task and 1 <= len(traj.turns) <= 2
  # Reference: the real episode; the agent plans its first action from the goal alone.
  real = recorder.run_episode(search_env, base.make_agent("search", random.Random(5)), 5,
                              "real-5", max_turns=1)
  assert traj.turns[0].action == real.turns[0].action
  # The goal (the answer) is never shown to the world model.
  assert world.goal["target"] not in prompts.system_prompt(sim.trajectory(), 0)


# -- what SimulatedEnv adds --------------------------------------------------------------------
def test_step_result_info_matches_an_independent_generation(sampler):
  env = _sim(sampler)
  env.reset(0)
  r = env.step_result("cat notes.txt")
  assert not r.done and r.reward == 0.0 and r.info["turn"] == 1
  # Reference: the benchmark's own rendering of the same turn, generated directly.
  traj = env.trajectory()
  traj.turns[0].observation = ""
  rec = awb.trajectory_to_records(traj, prompts.system_prompt(traj, 0), [0])[0]
  msgs = rec.messages()
  gen = sampler.generate([msgs], GREEDY)[0]
  assert r.info["raw"] == gen.text and r.observation == parse_prediction(gen.text, keep_spaces=True)
  assert r.info["prompt_tokens"] == len(sampler.encode_prompt(msgs))
  assert r.info["completion_tokens"] == GREEDY.max_new_tokens  # ignore_eos: the whole budget
  assert r.info["finish_reason"] == "length" and r.info["latency_s"] > 0


def test_done_at_the_turn_limit_and_errors_on_misuse(sampler):
  env = _sim(sampler, max_turns=2)
  with pytest.raises(RuntimeError, match="reset"):
    env.step("ls")
  env.reset(1)
  assert not env.step_result("ls").done
  last = env.step_result("pwd")
  assert last.done and last.truncated and not last.terminated
  with pytest.raises(RuntimeError, match="episode is over"):
    env.step("ls")
  env.reset(1)
  with pytest.raises(TypeError, match="action"):
    env.step(["ls"])
  env.close()
  with pytest.raises(RuntimeError, match="closed"):
    env.step("ls")
  with pytest.raises(RuntimeError, match="closed"):
    env.reset(0)


def test_finish_action_ends_the_episode_with_the_verifiers_reward(sampler):
  seen = []

  def verifier(traj):
    seen.append([t.action for t in traj.turns])
    return 1.0 if any("wc -l" in t.action for t in traj.turns) else 0.0

  env = _sim(sampler, verifier=verifier)
  calls = sampler.engine.generate
  counted = []
  sampler.engine.generate = lambda *a, **k: counted.append(1) or calls(*a, **k)
  try:
    env.reset(0)
    assert env.step_result("wc -l notes.txt").reward == 0.0 and not seen
    end = env.step_result('finish(answer="12")')
  finally:
    sampler.engine.generate = calls
  assert end.terminated and not end.truncated and end.reward == 1.0 and end.observation == ""
  assert seen == [["wc -l notes.txt", 'finish(answer="12")']]
  assert len(counted) == 1  # the finish action did not ask the world model


def test_a_verdict_verifier_gives_its_credit_and_the_verdict_in_info(sampler):
  from lwm_jax.envs.verify import Verdict
  env = _sim(sampler, verifier=lambda traj: Verdict(False, 0.5, f"{len(traj.turns)} turns"))
  env.reset(0)
  end = env.step_result('finish(answer="12")')
  assert end.reward == 0.5 and end.info["verified"]
  assert end.info["verdict"] == {"success": False, "credit": 0.5, "reason": "1 turns"}


def test_finish_action_names():
  assert action_name('finish(answer="x")') == "finish"
  assert action_name("exit") == "exit"
  assert action_name('{"tool": "finish", "arguments": {}}') == "finish"
  assert action_name("ls -la") == "ls"
  w = terminal_world()
  assert w.is_finish("exit") and not w.is_finish("ls") and not w.is_finish("echo finish()")
  mcp = World("mcp", "t", "tools", "s")
  assert not mcp.is_finish("exit") and mcp.is_finish('{"tool": "submit"}')
  with pytest.raises(ValueError, match="world.domain"):
    World("nowhere", "t", "a", "s")
  with pytest.raises(ValueError, match="world.colour"):
    World.from_dict({"domain": "mcp", "task": "t", "action_space": "a", "initial_state": "s",
                     "colour": 1})
  with pytest.raises(ValueError, match="world.initial_state: missing"):
    World.from_dict({"domain": "mcp", "task": "t", "action_space": "a"})


def test_step_many_is_one_engine_call_and_equals_stepping_alone(sampler):
  worlds = [terminal_world(), terminal_world(simulation_instruction="Every command fails."),
            World("search", "Find json.dumps", "search(query)", "empty index")]
  actions = ["ls", "cat notes.txt", 'search(query="dumps")']
  batch = SimulatedBatch(sampler, worlds, params=GREEDY)
  batch.reset([0, 1, 2])
  calls = sampler.engine.generate
  counted = []
  sampler.engine.generate = lambda *a, **k: counted.append(len(a[0])) or calls(*a, **k)
  try:
    together = batch.step(actions)
  finally:
    sampler.engine.generate = calls
  assert counted == [3]
  for w, a, s, r in zip(worlds, actions, [0, 1, 2], together):
    alone = SimulatedEnv(sampler, w, params=GREEDY)
    alone.reset(s)
    assert alone.step_result(a).info["raw"] == r.info["raw"]
  # A misuse anywhere stops the whole call before any episode moves.
  batch.envs[1].done = True
  with pytest.raises(RuntimeError, match="episode 1"):
    step_many(batch.envs, actions)
  assert [len(e.turns) for e in batch.envs] == [1, 1, 1]
  assert batch.step([None, None, "pwd"])[:2] == [None, None]
