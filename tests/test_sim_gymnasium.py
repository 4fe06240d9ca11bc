"""The Gymnasium face of the simulated environment passes Gymnasium's own environment checker."""
from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

from lwm_jax.sim.gymnasium_env import AnyText, SimulatedGymEnv
from tests.sim_helpers import GREEDY, terminal_world, tiny_sampler


@pytest.fixture(scope="module")
def sampler():
  return tiny_sampler()


@pytest.mark.slow  # heavy (over 10 s): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_gymnasium_env_checker_passes(sampler):
  # Short sampled actions keep every prompt in one compiled shape.
  env = SimulatedGymEnv(sampler, terminal_world(), params=GREEDY, max_turns=3,
                        max_action_chars=40)
  check_env(env, skip_render_check=True)
  env.close()


def test_gymnasium_episode_terminates_and_truncates(sampler):
  env = SimulatedGymEnv(sampler, terminal_world(), params=GREEDY, max_turns=2,
                        verifier=lambda traj: float(len(traj.turns)))
  obs, info = env.reset(seed=4)
  assert obs == "user@box:~$ " and info["seed"] == 4
  obs, reward, term, trunc, info = env.step("ls")
  assert isinstance(obs, str) and (reward, term, trunc) == (0.0, False, False)
  assert "raw" in info and info["completion_tokens"] == GREEDY.max_new_tokens
  _, reward, term, trunc, _ = env.step("pwd")
  assert (reward, term, trunc) == (2.0, False, True)  # the limit: truncated, verifier scored
  env.reset(seed=5)
  _, reward, term, trunc, info = env.step("exit")
  assert (reward, term, trunc) == (1.0, True, False) and info["finish_action"]
  with pytest.raises(ValueError, match="action"):
    env.step(3)


def test_any_text_space():
  space = AnyText(5)
  assert space.contains("héllo") and space.contains("") and not space.contains("toolong")
  assert not space.contains(b"abc")
  space.seed(0)
  assert all(space.contains(space.sample()) for _ in range(20))
