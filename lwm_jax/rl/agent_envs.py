"""Where agent episodes run: environments in this process or in a pool of worker processes.

Both hold episodes by id and answer the same four calls, so the episode runner
(`lwm_jax.rl.agent_episodes`) has one code path for every arm:

  open([(eid, seed)])      -> [EnvInfo]   makes and resets one env per episode
  step([(eid, action)])    -> [str]       one action per live episode; an env that raises gives
                                          the error as the observation (never a crash)
  verdict([(eid, turns)])  -> [Verdict]   the task verifier on the finished episode
  close([eid])                            releases the episodes' envs

`LocalEnvs(make_env)` keeps the envs here; when they are `SimulatedEnv`s, one `step` call is one
`sim.env.step_many` (the world model generates for all live episodes at once). A real env is
judged by `verify.check` (its real state), a simulated one by `verify_transcript.check_transcript`
(the transcript, with the world and goal of its seed re-created by a real env).
`ProcessEnvs(domain, workers)` runs real envs of `domain` in `workers` processes (episode `eid`
lives in worker `eid % workers`); each worker is a `LocalEnvs` and serves requests in order, and
the workers step in parallel.
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import traceback
from typing import Any, Callable, Sequence

from lwm_jax.envs import base
from lwm_jax.envs import verify as verify_lib
from lwm_jax.envs import verify_transcript

SIM_MODULE = "lwm_jax.sim.env"  # imported only where simulated envs exist (not in the workers)

Verdict = verify_lib.Verdict
Verifier = Callable[[base.Env, int, list], Verdict]


def is_simulated(env: base.Env) -> bool:
  """Whether `env` is a `SimulatedEnv` (without importing the simulator where none can exist)."""
  mod = sys.modules.get(SIM_MODULE)
  return mod is not None and isinstance(env, mod.SimulatedEnv)


def default_verdict(env: base.Env, seed: int, turns: list) -> Verdict:
  """Real env: its state now (`verify.check`); simulated: the transcript (`check_transcript`)."""
  if is_simulated(env):
    return verify_transcript.check_transcript(env.domain, seed, turns)
  return verify_lib.check(env, turns)


def safe_step(env: base.Env, action: str) -> str:
  """`env.step(action)`, or the exception's text as the observation."""
  try:
    return env.step(action)
  except Exception as e:  # pylint: disable=broad-except
    return f"error: {type(e).__name__}: {e}"


class LocalEnvs:
  """Envs in this process: `make_env(seed)` returns a fresh (not yet reset) env for a task."""

  def __init__(self, make_env: Callable[[int], base.Env], verifier: Verifier | None = None):
    self.make_env = make_env
    self.verifier = verifier or default_verdict
    self.envs: dict[int, base.Env] = {}
    self.seeds: dict[int, int] = {}

  def open(self, keys: Sequence[tuple[int, int]]) -> list[base.EnvInfo]:
    out = []
    for eid, seed in keys:
      env = self.make_env(seed)
      env.reset(seed)
      self.envs[eid], self.seeds[eid] = env, seed
      out.append(env.describe())
    return out

  def step(self, pairs: Sequence[tuple[int, str]]) -> list[str]:
    envs = [self.envs[eid] for eid, _ in pairs]
    out: list[str] = [""] * len(pairs)
    sims = []
    for i, e in enumerate(envs):
      if is_simulated(e):
        if e.done:  # the world took an earlier action as its own finish (e.g. `submit`)
          out[i] = "error: the episode is over; answer finish()"
        else:
          sims.append(i)
    if sims:  # one world-model call for all simulated episodes
      step_many = sys.modules[SIM_MODULE].step_many
      results = step_many([envs[i] for i in sims], [pairs[i][1] for i in sims])
      for i, r in zip(sims, results):
        out[i] = r.observation
    for i, (eid, action) in enumerate(pairs):
      if not is_simulated(envs[i]):
        out[i] = safe_step(envs[i], action)
    return out

  def verdict(self, items: Sequence[tuple[int, list]]) -> list[Verdict]:
    out = []
    for eid, turns in items:
      try:
        out.append(self.verifier(self.envs[eid], self.seeds[eid], turns))
      except Exception as e:  # pylint: disable=broad-except
        out.append(Verdict(False, 0.0, f"verifier error: {type(e).__name__}: {e}"))
    return out

  def close(self, eids: Sequence[int]) -> None:
    for eid in eids:
      env = self.envs.pop(eid, None)
      self.seeds.pop(eid, None)
      if env is not None:
        try:
          env.close()
        except Exception:  # pylint: disable=broad-except
          pass

  def shutdown(self) -> None:
    self.close(list(self.envs))


