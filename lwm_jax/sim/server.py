"""An HTTP environment server over a world model (FastAPI): simulated episodes for any agent.

Endpoints (JSON in and out):

- `GET /health`; `GET /v1/perturbations`: the perturbation catalogue.
- `POST /v1/episodes`: a new episode. The world is one of `world` (the fields of
  `lwm_jax.sim.env.World`), `trajectory` (a trajectory record; its turns are ignored),
  `trajectory_file` (a JSONL file of trajectories on the server's disk, under its
  `trajectory_root`, default the working directory; with `trajectory_id` or `index`, default 0)
  or `task` (`{"domain", "seed"}`: the bundled real environment's episode at that seed, e.g. a
  held-out agent task of `lwm_jax.envs.verify.task_seeds`). A `task` episode has a reward: when
  it ends, its simulated transcript is judged by the domain's task verifier
  (`verify_transcript.check_transcript`, the rule Sim RL uses): the last step's reward is the
  verdict's credit and its `info["verdict"]` holds success, credit and reason (a verifier that
  fails gives credit 0 and its error as the reason). Optional: `seed` (0), `perturb` (a spec
  such as `errors:rate=0.2,kind=timeout`, added to the simulation instruction), `max_turns`,
  `variant` (system prompt template), `temperature`, `max_tokens`, `sampling_seed`,
  `loop_guard` (off, cut or resample: `SimulatedEnv`'s guard against observations that repeat
  themselves, reported in each step's `info["loop_guard"]`). Answers
  `{"episode_id", "observation", "world"}`.
- `POST /v1/episodes/{id}/step` with `{"action": "..."}`: answers `{"observation", "done",
  "terminated", "truncated", "reward", "info"}` (see `StepResult`).
- `GET /v1/episodes/{id}`: the episode so far (its trajectory, done). `DELETE /v1/episodes/{id}`:
  closes it.

Errors are JSON `{"error": {"message", "type"}}`: 400 for a malformed body or a bad field (named),
404 for an unknown episode, 409 for a step after the episode ended or while another step of it
runs, 429 when `max_episodes` are open; the server keeps serving. Steps of all episodes go to one
`Batcher` (the sampling server's): steps that arrive within `window_ms` of each other are decoded
as one batch on the one engine.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from lwm_jax.data import schema
from lwm_jax.envs import base as envs_base
from lwm_jax.envs import verify_transcript
from lwm_jax.envs.verify import Verdict
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import RowRequest, Sampler
from lwm_jax.sampling.server import Batcher
from lwm_jax.sim import perturb as perturb_lib
from lwm_jax.sim.env import SimulatedEnv, StepResult, World, guard_loops

_KINDS = {400: "invalid_request_error", 404: "not_found_error", 409: "conflict_error",
          429: "rate_limit_error"}
_CREATE_FIELDS = {"world", "trajectory", "trajectory_file", "task", "trajectory_id", "index",
                  "seed", "perturb", "max_turns", "variant", "temperature", "max_tokens",
                  "sampling_seed", "loop_guard"}


class HttpError(Exception):
  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


def _error(status: int, message: str) -> JSONResponse:
  return JSONResponse(status_code=status, content={"error": {
      "message": message, "type": _KINDS.get(status, "server_error")}})


def _field(body: dict, name: str, kind: type, default: Any) -> Any:
  v = body.get(name, default)
  if v is default:
    return v
  if kind is float and isinstance(v, int) and not isinstance(v, bool):
    v = float(v)
  if isinstance(v, bool) or not isinstance(v, kind):
    raise HttpError(400, f"{name}: expected {kind.__name__}, got {json.dumps(v)[:40]}")
  return v


def _load_body(raw: bytes) -> dict:
  try:
    body = json.loads(raw or b"null")
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise HttpError(400, f"body: not valid JSON ({e})") from None
  except RecursionError:
    raise HttpError(400, "body: JSON nested too deeply") from None
  if not isinstance(body, dict):
    raise HttpError(400, f"body: expected a JSON object, got {type(body).__name__}")
  return body


def _inside(root: str, path: str) -> str:
  """`path` (relative to `root`) resolved; HttpError when it leads outside `root`."""
  full = os.path.realpath(os.path.join(root, path))
  if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
    raise HttpError(400, f"trajectory_file: {path} is outside the server's trajectory root")
  return full


def _task(body: dict) -> tuple[str, int]:
  """(domain, seed) of a create request's `task`, checked field by field."""
  t = body["task"]
  if not isinstance(t, dict) or set(t) != {"domain", "seed"}:
    raise HttpError(400, 'task: expected {"domain": ..., "seed": ...}')
  domain, seed = t["domain"], t["seed"]
  known = verify_transcript.verified_domains()
  if domain not in known:
    raise HttpError(400, f"task.domain: '{domain}' has no task verifier (expected one of "
                    f"{', '.join(known)})")
  if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
    raise HttpError(400, f"task.seed: expected a non-negative integer, got {seed!r}")
  return domain, seed


