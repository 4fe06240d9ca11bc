"""A world model as an environment: the same reset/step/describe/close API as `lwm_jax.envs`.

`SimulatedEnv` keeps the episode's history and, at each `step(action)`, asks the LWM for the next
observation given the system prompt (task, action space, initial state, demonstrations, simulation
instruction) and everything so far. An agent cannot tell it from a real environment by its API, which
is what Sim RL needs. `simulation_instruction` steers the world (injected errors, pagination, ...).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from lwm_jax.data import prompts
from lwm_jax.data.reply import parse_prediction
from lwm_jax.data.schema import Trajectory, Turn
from lwm_jax.envs.base import EnvInfo
from lwm_jax.sampling.params import SamplingParams


@dataclasses.dataclass
class World:
  """What the simulated world is: the static parts of a system prompt."""
  domain: str
  task: str
  action_space: str
  initial_state: str
  demonstrations: str = ""
  simulation_instruction: str = ""

  @classmethod
  def from_trajectory(cls, traj: Trajectory) -> "World":
    return cls(traj.domain, traj.task, traj.action_space, traj.initial_state,
               traj.demonstrations, traj.simulation_instruction)


class SimulatedEnv:
  """An environment whose observations come from a Language World Model (a `Sampler`)."""

  def __init__(self, sampler: Any, world: World, *, variant: int = 0,
               params: SamplingParams | None = None, max_turns: int = 50):
    self.sampler = sampler
    self.world = world
    self.variant = variant
    self.params = params or SamplingParams(temperature=0.0, max_new_tokens=256)
    self.max_turns = max_turns
    self.turns: list[Turn] = []
    self.raw: list[str] = []          # the model's full replies (thinking included)
    self.seed = 0

  @property
  def domain(self) -> str:
    return self.world.domain

  def reset(self, seed: int = 0) -> str:
    self.turns, self.raw, self.seed = [], [], seed
    return self.world.initial_state

  def describe(self) -> EnvInfo:
    return EnvInfo(self.world.task, self.world.action_space, self.world.initial_state)

  def trajectory(self, traj_id: str = "simulated") -> Trajectory:
    w = self.world
    return Trajectory(id=traj_id, domain=w.domain, task=w.task, action_space=w.action_space,
                      initial_state=w.initial_state, turns=list(self.turns),
                      demonstrations=w.demonstrations,
                      simulation_instruction=w.simulation_instruction,
                      meta={"source": "simulated", "seed": self.seed})

  def messages_for(self, action: str) -> list[dict[str, str]]:
    """The chat the world model sees for the next observation after `action`."""
    pending = self.trajectory()
    pending.turns.append(Turn(action, ""))
    return prompts.prompt_messages(pending, len(pending.turns) - 1, self.variant)

  def step(self, action: str) -> str:
    if len(self.turns) >= self.max_turns:
      raise RuntimeError(f"simulated episode reached max_turns={self.max_turns}; call reset()")
    params = dataclasses.replace(self.params, seed=self.params.seed + 1000 * self.seed +
                                 len(self.turns))
    gen = self.sampler.generate([self.messages_for(action)], params)[0]
    observation = parse_prediction(gen.text)
    self.raw.append(gen.text)
    self.turns.append(Turn(action, observation))
    return observation

  def close(self) -> None:
    self.turns = []
