"""A small Python client of the simulated-environment server (`launch/sim_serve.py`).

    client = SimClient("http://127.0.0.1:8100")
    ep = client.create(world={"domain": "terminal", "task": "...", "action_space": "...",
                              "initial_state": "$ "}, perturb="errors:rate=0.2,kind=timeout")
    r = ep.step("ls")            # a StepResult: observation, done, reward, info
    ep.close()

`RemoteEnv` puts a remote episode behind the `Env` API (reset/step/describe/close), so an agent
loop that takes an Env runs against the server unchanged. Server errors raise `SimServerError`
with the HTTP status and the server's message.
"""
from __future__ import annotations

from typing import Any

import httpx

from lwm_jax.envs import base
from lwm_jax.sim.env import StepResult, World


class SimServerError(RuntimeError):
  def __init__(self, status: int, message: str):
    super().__init__(f"{status}: {message}")
    self.status, self.message = status, message


class SimClient:
  def __init__(self, base_url: str, timeout: float = 300.0):
    self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)

  def _call(self, method: str, path: str, body: dict | None = None) -> dict:
    r = self.http.request(method, path, json=body)
    try:
      data = r.json()
    except ValueError:
      raise SimServerError(r.status_code, r.text[:200]) from None
    if r.status_code >= 400:
      err = data.get("error", {}) if isinstance(data, dict) else {}
      raise SimServerError(r.status_code, err.get("message", str(data)[:200]))
    return data

  def health(self) -> dict:
    return self._call("GET", "/health")

  def perturbations(self) -> list[dict]:
    return self._call("GET", "/v1/perturbations")["perturbations"]

  def create(self, world: World | dict | None = None, *, trajectory: Any = None,
             trajectory_file: str | None = None, **options: Any) -> "RemoteEpisode":
    """A new episode; `options` are the create fields (seed, perturb, max_turns, ...)."""
    body: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    if world is not None:
      body["world"] = world.to_dict() if isinstance(world, World) else world
    if trajectory is not None:
      body["trajectory"] = trajectory if isinstance(trajectory, dict) else trajectory.to_dict()
    if trajectory_file is not None:
      body["trajectory_file"] = trajectory_file
    data = self._call("POST", "/v1/episodes", body)
    return RemoteEpisode(self, data["episode_id"], data["observation"], data["world"])

  def close(self) -> None:
    self.http.close()


class RemoteEpisode:
  def __init__(self, client: SimClient, episode_id: str, observation: str, world: dict):
    self.client, self.id, self.initial_state, self.world = client, episode_id, observation, world
    self.done = False

  def step(self, action: str) -> StepResult:
    d = self.client._call("POST", f"/v1/episodes/{self.id}/step", {"action": action})
    self.done = d["done"]
    return StepResult(d["observation"], d["terminated"], d["truncated"], d["reward"], d["info"])

  def state(self) -> dict:
    return self.client._call("GET", f"/v1/episodes/{self.id}")

  def close(self) -> None:
    self.client._call("DELETE", f"/v1/episodes/{self.id}")


class RemoteEnv(base.Env):
  """An `Env` whose episodes run on the server: each `reset(seed)` opens a new one."""

  def __init__(self, client: SimClient, world: World | dict, **options: Any):
    super().__init__()
    self.client, self.world, self.options = client, world, options
    d = world.to_dict() if isinstance(world, World) else world
    self.domain = d["domain"]  # type: ignore[misc]
    self.episode: RemoteEpisode | None = None
    self.last: StepResult | None = None

  def reset(self, seed: int) -> str:
    self.close()
    self.steps = 0
    self.episode = self.client.create(self.world, seed=seed, **self.options)
    w = self.episode.world
    return self._ready(w["task"], w["action_space"], w["initial_state"])

  def step(self, action: str) -> str:
    return self.step_result(action).observation

  def step_result(self, action: str) -> StepResult:
    if self.episode is None:
      raise RuntimeError("call reset(seed) before step()")
    self.last = self.episode.step(action)
    self.steps += 1
    return self.last

  def close(self) -> None:
    if self.episode is not None:
      try:
        self.episode.close()
      except (SimServerError, httpx.HTTPError):
        pass  # already closed on the server, or the server is gone: nothing left to free
      self.episode = None