def _task_world(domain: str, seed: int) -> World:
  """The real environment's episode `seed` as a world (its goal kept for the verifier)."""
  env = envs_base.make_env(domain)
  try:
    return World.from_env(env, seed)
  finally:
    env.close()


def task_verifier(domain: str, seed: int) -> Callable[[schema.Trajectory], Verdict]:
  """The verdict on a `task` episode: the domain's transcript verifier on its simulated turns."""
  def verdict(traj: schema.Trajectory) -> Verdict:
    try:
      return verify_transcript.check_transcript(domain, seed, traj.turns)
    except Exception as e:  # noqa: BLE001 - the episode gets no credit, the server stays up
      return Verdict(False, 0.0, f"verifier error: {type(e).__name__}: {e}")
  return verdict


def world_from_request(body: dict, trajectory_root: str = ".") -> World:
  """The episode's world from a create request (see the module docstring)."""
  given = [k for k in ("world", "trajectory", "trajectory_file", "task") if k in body]
  if len(given) != 1:
    raise HttpError(400, "give exactly one of world, trajectory, trajectory_file, task"
                    + (f" (got {', '.join(given)})" if given else ""))
  try:
    if "task" in body:
      return _task_world(*_task(body))
    if "world" in body:
      return World.from_dict(body["world"])
    if "trajectory" in body:
      t = body["trajectory"]
      if isinstance(t, dict) and not t.get("turns"):
        t = dict(t, turns=[{"action": "", "observation": ""}])  # a world needs no turns
      return World.from_trajectory(schema.Trajectory.from_dict(t))
    path = _field(body, "trajectory_file", str, None)
    full = _inside(os.path.realpath(trajectory_root), path)
    want_id = _field(body, "trajectory_id", str, None)
    index = _field(body, "index", int, 0)
    for i, traj in enumerate(schema.read_jsonl(full)):
      if (want_id is not None and traj.id == want_id) or (want_id is None and i == index):
        return World.from_trajectory(traj)
    which = f"id '{want_id}'" if want_id is not None else f"index {index}"
    raise HttpError(400, f"trajectory_file: {path} has no trajectory with {which}")
  except (ValueError, OSError, TypeError) as e:  # RecordError is a ValueError
    where = "trajectory" if "trajectory" in body else ""
    raise HttpError(400, f"{where + ': ' if where else ''}{e}") from None


class _Episode:
  def __init__(self, env: SimulatedEnv):
    self.env, self.busy = env, False


