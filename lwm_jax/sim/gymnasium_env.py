"""A `gymnasium.Env` face of `SimulatedEnv`, for the RL libraries of the Gymnasium ecosystem.

Observations and actions are text (`AnyText` spaces, a `gymnasium.spaces.Text` that admits any
character). `reset(seed=...)` returns `(initial_state, info)`; without a seed the episode's seed is
drawn from the env's seeded generator (`self.np_random`), as Gymnasium expects. `step(action)`
returns `(observation, reward, terminated, truncated, info)`: terminated when the agent takes a
finish action, truncated at the turn limit, reward from the optional verifier at the end (see
`lwm_jax.sim.env`). Observations longer than the observation space allows are cut with a note.
`info` is the step's info without its wall-clock latency (Gymnasium asks that the same seed and
action give equal infos); pass `report_latency=True` to keep `latency_s`.

    env = SimulatedGymEnv(sampler, world, max_turns=20)
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("ls -la")
"""
from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces

from lwm_jax.envs.base import truncate
from lwm_jax.sim.env import SimulatedEnv, World

# What `sample()` draws from; `contains` admits any character (observations are free text).
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "


class AnyText(spaces.Text):
  """Text of `min_length`..`max_length` characters of any kind; samples printable ASCII."""

  def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None):
    super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

  def contains(self, x: Any) -> bool:
    return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

  def __repr__(self) -> str:
    return f"AnyText({self.min_length}, {self.max_length})"


class SimulatedGymEnv(gymnasium.Env):
  """`gymnasium.Env` over a world model; keyword arguments go to `SimulatedEnv`."""

  metadata = {"render_modes": []}

  def __init__(self, sampler: Any, world: World, *, max_action_chars: int = 4096,
               max_obs_chars: int = 65536, report_latency: bool = False, **env_kw: Any):
    self.sim = SimulatedEnv(sampler, world, **env_kw)
    self.action_space = AnyText(max_action_chars, min_length=1)
    self.observation_space = AnyText(max_obs_chars)
    self.max_obs_chars = max_obs_chars
    self.report_latency = report_latency

  def reset(self, *, seed: int | None = None, options: dict | None = None
            ) -> tuple[str, dict[str, Any]]:
    super().reset(seed=seed)
    episode_seed = seed if seed is not None else int(self.np_random.integers(0, 2 ** 31 - 1))
    obs = self.sim.reset(episode_seed)
    return self._fit(obs), {"seed": episode_seed, "task": self.sim.world.task,
                            "action_space": self.sim.world.action_space}

  def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    if not self.action_space.contains(action):
      raise ValueError(f"action: expected a string of 1..{self.action_space.max_length} "
                       f"characters, got {type(action).__name__} {str(action)[:40]!r}")
    r = self.sim.step_result(action)
    info = dict(r.info)
    if not self.report_latency:
      info.pop("latency_s", None)
    return self._fit(r.observation), r.reward, r.terminated, r.truncated, info

  def _fit(self, text: str) -> str:
    if len(text) <= self.max_obs_chars:
      return text
    out = truncate(text, self.max_obs_chars - 64)
    return out[:self.max_obs_chars]

  def close(self) -> None:
    self.sim.close()
