"""A world model as an environment: the same reset/step/describe/close API as `lwm_jax.envs`.

`SimulatedEnv` is a `base.Env`. It keeps the episode's history and, at each step, asks the LWM for
the next observation given the system prompt (task, action space, initial state, demonstrations,
simulation instruction) and everything so far, exactly as a benchmark record would show it.

Two ways to step:

- `step(action) -> str`, the Env contract: the observation only.
- `step_result(action) -> StepResult(observation, done, reward, info)`: the episode's state too.
  `done` is `terminated or truncated`: `terminated` when the action is one of the world's finish
  actions (`World.finish_actions`; the world model is not asked, the observation is empty),
  `truncated` when the turn limit (`max_turns`) is reached. `reward` is 0 until the episode ends,
  then the optional `verifier(trajectory)`'s value (0 without one): a number, or a task
  `Verdict` (`lwm_jax.envs.verify`) whose credit is the reward and which `info["verdict"]`
  carries (success, credit, reason). `info` carries the model's
  raw reply (thinking included), its reasoning, prompt and completion token counts, the
  generation's finish reason and the latency in seconds (of the engine call that produced it,
  shared by the episodes stepped together).

`loop_guard` handles an observation that repeats itself until the token limit (the loop rule of
`lwm_jax.eval.turn_kinds`): "off" (the default) leaves it, "cut" keeps one copy of the repeated
unit and drops the rest, "resample" first draws it again (up to `LOOP_RESAMPLES` times, at
temperature at least `LOOP_RESAMPLE_TEMPERATURE`, seeds that follow the turn's) and cuts what
still loops. Each guarded step says what happened in `info["loop_guard"]`: `looped` (the first
draw was a loop), `resamples` and `cut`.

`step_many(envs, actions)` advances many episodes with ONE engine call per sampler (agent RL runs
dozens at once); `SimulatedBatch` wraps a list of episodes that share a sampler.

Misuse raises RuntimeError with the reason: stepping before `reset`, after the episode ended, or
after `close`. A `World` comes from a trajectory, from any real environment's `describe()` after
`reset(seed)` (`World.from_env`, so every generated world can be simulated), or from a JSON dict
(`World.from_dict`, what the HTTP server takes).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import re
import time
from typing import Any, Callable, Sequence

from lwm_jax import domains
from lwm_jax.data import prompts
from lwm_jax.data.reply import parse_prediction
from lwm_jax.data.schema import Trajectory, Turn
from lwm_jax.envs import base
from lwm_jax.envs.base import EnvInfo
from lwm_jax.envs.verify import Verdict
from lwm_jax.eval import turn_kinds
from lwm_jax.sampling.params import Generation, SamplingParams
from lwm_jax.sampling.sampler import fit_chat

# Action names that end an episode: `finish(...)`, `submit(answer="...")`, a bare `done`, or the
# MCP form `{"tool": "finish", ...}`. The terminal's `exit` ends a shell session too.
FINISH_ACTIONS = ("finish", "submit", "answer", "done", "stop")

Verifier = Callable[[Trajectory], "float | Verdict"]

LOOP_GUARDS = ("off", "cut", "resample")
LOOP_RESAMPLES = 2
LOOP_RESAMPLE_TEMPERATURE = 0.7


def finish_actions_for(domain: str) -> tuple[str, ...]:
  return FINISH_ACTIONS + tuple(domains.get_domain(domain).finish_actions)


def action_name(action: str) -> str:
  """The name an action calls: `name(...)`, a bare word, or the `tool` of a JSON tool call."""
  text = action.strip()
  if text.startswith("{"):
    try:
      call = json.loads(text)
    except json.JSONDecodeError:
      return ""
    name = call.get("tool", call.get("name")) if isinstance(call, dict) else None
    return name if isinstance(name, str) else ""
  m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(?=\s|\(|$)", text)
  return m.group(1) if m else ""


@dataclasses.dataclass
class World:
  """What the simulated world is: the static parts of a system prompt, and how an episode ends."""
  domain: str
  task: str
  action_space: str
  initial_state: str
  demonstrations: str = ""
  simulation_instruction: str = ""
  finish_actions: tuple[str, ...] | None = None  # None: the domain's default (FINISH_ACTIONS)
  # The structured goal of a real env's episode (`Env.goal`), for scripted agents and verifiers;
  # never shown to the world model.
  goal: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not domains.is_domain(self.domain):
      raise ValueError(f"world.domain: unknown domain '{self.domain}' (expected one of "
                       f"{', '.join(domains.names())})")
    for f in ("task", "action_space", "initial_state", "demonstrations",
              "simulation_instruction"):
      if not isinstance(getattr(self, f), str):
        raise ValueError(f"world.{f}: must be a string, got {type(getattr(self, f)).__name__}")
      check_text(getattr(self, f), f"world.{f}")
    if not isinstance(self.goal, dict):
      raise ValueError(f"world.goal: must be an object, got {type(self.goal).__name__}")
    check_nesting(self.goal, "world.goal")
    if self.finish_actions is None:
      self.finish_actions = finish_actions_for(self.domain)
    else:
      if not isinstance(self.finish_actions, (list, tuple)):
        raise ValueError("world.finish_actions: must be a list of action names, got "
                         f"{type(self.finish_actions).__name__}")
      names = tuple(self.finish_actions)
      if not all(isinstance(n, str) and n for n in names):
        raise ValueError("world.finish_actions: must be non-empty strings")
      for n in names:
        check_text(n, "world.finish_actions")
      self.finish_actions = names

  @classmethod
  def from_trajectory(cls, traj: Trajectory) -> "World":
    return cls(traj.domain, traj.task, traj.action_space, traj.initial_state,
               traj.demonstrations, traj.simulation_instruction)

  @classmethod
  def from_info(cls, domain: str, info: EnvInfo, **kw: Any) -> "World":
    return cls(domain, info.task, info.action_space, info.initial_state, **kw)

  @classmethod
  def from_env(cls, env: base.Env, seed: int, **kw: Any) -> "World":
    """The world of a real environment's episode `seed` (calls `env.reset(seed)`), with its
    goal, so that the env's scripted agent can play the simulated episode too."""
    env.reset(seed)
    kw.setdefault("goal", copy.deepcopy(env.goal))
    return cls.from_info(env.domain, env.describe(), **kw)

  @classmethod
  def from_dict(cls, d: Any) -> "World":
    """From a JSON object with the field names above; unknown or missing fields are errors."""
    if not isinstance(d, dict):
      raise ValueError(f"world: expected a JSON object, got {type(d).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names))
    if unknown:
      raise ValueError(f"world.{unknown[0]}: unknown field (known: {', '.join(names)})")
    missing = [n for n in names[:4] if n not in d]
    if missing:
      raise ValueError(f"world.{missing[0]}: missing")
    return cls(**d)

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)  # the goal must be JSON-serialisable to travel over HTTP
    d["finish_actions"] = list(self.finish_actions or ())
    return d

  def replace(self, **kw: Any) -> "World":
    return dataclasses.replace(self, **kw)

  def is_finish(self, action: str) -> bool:
    return action_name(action) in (self.finish_actions or ())