def _real_env(domain: str) -> Callable[[int], base.Env]:
  return lambda seed: base.make_env(domain)


def _worker(conn: Any, domain: str) -> None:
  envs = LocalEnvs(_real_env(domain))
  while True:
    try:
      msg = conn.recv()
    except EOFError:
      break
    if msg is None:
      break
    op, args = msg
    try:
      if op == "close":
        envs.close([eid for eid, _ in args])
        conn.send(("ok", [None] * len(args)))
      else:
        conn.send(("ok", getattr(envs, op)(args)))
    except Exception:  # pylint: disable=broad-except
      conn.send(("error", traceback.format_exc()))
  envs.shutdown()


class ProcessEnvs:
  """Real envs of `domain` in `workers` worker processes (see the module docstring)."""

  def __init__(self, domain: str, workers: int = 2, timeout_s: float = 600.0):
    self.timeout_s = timeout_s  # per request: a worker that does not answer in time is an error
    if workers < 1:
      raise ValueError(f"workers: must be >= 1, got {workers}")
    base.env_module(domain)  # an unknown domain fails here, not in a worker
    ctx = mp.get_context("spawn")  # no fork of a process that runs JAX
    self.domain, self.conns, self.procs = domain, [], []
    for _ in range(workers):
      parent, child = ctx.Pipe()
      p = ctx.Process(target=_worker, args=(child, domain), daemon=True)
      p.start()
      child.close()
      self.conns.append(parent)
      self.procs.append(p)

  def _call(self, op: str, items: Sequence[tuple[int, Any]]) -> list[Any]:
    n = len(self.conns)
    parts: list[list[int]] = [[] for _ in range(n)]
    for i, (eid, _) in enumerate(items):
      parts[eid % n].append(i)
    for w, idx in enumerate(parts):  # send to every worker first: they run in parallel
      if idx:
        try:
          self.conns[w].send((op, [items[i] for i in idx]))
        except OSError:  # a broken pipe: the worker is gone
          raise self._died(w) from None
    out: list[Any] = [None] * len(items)
    for w, idx in enumerate(parts):
      if not idx:
        continue
      if not self.conns[w].poll(self.timeout_s):
        raise RuntimeError(f"{self.domain} env worker {w} gave no answer to {op} within "
                           f"{self.timeout_s:.0f} s")
      try:
        status, value = self.conns[w].recv()
      except (EOFError, OSError):
        raise self._died(w) from None
      if status != "ok":
        raise RuntimeError(f"{self.domain} env worker {w} failed in {op}:\n{value}")
      for i, v in zip(idx, value):
        out[i] = v
    return out

  def _died(self, w: int) -> RuntimeError:
    self.procs[w].join(timeout=1)
    return RuntimeError(f"{self.domain} env worker {w} died (exit code {self.procs[w].exitcode}); "
                        "its episodes are lost")

  def open(self, keys: Sequence[tuple[int, int]]) -> list[base.EnvInfo]:
    return self._call("open", keys)

  def step(self, pairs: Sequence[tuple[int, str]]) -> list[str]:
    return self._call("step", pairs)

  def verdict(self, items: Sequence[tuple[int, list]]) -> list[Verdict]:
    return self._call("verdict", items)

  def close(self, eids: Sequence[int]) -> None:
    self._call("close", [(e, None) for e in eids])

  def shutdown(self) -> None:
    for c, p in zip(self.conns, self.procs):
      try:
        c.send(None)
      except (OSError, BrokenPipeError):
        pass
      p.join(timeout=10)
      if p.is_alive():
        p.terminate()
    self.conns, self.procs = [], []


def simulated_env_factory(sampler: Any, domain: str, max_turns: int, params: Any = None,
                          loop_guard: str = "off") -> Callable[[int], base.Env]:
  """`make_env(seed)` for the Sim arm: a `SimulatedEnv` of `sampler` (the world model) whose world
  (task, action space, initial state, goal) is that of the real `domain` env's task `seed` (the
  real env is only reset, never stepped), with the simulator's `loop_guard`."""
  from lwm_jax.sim import env as sim_env  # pylint: disable=import-outside-toplevel
  real = base.make_env(domain)

  def make(seed: int) -> base.Env:
    world = sim_env.World.from_env(real, seed)
    return sim_env.SimulatedEnv(sampler, world, max_turns=max_turns + 1, params=params,
                                loop_guard=loop_guard)
  return make
