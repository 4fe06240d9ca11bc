"""The environment API shared by all seven domains, and the scripted-agent interface.

An environment runs for real on this machine (a bash session, an MCP server, an HTTP app, ...):
`reset(seed)` builds a fresh seeded world and returns its initial state as text, `step(action)`
executes one action and returns the observation text (errors are observations), `describe()` gives
the task, action space and initial state for a system prompt, and `close()` frees what it holds.
Volatile values (clock, PIDs, temp paths, ports, timings) are normalised at the source so that an
episode is the same bytes for the same seed.
"""
from __future__ import annotations

import abc
import ast
import dataclasses
import hashlib
import importlib
import json
import numbers
import os
import random
import re
import shutil
import tempfile
from typing import Any, ClassVar

from lwm_jax import domains

# Fixed wall clock of every sandbox: 2024-06-01 09:00:00 UTC. Each step advances it by a minute.
FIXED_EPOCH = 1717232400
STEP_SECONDS = 60


@dataclasses.dataclass
class EnvInfo:
  """What a system prompt needs to know about the world of one episode."""
  task: str
  action_space: str
  initial_state: str


class Env(abc.ABC):
  """A real environment. Subclasses set `domain` and implement reset/step/describe."""
  domain: ClassVar[str] = ""
  # Observations longer than this are cut, with a note saying how much was left out.
  max_obs_chars: ClassVar[int] = 3000

  def __init__(self) -> None:
    self.goal: dict[str, Any] = {}   # structured task spec, read by the scripted agent
    self.steps = 0
    self._info: EnvInfo | None = None  # set by reset() of environments that use the default describe
    self.sandbox = ""  # the episode's throwaway directory, for envs that keep files
    self.root_parent: str | None = None  # where such directories are made (None: the system temp)
    self.world_id = ""  # id of the generated world of the current episode (see `_set_world`)
    # What the environment itself reported about the last step: "" when the action went through,
    # else a short reason in the environment's own terms (an exit status, a JSON-RPC error code,
    # an HTTP status, a refused action). Every step() sets it; the recorder keeps it per turn.
    self.step_error = ""

  # -- the parts every reset() shares ----------------------------------------------------------
  def _begin(self, seed: int, close: bool = True) -> random.Random:
    """Starts an episode: ends the previous one (`close()`, unless the env keeps its servers
    across episodes), zeroes the step count and returns the episode's seeded generator."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
      # a float or string seed would draw a world that no integer seed names again
      raise ValueError(f"{self.domain} reset: seed must be an integer, got {seed!r}")
    if close:
      self.close()
    self.steps = 0
    self.step_error = ""
    return random.Random(seed * 7 + 1)

  def _set_goal(self, tasks: dict[str, str], goal: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Makes `goal` the episode's goal, with its task text `tasks[goal["kind"]]` filled in from
    the goal's fields and `extra`."""
    goal["text"] = tasks[goal["kind"]].format(**goal, **extra)
    self.goal = goal
    return goal

  def _set_world(self, world: Any) -> str:
    """Records the episode's generated world (a JSON-serialisable description of everything the
    world's seed decided: files, rows, documents, settings) and returns its id, `world_id`."""
    self.world_id = world_id(self.domain, world)
    return self.world_id

  def _ready(self, task: str, action_space: str, initial_state: str) -> str:
    """Ends reset(): records what describe() returns and gives back the initial state."""
    self._info = EnvInfo(task=task, action_space=action_space, initial_state=initial_state)
    return initial_state

  def _make_dir(self, prefix: str) -> str:
    """A fresh episode directory (also kept in `self.sandbox`; `_remove_dir` deletes it)."""
    self.sandbox = tempfile.mkdtemp(prefix=prefix, dir=self.root_parent)
    return self.sandbox

  def _remove_dir(self) -> None:
    if self.sandbox and os.path.isdir(self.sandbox):
      shutil.rmtree(self.sandbox, ignore_errors=True)
    self.sandbox = ""

  @abc.abstractmethod
  def reset(self, seed: int) -> str:
    """Starts a fresh episode for `seed`; returns the initial state text."""

  @abc.abstractmethod
  def step(self, action: str) -> str:
    """Executes one action; returns the observation (an error is an observation too)."""

  def describe(self) -> EnvInfo:
    """Task, action space and initial state of the current episode (what reset() recorded)."""
    if self._info is None:
      raise RuntimeError("call reset(seed) before describe()")
    return self._info

  def screen_state(self, observation: str) -> str:
    """The part of an observation that is world state (GUI envs drop clocks); used by hygiene."""
    return observation

  def state_digest(self) -> str | None:
    """A digest of the world state an action can change (files, rows, app state), equal before
    and after a step exactly when the step changed none of it; None when the environment cannot
    tell (then the recorder records no "changed" fact)."""
    return None

  def episode_meta(self) -> dict[str, Any]:
    """Extra facts about the episode for `Trajectory.meta` (e.g. what was normalised)."""
    return {}

  def close(self) -> None:
    """Releases processes, servers and sandboxes. Safe to call twice."""

  def __enter__(self) -> "Env":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