MAX_NESTING = 64


def check_text(text: str, where: str) -> None:
  """ValueError naming `where` when `text` cannot be encoded as UTF-8 (a lone surrogate such as
  '\\ud800', which JSON allows and the tokenizer cannot take)."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    raise ValueError(f"{where}: not valid Unicode text (a lone surrogate at character "
                     f"{e.start})") from None


def check_nesting(value: Any, where: str, limit: int = MAX_NESTING) -> None:
  """ValueError when lists/objects in `value` nest deeper than `limit` (checked without
  recursion, so a 50,000-deep goal is refused rather than overflowing the stack)."""
  todo = [(value, 1)]
  while todo:
    v, depth = todo.pop()
    if isinstance(v, (dict, list, tuple)):
      if depth > limit:
        raise ValueError(f"{where}: nested deeper than {limit} levels")
      todo.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    elif isinstance(v, str):
      check_text(v, where)


@dataclasses.dataclass
class StepResult:
  """One step of a simulated episode (see the module docstring)."""
  observation: str
  terminated: bool
  truncated: bool
  reward: float
  info: dict[str, Any]

  @property
  def done(self) -> bool:
    return self.terminated or self.truncated


class SimulatedEnv(base.Env):
  """An environment whose observations come from a Language World Model (a `Sampler`)."""

  def __init__(self, sampler: Any, world: World, *, variant: int = 0,
               params: SamplingParams | None = None, max_turns: int = 50,
               verifier: Verifier | None = None, loop_guard: str = "off"):
    super().__init__()
    if loop_guard not in LOOP_GUARDS:
      raise ValueError(f"loop_guard: expected one of {', '.join(LOOP_GUARDS)}, got {loop_guard!r}")
    self.loop_guard = loop_guard
    if not isinstance(world, World):
      raise TypeError(f"world: expected a World, got {type(world).__name__}")
    if not isinstance(max_turns, int) or max_turns < 1:
      raise ValueError(f"max_turns: must be a positive integer, got {max_turns!r}")
    if not 0 <= variant < prompts.NUM_VARIANTS:
      raise ValueError(f"variant: must be in 0..{prompts.NUM_VARIANTS - 1}, got {variant}")
    self.sampler = sampler
    self.world = world
    self.domain = world.domain  # type: ignore[misc]  # per instance, unlike the real envs
    self.variant = variant
    self.params = (params or SamplingParams(temperature=0.0, max_new_tokens=256)).validate()
    self.max_turns = max_turns
    self.verifier = verifier
    self.turns: list[Turn] = []
    self.raw: list[str] = []          # the model's full replies (thinking included)
    self.history_dropped = 0          # history pairs the last prompt lost to fit the context
    self.seed = 0
    self.started = False
    self.done = False
    self.closed = False
    self.last: StepResult | None = None

  # -- the Env API ------------------------------------------------------------------------------
  def reset(self, seed: int = 0) -> str:
    if self.closed:
      raise RuntimeError("simulated env is closed; make a new one")
    if not isinstance(seed, int) or isinstance(seed, bool):
      raise TypeError(f"seed: expected an integer, got {seed!r}")
    self.turns, self.raw, self.seed = [], [], seed
    self.steps, self.started, self.done, self.last = 0, True, False, None
    self.goal = copy.deepcopy(self.world.goal)
    w = self.world
    return self._ready(w.task, w.action_space, w.initial_state)

  def step(self, action: str) -> str:
    return self.step_result(action).observation

  def step_result(self, action: str) -> StepResult:
    return step_many([self], [action])[0]

  def close(self) -> None:
    self.closed, self.started = True, False

  # -- the parts step_many uses -----------------------------------------------------------------
  def check_step(self, action: Any) -> None:
    """Raises if this episode cannot take `action` now."""
    if self.closed:
      raise RuntimeError("simulated env is closed; make a new one")
    if not self.started:
      raise RuntimeError("call reset(seed) before step()")
    if self.done:
      raise RuntimeError(f"the episode is over ({len(self.turns)} turns); call reset(seed)")
    if not isinstance(action, str):
      raise TypeError(f"action: expected a string, got {type(action).__name__}")
    check_text(action, "action")

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
    msgs = prompts.prompt_messages(pending, len(pending.turns) - 1, self.variant)
    # An episode longer than the model's context keeps its newest turns: the oldest history
    # pairs are dropped (counted in `info["history_dropped"]`) so that the reply still fits.
    self.history_dropped = 0
    engine = getattr(self.sampler, "engine", None)
    if engine is None or not hasattr(self.sampler, "encode_prompt"):
      return msgs
    budget = int(engine.context) - int(self.params.max_new_tokens)
    fitted, self.history_dropped = fit_chat(self.sampler, msgs, budget)
    return msgs if fitted is None else fitted

  def params_for_turn(self) -> SamplingParams:
    """This turn's sampling params: the seed follows (episode seed, turn), so a sampled episode
    replays the same way whatever else shares its batch."""
    return self.params.replace(seed=(self.params.seed + 1000 * self.seed + len(self.turns))
                               % (2 ** 31 - 1))

  def record(self, action: str, gen: Generation | None, latency_s: float,
             loop: dict[str, Any] | None = None) -> StepResult:
    """Adds the turn (`gen` None for a finish action) and returns its StepResult; `loop` is
    what the loop guard did (`step_many`), its `cut` applied here."""
    terminated = gen is None
    observation = "" if gen is None else parse_prediction(gen.text, keep_spaces=True)
    if loop and loop["cut"]:
      observation = turn_kinds.cut_loop(observation)
    self.raw.append("" if gen is None else gen.text)
    self.turns.append(Turn(action, observation))
    self.steps = len(self.turns)
    truncated = not terminated and len(self.turns) >= self.max_turns
    self.done = terminated or truncated
    info: dict[str, Any] = {"turn": len(self.turns), "finish_action": terminated,
                            "latency_s": latency_s,
                            "history_dropped": 0 if gen is None else self.history_dropped}
    if gen is not None:
      info.update(raw=gen.text, reasoning=gen.reasoning, prompt_tokens=gen.prompt_tokens,
                  completion_tokens=gen.completion_tokens, finish_reason=gen.finish_reason)
    if loop is not None:
      info["loop_guard"] = loop
    reward = 0.0
    if self.done and self.verifier is not None:
      value = self.verifier(self.trajectory())
      if isinstance(value, Verdict):
        info["verdict"] = {"success": bool(value.success), "credit": float(value.credit),
                           "reason": value.reason}
        value = value.credit
      reward = float(value)
      info["verified"] = True
    self.last = StepResult(observation, terminated, truncated, reward, info)
    return self.last


def step_many(envs: Sequence[SimulatedEnv], actions: Sequence[str]) -> list[StepResult]:
  """Advances each episode by its action; the world model runs once per distinct sampler for all
  of them (finish actions need no generation). Every episode is checked before anything runs,
  so a misuse raises without advancing any episode."""
  if len(envs) != len(actions):
    raise ValueError(f"step_many: {len(envs)} episodes but {len(actions)} actions")
  if len({id(e) for e in envs}) != len(envs):
    raise ValueError("step_many: an episode appears twice in one call")
  for i, (env, action) in enumerate(zip(envs, actions)):
    try:
      env.check_step(action)
    except (RuntimeError, TypeError) as e:
      raise type(e)(f"episode {i}: {e}") from None
  results: list[StepResult | None] = [None] * len(envs)
  groups: dict[int, list[int]] = {}
  for i, (env, action) in enumerate(zip(envs, actions)):
    if env.world.is_finish(action):
      results[i] = env.record(action, None, 0.0)
    else:
      groups.setdefault(id(env.sampler), []).append(i)
  for idx in groups.values():
    sampler = envs[idx[0]].sampler
    chats = [envs[i].messages_for(actions[i]) for i in idx]
    params = [envs[i].params_for_turn() for i in idx]
    t0 = time.perf_counter()
    gens = sampler.generate(chats, params)
    gens, loops = guard_loops(sampler, [envs[i].loop_guard for i in idx], chats, params, gens)
    latency = time.perf_counter() - t0
    for i, gen, loop in zip(idx, gens, loops):
      results[i] = envs[i].record(actions[i], gen, latency, loop)
  return results  # type: ignore[return-value]


def looping(gen: Generation) -> bool:
  """Whether the observation of `gen` is a loop (`turn_kinds.is_loop`)."""
  return turn_kinds.is_loop(parse_prediction(gen.text, keep_spaces=True))


def resample_params(params: SamplingParams, round_: int) -> SamplingParams:
  """The loop guard's params for its `round_`-th new draw of a reply drawn with `params`."""
  return params.replace(temperature=max(params.temperature, LOOP_RESAMPLE_TEMPERATURE),
                        seed=(params.seed + 7919 * round_) % (2 ** 31 - 1))


