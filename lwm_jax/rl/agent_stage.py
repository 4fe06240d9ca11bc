"""The "agent-rl" stage from a training config: the agent episode source the trainer loops over.

`agent_source(config)` reads `config.agent` (configs/agent_rl.py): the domain, the arm ("real":
episodes in the real environment, run in `agent.workers` worker processes; "sim": episodes in
`SimulatedEnv`s backed by the world-model checkpoint `agent.world_model`), the training and
held-out task seeds (`verify.task_seeds("train" | "heldout")`, disjoint ranges), the turn limit
and the reward ("credit" or "success"). Held-out tasks are always played in the REAL
environment. `config.rl` gives the group size, sampling temperature and the GSPO settings as
for the rl stage. See docs/agents.md.
"""
from __future__ import annotations

import os
from typing import Any

import ml_collections

from lwm_jax.envs import base
from lwm_jax.envs import verify
from lwm_jax.rl import agent_envs
from lwm_jax.rl.agent_episodes import REWARDS, AgentConfig, AgentEpisodeSource
from lwm_jax.rl.stage import engine_options, policy_tokenizer

ARMS = ("real", "sim")


def agent_config(c: ml_collections.ConfigDict) -> AgentConfig:
  """The episode settings of `config.agent` / `config.rl` / `config.train`, checked."""
  a, r, t = c.agent, c.rl, c.train
  if a.arm not in ARMS:
    raise ValueError(f"config.agent.arm: '{a.arm}' is not one of {ARMS}")
  if a.reward not in REWARDS:
    raise ValueError(f"config.agent.reward: '{a.reward}' is not one of {REWARDS}")
  try:
    base.env_module(a.domain)
  except (KeyError, ValueError) as e:
    raise ValueError(f"config.agent.domain: {e}") from None
  if int(a.train_tasks) < 1:
    raise ValueError(f"config.agent.train_tasks: must be >= 1, got {a.train_tasks}")
  try:
    ac = AgentConfig(
        domain=a.domain, tasks=tuple(verify.task_seeds("train", int(a.train_tasks))),
        tasks_per_batch=int(a.tasks_per_batch), group_size=int(r.group_size), seq_len=t.seq_len,
        max_turns=int(a.max_turns), max_new_tokens=int(a.max_new_tokens),
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=c.seed, reward=a.reward,
        filter_zero_variance=r.filter_zero_variance,
        updates_per_batch=int(r.updates_per_batch), credit=str(a.get("credit", "episode")),
        gamma=float(a.get("gamma", 0.9))).validate()
  except ValueError as e:
    raise ValueError(f"config.{e}") from None
  ac.check_run(t.batch_size)
  return ac


def real_envs(domain: str, workers: int):
  """Real envs of `domain`: in `workers` processes, or in this one for workers=0."""
  if workers > 0:
    return agent_envs.ProcessEnvs(domain, workers)
  return agent_envs.LocalEnvs(lambda seed: base.make_env(domain))


def world_model_envs(c: ml_collections.ConfigDict, engine: dict[str, Any]):
  """Simulated envs of the Sim arm: the world model `agent.world_model` (an HF folder or a
  training workdir) generates every observation."""
  from lwm_jax.sampling.params import SamplingParams  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.sampler import Sampler  # pylint: disable=import-outside-toplevel
  a = c.agent
  if not a.world_model or not os.path.exists(a.world_model):
    raise ValueError(f"config.agent.world_model: '{a.world_model}' does not exist (the sim arm "
                     "needs a world-model checkpoint)")
  wm = Sampler.from_checkpoint(a.world_model, decode_layout="model", **engine)
  params = SamplingParams(temperature=float(a.wm_temperature),
                          max_new_tokens=int(a.wm_max_new_tokens))
  return agent_envs.LocalEnvs(agent_envs.simulated_env_factory(
      wm, a.domain, int(a.max_turns), params, loop_guard=str(a.get("wm_loop_guard", "off"))))


def agent_source(c: ml_collections.ConfigDict) -> AgentEpisodeSource:
  """The agent-rl stage's batch source for config `c` (see the module docstring)."""
  tok = policy_tokenizer(c, "the agent's prompts are rendered with the policy's tokenizer")
  ac = agent_config(c)
  a = c.agent
  engine = engine_options(c)
  sim = world_model_envs(c, engine) if a.arm == "sim" else None  # its checks come first
  real = real_envs(a.domain, int(a.workers))
  envs = real if sim is None else sim
  held = tuple(verify.task_seeds("heldout", int(a.eval_tasks))) if int(a.eval_tasks) > 0 else ()
  return AgentEpisodeSource(tok, envs, ac, eval_envs=real, eval_tasks=held,
                            kl=c.rl.kl_coef > 0, **engine)