def create_app(sampler: Sampler, *, max_batch: int = 32, window_ms: float = 20.0,
               max_tokens: int = 256, max_turns: int = 50, max_episodes: int = 1024,
               trajectory_root: str | None = None) -> FastAPI:
  """The app; `max_tokens` and `max_turns` are the defaults a create request may override;
  `trajectory_file`s are read under `trajectory_root` only (default: the working directory)."""
  root = os.path.realpath(trajectory_root or os.getcwd())
  batcher = Batcher(sampler, max_batch=max_batch, window_ms=window_ms)
  episodes: dict[str, _Episode] = {}

  @contextlib.asynccontextmanager
  async def lifespan(_app):
    yield
    batcher.close()

  app = FastAPI(title="lwm_jax simulated environments", lifespan=lifespan)
  app.state.batcher, app.state.episodes = batcher, episodes

  @app.exception_handler(HttpError)
  async def _http_error(_request: Request, e: HttpError):
    return _error(e.status, str(e))

  def episode(eid: str) -> _Episode:
    ep = episodes.get(eid)
    if ep is None:
      raise HttpError(404, f"episode '{eid}': no such episode (closed or never created)")
    return ep

  @app.get("/health")
  async def health():
    return {"status": "ok", "episodes": len(episodes), "batches": batcher.batches}

  @app.get("/v1/perturbations")
  async def perturbations():
    return {"perturbations": [
        {"name": k.name, "help": k.help, "params": [
            {"name": p.name, "type": p.kind.__name__, "default": p.default, "help": p.help}
            for p in k.params]} for k in perturb_lib.CATALOGUE.values()]}

  @app.post("/v1/episodes")
  async def create(request: Request):
    body = _load_body(await request.body())
    unknown = sorted(set(body) - _CREATE_FIELDS)
    if unknown:
      raise HttpError(400, f"{unknown[0]}: unknown field (known: {', '.join(sorted(_CREATE_FIELDS))})")
    if len(episodes) >= max_episodes:
      raise HttpError(429, f"{max_episodes} episodes are open; close some first")
    world = await asyncio.to_thread(world_from_request, body, root)
    spec = _field(body, "perturb", str, "")
    try:
      world = perturb_lib.apply(world, spec)
      params = SamplingParams(temperature=_field(body, "temperature", float, 0.0),
                              max_new_tokens=_field(body, "max_tokens", int, max_tokens),
                              seed=_field(body, "sampling_seed", int, 0)).validate()
      env = SimulatedEnv(sampler, world, params=params,
                         max_turns=_field(body, "max_turns", int, max_turns),
                         variant=_field(body, "variant", int, 0),
                         verifier=task_verifier(*_task(body)) if "task" in body else None,
                         loop_guard=_field(body, "loop_guard", str, "off"))
      obs = env.reset(_field(body, "seed", int, 0))
    except (ValueError, TypeError) as e:
      raise HttpError(400, str(e)) from None
    eid = "ep-" + uuid.uuid4().hex[:16]
    episodes[eid] = _Episode(env)
    return {"episode_id": eid, "observation": obs, "world": world.to_dict()}

  @app.get("/v1/episodes/{eid}")
  async def show(eid: str):
    env = episode(eid).env
    return {"episode_id": eid, "done": env.done, "turns": len(env.turns),
            "trajectory": env.trajectory(eid).to_dict()}

  @app.delete("/v1/episodes/{eid}")
  async def close(eid: str):
    ep = episode(eid)
    if ep.busy:
      raise HttpError(409, f"episode '{eid}': a step is running; close it after that")
    episodes.pop(eid).env.close()
    return {"episode_id": eid, "closed": True}

  @app.post("/v1/episodes/{eid}/step")
  async def step(eid: str, request: Request):
    ep = episode(eid)
    body = _load_body(await request.body())
    action = body.get("action")
    if not isinstance(action, str):
      raise HttpError(400, "action: expected a string" + ("" if "action" in body else
                                                           " (missing)"))
    if ep.busy:
      raise HttpError(409, f"episode '{eid}': another step of this episode is running")
    env = ep.env
    if env.done:
      raise HttpError(409, f"episode '{eid}' is over ({len(env.turns)} turns); create a new one")
    ep.busy = True
    try:
      result = await _step(env, action)
    finally:
      ep.busy = False
    return _result_json(result)

  async def _step(env: SimulatedEnv, action: str) -> StepResult:
    try:
      env.check_step(action)
    except ValueError as e:
      raise HttpError(400, str(e)) from None
    if env.world.is_finish(action):
      return await _record(env, action, None, 0.0)
    t0 = time.perf_counter()
    try:
      ids, thinking = await asyncio.to_thread(sampler.prepare, env.messages_for(action))
    except ValueError as e:  # e.g. the history no longer fits the model's context
      raise HttpError(400, f"episode: {e}") from None
    params = env.params_for_turn()
    gen = await _generate(ids, params, thinking)
    loops: list[Any] = [None]
    if env.loop_guard != "off":  # step_many's guard, its redraws going through the batcher
      try:
        gens, loops = await asyncio.to_thread(guard_loops, _Redraw(ids, thinking), [env.loop_guard],
                                              [ids], [params], [gen])
      except Exception as e:  # noqa: BLE001 - this step fails, the server and episode stay
        raise HttpError(500, f"generation failed: {e}") from None
      gen = gens[0]
    return await _record(env, action, gen, time.perf_counter() - t0, loops[0])

  class _Redraw:
    """`guard_loops`'s sampler: each redraw of one episode's prompt is a batcher submission
    (called from a worker thread, so it may wait on the result)."""

    def __init__(self, ids: Any, thinking: Any):
      self.ids, self.thinking = ids, thinking

    def generate(self, chats: Any, params: list[SamplingParams]) -> list[Any]:
      return batcher.submit([RowRequest(self.ids, p, 0, None, self.thinking)
                             for p in params]).result()

  async def _generate(ids: Any, params: SamplingParams, thinking: Any) -> Any:
    try:
      gens = await asyncio.wrap_future(batcher.submit([RowRequest(ids, params, 0, None, thinking)]))
    except Exception as e:  # noqa: BLE001 - this step fails, the server and episode stay
      raise HttpError(500, f"generation failed: {e}") from None
    return gens[0]

  async def _record(env: SimulatedEnv, action: str, gen: Any, latency: float,
                    loop: dict | None = None) -> StepResult:
    # off the event loop: the episode's last step may run its task verifier (a real env reset)
    return await asyncio.to_thread(env.record, action, gen, latency, loop)

  return app


def _result_json(r: StepResult) -> dict:
  return {"observation": r.observation, "done": r.done, "terminated": r.terminated,
          "truncated": r.truncated, "reward": r.reward, "info": r.info}