class Agent(abc.ABC):
  """A scripted agent: goal-directed heuristics mixed with seeded exploration and mistakes."""

  def __init__(self, rng: random.Random) -> None:
    self.rng = rng

  @abc.abstractmethod
  def begin(self, env: Env, initial_state: str) -> None:
    """Plans the episode from the env's goal and the initial state."""

  @abc.abstractmethod
  def act(self, observation: str) -> str | None:
    """The next action given the last observation, or None to end the episode."""


class PlanAgent(Agent):
  """A scripted agent that works through a plan of steps made when the episode begins.

  `make_plan` returns the steps. A step that is a string is the action itself; a callable is
  called with the last observation and returns the action; any other step (a tuple naming what to
  do) is resolved against the last observation by `resolve`. Both may return None to skip the
  step (what it needs is not on screen) and may put steps back at the front of `self.plan`, e.g.
  to page on until something shows up.
  """

  def begin(self, env: Env, initial_state: str) -> None:
    self.plan: list[Any] = self.make_plan(env, initial_state)

  @abc.abstractmethod
  def make_plan(self, env: Env, initial_state: str) -> list[Any]:
    """The episode's steps, drawn from the env's goal and `self.rng`."""

  def resolve(self, step: Any, observation: str) -> str | None:
    """The action for a non-string step given the last observation (None: skip it)."""
    raise ValueError(f"{type(self).__name__} cannot resolve plan step {step!r}")

  def act(self, observation: str) -> str | None:
    while self.plan:
      step = self.plan.pop(0)
      if isinstance(step, str):
        action = step
      elif callable(step):
        action = step(observation)
      else:
        action = self.resolve(step, observation)
      if action is not None:
        return action
    return None


def canonical_digest(value: Any, chars: int = 12) -> str:
  """The first `chars` hex digits of the sha256 of `value`'s canonical JSON (sorted keys)."""
  blob = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
  return hashlib.sha256(blob.encode()).hexdigest()[:chars]


def world_id(domain: str, world: Any) -> str:
  """`{domain}-{12 hex}`: a hash of the world's canonical JSON, equal for equal worlds. Corpus
  splits are drawn by this id, so no world of the test split is seen in training."""
  return f"{domain}-{canonical_digest(world)}"


def first_hit(observation: str, path_pattern: str) -> tuple[str, int] | None:
  """(path, line) of the first grep-style `path:line:` hit whose path matches `path_pattern`."""
  m = re.search(rf"^({path_pattern}):(\d+):", observation, re.M)
  return (m.group(1), int(m.group(2))) if m else None


def truncate(text: str, limit: int) -> str:
  """Cuts `text` to `limit` characters on a line boundary and says how much was cut."""
  if len(text) <= limit:
    return text
  cut = text.rfind("\n", 0, limit)
  if cut < limit // 2:
    cut = limit
  rest = text[cut:].count("\n")
  return text[:cut].rstrip("\n") + f"\n... [output truncated: {rest} more lines]"


def parse_call(action: str, signatures: dict[str, tuple[str, ...]]) -> tuple[str, dict[str, Any]]:
  """Parses `name(arg, key=value)` with literal arguments against `signatures` (name -> params).

  Returns (name, kwargs); raises ValueError with the reason a tool would give.
  """
  try:
    node = ast.parse(action.strip(), mode="eval").body
  except SyntaxError as e:
    raise ValueError(f"cannot parse action: {e.msg}") from None
  if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
    raise ValueError("expected a call such as " + ", ".join(f"{n}(...)" for n in signatures))
  name = node.func.id
  if name not in signatures:
    raise ValueError(f"unknown action '{name}' (available: {', '.join(signatures)})")
  params = signatures[name]
  if len(node.args) > len(params):
    raise ValueError(f"{name}() takes at most {len(params)} arguments ({len(node.args)} given)")
  kwargs: dict[str, Any] = {}
  try:
    for i, a in enumerate(node.args):
      kwargs[params[i]] = ast.literal_eval(a)
    for kw in node.keywords:
      if kw.arg not in params:
        raise ValueError(f"{name}() got an unexpected argument '{kw.arg}'")
      kwargs[kw.arg] = ast.literal_eval(kw.value)
  except ValueError as e:
    msg = str(e)
    raise ValueError(msg if "unexpected" in msg else f"{name}(): arguments must be literals") from None
  return name, kwargs


# The environments are the domain registry's (`lwm_jax.domains`): each record names its env class,
# scripted agent and world generator, imported lazily so one env needs no other's dependencies.


def env_names() -> tuple[str, ...]:
  """The names of every registered domain (each has a real environment)."""
  return domains.names()


def env_module(name: str) -> Any:
  """The module of environment `name`; it also exposes the `generate_world(seed)` its reset uses."""
  return importlib.import_module(domains.get_domain(name).env.partition(":")[0])


def generate_world(name: str, seed: int) -> Any:
  """The seeded world of domain `name` (its record's `world` generator)."""
  return domains.get_domain(name).load("world")(seed)


def make_env(name: str, **kwargs: Any) -> Env:
  """Builds the environment of the domain registered as `name`."""
  return domains.get_domain(name).load("env")(**kwargs)


def make_agent(name: str, rng: random.Random) -> Agent:
  """Builds the scripted agent of the domain registered as `name`."""
  return domains.get_domain(name).load("agent")(rng)