def guard_loops(sampler: Any, guards: Sequence[str], chats: Sequence[Any],
                 params: Sequence[SamplingParams], gens: Sequence[Generation]
                 ) -> tuple[list[Generation], list[dict[str, Any] | None]]:
  """The generations after each episode's loop guard, and per episode what the guard did (None
  where it is off). Resampled replies are drawn together, one engine call per round."""
  gens = list(gens)
  loops: list[dict[str, Any] | None] = [
      None if g == "off" else {"looped": looping(gen), "resamples": 0, "cut": False}
      for g, gen in zip(guards, gens)]
  still = [j for j, lp in enumerate(loops) if lp and lp["looped"]]
  for rnd in range(1, LOOP_RESAMPLES + 1):
    again = [j for j in still if guards[j] == "resample"]
    if not again:
      break
    redo = [resample_params(params[j], rnd) for j in again]
    for j, gen in zip(again, sampler.generate([chats[j] for j in again], redo)):
      gens[j] = gen
      loops[j]["resamples"] += 1
    still = [j for j in still if looping(gens[j])]
  for j in still:
    loops[j]["cut"] = True
  return gens, loops


class SimulatedBatch:
  """Many episodes of one sampler stepped together: `reset(seeds)`, `step(actions)`."""

  def __init__(self, sampler: Any, worlds: Sequence[World], **env_kw: Any):
    self.envs = [SimulatedEnv(sampler, w, **env_kw) for w in worlds]

  def __len__(self) -> int:
    return len(self.envs)

  def reset(self, seeds: Sequence[int]) -> list[str]:
    if len(seeds) != len(self.envs):
      raise ValueError(f"reset: {len(seeds)} seeds for {len(self.envs)} episodes")
    return [e.reset(s) for e, s in zip(self.envs, seeds)]

  def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
    """Steps the episodes whose action is not None (None: leave that episode as it is)."""
    if len(actions) != len(self.envs):
      raise ValueError(f"step: {len(actions)} actions for {len(self.envs)} episodes")
    live = [i for i, a in enumerate(actions) if a is not None]
    out: list[StepResult | None] = [None] * len(self.envs)
    for i, r in zip(live, step_many([self.envs[i] for i in live], [actions[i] for i in live])):
      out[i] = r
    return out

  @property
  def done(self) -> list[bool]:
    return [e.done for e in self.envs]

  def close(self) -> None:
    for e in self.envs:
      e.close()
