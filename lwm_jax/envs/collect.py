"""Parallel, deterministic collection of scripted-agent episodes from a real environment.

Episode `i` of a run with base seed `S` always uses seed `recorder.episode_seed(S, i)` and id
`{env}-s{S}-{i:05d}`, and each episode starts from a full reset, so the output does not depend on
the number of workers or which worker ran what. Trajectories that fail data hygiene (fewer than 2
turns; an MCP or SWE call to a tool that was not declared) are not returned; they are counted. The
stats also count the distinct worlds (`meta["world"]`) of the kept episodes and those without one.

`perturb` (a spec for every episode, or a function of the episode index giving each one's spec,
"" for none) makes the environment misbehave as the perturbation catalogue says
(`lwm_jax.envs.perturb`); the trajectories record it in `simulation_instruction` and
`meta["perturb"]`, and the stats count the perturbed episodes per spec.
"""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.util  # noqa: F401  (Finalize)
import shutil
import sys
import tempfile
from typing import Any, Callable, Sequence

from lwm_jax import domains
from lwm_jax.data import schema
from lwm_jax.envs import base, perturb as perturb_lib, recorder

_WORKER_ENV: dict[tuple[str, tuple], base.Env] = {}  # (name, env options) -> env


def hygiene_problem(traj: schema.Trajectory) -> str | None:
  """Why `traj` must be dropped from a corpus, or None when it is fine."""
  if len(traj.turns) < 2:
    return "fewer than 2 turns"
  dom = domains.get_domain(traj.domain)
  return dom.load("corpus_check")(traj) if dom.corpus_check else None


def episode_id(name: str, seed: int, index: int) -> str:
  return f"{name}-s{seed}-{index:05d}"


def _work(job: tuple[str, int, int, int, str, tuple]) -> dict[str, Any]:
  name, seed, index, max_turns, spec, options = job
  env = _WORKER_ENV.get((name, options))
  if env is None:
    env = _WORKER_ENV[(name, options)] = base.make_env(name, **dict(options))
  if hasattr(env, "set_perturb"):
    env.set_perturb(spec)
  elif spec:
    raise ValueError(f"environment '{name}' implements no perturbation (asked for '{spec}')")
  traj = recorder.record(name, recorder.episode_seed(seed, index), episode_id(name, seed, index),
                         env=env, max_turns=max_turns)
  return traj.to_dict()


def record_tasks(name: str, seeds: Sequence[int], max_turns: int = 30) -> list[schema.Trajectory]:
  """The scripted agent of `name` on each task seed of `seeds` (e.g. `verify.task_seeds`), in one
  real environment, in order: demonstrations for an agent's behaviour cloning. Trajectory ids are
  `{name}-task-{seed}` and `meta["seed"]` is the task seed, so the task verifiers can judge them."""
  env = base.make_env(name)
  try:
    return [recorder.record(name, int(s), f"{name}-task-{int(s)}", env=env, max_turns=max_turns)
            for s in seeds]
  finally:
    env.close()


def _close_worker_envs() -> None:
  for env in _WORKER_ENV.values():
    env.close()
  _WORKER_ENV.clear()


def _init_worker(tmp_root: str) -> None:
  # Sandboxes of this worker live under tmp_root, which `collect` removes at the end.
  tempfile.tempdir = tmp_root
  mp.util.Finalize(None, _close_worker_envs, exitpriority=10)


def episode_specs(name: str, perturb: str | Callable[[int], str], indices: range) -> list[str]:
  """The canonical perturbation spec of each episode, checked against environment `name`
  (ValueError naming the episode and the perturbation the environment does not implement)."""
  out = []
  for i in indices:
    spec = perturb(i) if callable(perturb) else perturb
    try:
      perts = perturb_lib.parse(spec or "")
      perturb_lib.real_options(perts, name)
    except (ValueError, NotImplementedError) as e:
      raise ValueError(f"--perturb for '{name}' (episode {i}): {e}") from None
    out.append(perturb_lib.spec_of(perts))
  return out


def collect(name: str, episodes: int, seed: int = 0, workers: int = 2, max_turns: int = 30,
            progress: bool = True, start: int = 0, perturb: str | Callable[[int], str] = "",
            env_options: dict[str, Any] | None = None
            ) -> tuple[list[schema.Trajectory], dict[str, Any]]:
  """Plays episodes `start .. start+episodes-1`; returns (kept trajectories in order, stats).
  `env_options` are keyword arguments of the environment's constructor (e.g. the terminal's
  `names="made_up"`); one that it does not take is a ValueError before any episode runs."""
  domains.get_domain(name)  # ValueError naming the registered domains for an unknown one
  options = tuple(sorted((env_options or {}).items()))
  if options:  # a bad option fails here, before any episode, with its reason
    try:
      base.make_env(name, **dict(options)).close()
    except TypeError as e:
      raise ValueError(f"environment '{name}' options {dict(options)}: {e}") from None
  indices = range(start, start + episodes)
  jobs = [(name, seed, i, max_turns, spec, options)
          for i, spec in zip(indices, episode_specs(name, perturb, indices))]
  bar = None
  if progress:
    from tqdm import tqdm
    bar = tqdm(total=len(jobs), desc=f"collect {name}", unit="ep", file=sys.stderr)
  results: list[dict[str, Any]] = []
  if workers <= 1:
    try:
      for j in jobs:
        results.append(_work(j))
        if bar:
          bar.update()
    finally:
      _close_worker_envs()
  else:
    ctx = mp.get_context("fork")
    tmp_root = tempfile.mkdtemp(prefix="lwm_collect_")
    pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tmp_root,))
    try:
      for r in pool.imap(_work, jobs, chunksize=1):
        results.append(r)
        if bar:
          bar.update()
      pool.close()  # workers exit normally and run their finalizer (closing servers, sandboxes)
    except BaseException:
      pool.terminate()
      raise
    finally:
      pool.join()
      shutil.rmtree(tmp_root, ignore_errors=True)
  if bar:
    bar.close()
  kept, dropped = [], {}
  for d in results:
    t = schema.Trajectory.from_dict(d)
    why = hygiene_problem(t)
    if why is None:
      kept.append(t)
    else:
      dropped[t.id] = why
  turns = [len(t.turns) for t in kept]
  worlds = [t.meta.get("world") for t in kept]
  stats = {"env": name, "episodes": episodes, "kept": len(kept), "dropped": dropped,
           "worlds": len({w for w in worlds if w}), "without_world": sum(not w for w in worlds),
           "turns_min": min(turns, default=0), "turns_max": max(turns, default=0),
           "turns_mean": round(sum(turns) / max(1, len(turns)), 2)}
  perturbed: dict[str, int] = {}
  for t in kept:
    if t.meta.get("perturb"):
      perturbed[t.meta["perturb"]] = perturbed.get(t.meta["perturb"], 0) + 1
  if perturbed:
    stats["perturbed"] = dict(sorted(perturbed.items()))
  return kept, stats
