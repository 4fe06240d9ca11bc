"""Runs a scripted agent in a real environment and records the episode as a `Trajectory`."""
from __future__ import annotations

import random

from lwm_jax import domains
from lwm_jax.data import schema
from lwm_jax.envs import base, perturb

ENV_VERSION = "3"  # 3: each turn carries the environment's own report (`Turn.env`)


def episode_seed(seed: int, index: int) -> int:
  """Seed of episode `index` of a collection run with base `seed` (independent of workers)."""
  return seed * 1_000_003 + index


def run_episode(env: base.Env, agent: base.Agent, seed: int, episode_id: str,
                max_turns: int = 30) -> schema.Trajectory:
  """Plays one episode and returns it.

  GUI domains (android, web, os) follow the paper's hygiene rule: a turn whose observation is
  equal to the previous screen (`env.screen_state`: the action changed nothing and showed
  no error) is not
  recorded; the number left out goes to `meta['unchanged_turns_dropped']`. Invalid actions that
  show an error (a toast, a banner) change the screen and are kept as recorded failures.

  Each turn carries what the environment reported about its step (`Turn.env`): `error`, the
  env's `step_error` ("" when the action went through), and `changed`, whether the step changed
  the world's state (`state_digest` before and after; left out when the env cannot tell).
  """
  initial = env.reset(seed)
  info = env.describe()
  agent.begin(env, initial)
  gui = domains.get_domain(env.domain).gui
  turns: list[schema.Turn] = []
  last = initial
  dropped = 0
  state = env.state_digest()
  for _ in range(max_turns):
    action = agent.act(last)
    if action is None:
      break
    env.step_error = ""
    obs = env.step(action)
    facts = {"error": env.step_error}
    now = env.state_digest()
    if now is not None:
      facts["changed"] = now != state
    state = now
    if gui and env.screen_state(obs) == env.screen_state(last):
      dropped += 1
      continue
    turns.append(schema.Turn(action, obs, facts))
    last = obs
  meta = {"source": f"lwm_jax.envs/{env.domain}", "env_version": ENV_VERSION, "seed": seed,
          "agent": "scripted"}
  meta.update(env.episode_meta())
  if env.world_id:
    meta["world"] = env.world_id
  if gui:
    meta["unchanged_turns_dropped"] = dropped
  perts = getattr(env, "perturbs", None)
  if perts:  # the episode followed these perturbations for real: say so as the simulation does
    meta["perturb"] = perturb.spec_of(perts)
  return schema.Trajectory(
      id=episode_id, domain=env.domain, task=info.task, action_space=info.action_space,
      initial_state=info.initial_state, turns=turns, meta=meta,
      simulation_instruction=perturb.instruction(perts) if perts else "")


def record(name: str, seed: int, episode_id: str, env: base.Env | None = None,
           max_turns: int = 30) -> schema.Trajectory:
  """Convenience: builds (or reuses) env `name` and its scripted agent and plays one episode."""
  own = env is None
  env = env or base.make_env(name)
  try:
    agent = base.make_agent(name, random.Random(seed))
    return run_episode(env, agent, seed, episode_id, max_turns)
  finally:
    if own:
      env.close()
