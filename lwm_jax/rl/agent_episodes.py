"""Multi-turn agent episodes as GSPO batches: the rollout source of the "agent-rl" stage.

One rollout (`AgentEpisodeSource.rollout`): the next `tasks_per_batch` task seeds, `group_size`
episodes each, all played at once against an environment set (`lwm_jax.rl.agent_envs`: real
envs in worker processes, or `SimulatedEnv`s backed by a world model; the code path is the same).
Every turn, ONE engine call generates the next action of every live episode; the envs then step
those actions together (for simulated envs, one world-model call through `step_many`).

The agent sees the layout it was cloned on (`lwm_jax.data.agent_targets`): a system prompt with
the task and the action space, the initial state, then its actions (assistant) and the
observations (user). An episode ends when the agent answers `finish()` (not sent to the env),
at the turn limit, or when the next reply would not fit `seq_len`. The reply text, stripped, is
the action as is: an empty or malformed action goes to the env, whose error message is the next
observation (an env that raises gives the exception text instead).

At the end the task verifier scores each episode: real envs by `verify.check` on the env's real
state, simulated ones by `verify_transcript.check_transcript` (the simulated transcript judged by
the rules the real checks use, with the task's world re-created by a real env). The reward is the
verdict's credit (1.0 exactly on success, partial credit otherwise) or, with
`reward="success"`, 0/1.

A batch row is one whole episode: `tokens` (prompt, every reply, every observation message),
`response_mask` 1 only on the tokens the agent generated (observations and chat markup are
context with zero weight), `old_logprobs` the sampling log-probs on those tokens, and
`advantages` per row, normalised within each task's group: the layout of `gspo_step`, whose
sequence ratio is then the geometric mean over all the agent's tokens of the episode. With
`credit="turn"` the advantages are per token instead ([B, seq_len]): each turn's reply carries
its own discounted return, normalised over the group's turns (`turn_advantages`), trained with
a per-token loss (gspo_token or grpo). A rollout batch is handed out in `updates_per_batch`
slices (4 by default, as in world-model RL), one optimizer update each.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import time
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from lwm_jax.data import agent_targets
from lwm_jax.data.schema import Trajectory
from lwm_jax.envs import base
from lwm_jax.rl.rollout import group_advantages_np
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler

REWARDS = ("credit", "success")
CREDITS = ("episode", "turn")
END_REASONS = ("finish", "turn_limit", "context", "no_room")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  domain: str = "search"
  tasks: Sequence[int] = ()      # the training task seeds, taken in a seeded order
  tasks_per_batch: int = 2
  group_size: int = 4
  seq_len: int = 2048            # batch width: a whole episode must fit
  max_turns: int = 8
  max_new_tokens: int = 64       # per action
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  seed: int = 0
  reward: str = "credit"
  filter_zero_variance: bool = True
  adv_eps: float = 1e-6
  updates_per_batch: int = 4
  credit: str = "episode"        # episode | turn (see turn_advantages)
  gamma: float = 0.9             # the per-turn credit's discount

  def validate(self) -> "AgentConfig":
    def need(cond: bool, field: str, why: str):
      if not cond:
        raise ValueError(f"agent.{field}: {why}")
    need(len(self.tasks) > 0, "tasks", "no training task seeds")
    need(self.tasks_per_batch >= 1, "tasks_per_batch", "must be >= 1")
    need(self.group_size >= 2, "group_size", "must be >= 2 (advantages compare a group)")
    need(self.max_turns >= 1, "max_turns", "must be >= 1")
    need(0 < self.max_new_tokens < self.seq_len, "max_new_tokens", "must be in (0, seq_len)")
    need(self.reward in REWARDS, "reward", f"'{self.reward}' is not one of {REWARDS}")
    need(self.credit in CREDITS, "credit", f"'{self.credit}' is not one of {CREDITS}")
    need(0 < self.gamma <= 1, "gamma", f"{self.gamma} must be in (0, 1]")
    need(self.updates_per_batch >= 1 and self.batch_size % self.updates_per_batch == 0,
         "updates_per_batch", f"{self.updates_per_batch} must divide tasks_per_batch x "
         f"group_size = {self.batch_size}")
    return self

  @property
  def batch_size(self) -> int:
    return self.tasks_per_batch * self.group_size

  @property
  def minibatch_size(self) -> int:
    return self.batch_size // self.updates_per_batch


@dataclasses.dataclass
class Episode:
  """One agent episode: its tokens with the agent's share marked, its turns and its verdict."""
  eid: int
  seed: int
  ids: list[int] = dataclasses.field(default_factory=list)
  agent: list[float] = dataclasses.field(default_factory=list)   # 1 on generated tokens
  logprobs: list[float] = dataclasses.field(default_factory=list)
  turns: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  replies: list[str] = dataclasses.field(default_factory=list)
  end: str = ""
  success: bool = False
  credit: float = 0.0
  reason: str = ""

  @property
  def done(self) -> bool:
    return bool(self.end)

  def add(self, ids: Sequence[int], agent: float, logprobs: Sequence[float] | None = None):
    self.ids += list(ids)
    self.agent += [agent] * len(ids)
    self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


def parse_action(text: str) -> str:
  """The action of a reply: the text after a closing `</think>` (if any), stripped."""
  if "</think>" in text:
    text = text.rsplit("</think>", 1)[1]
  return text.strip()


_FINISH = re.compile(r"finish\s*(\(.*\))?\s*$", re.S)


def is_finish(action: str) -> bool:
  """`finish()` (with or without arguments, or the bare word) ends the episode."""
  return bool(_FINISH.match(action.strip()))


def _seed(*parts: Any) -> int:
  h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(h, "big") % (2 ** 31)


def start_messages(domain: str, info: base.EnvInfo) -> list[dict[str, str]]:
  """The agent's opening chat for a task: system (task, action space) and the initial state."""
  traj = Trajectory(id="episode", domain=domain, task=info.task, action_space=info.action_space,
                    initial_state=info.initial_state, turns=[])
  return agent_targets.next_action_messages(traj)


def run_episodes(sampler: Sampler, envs: Any, domain: str, seeds: Sequence[int], cfg: AgentConfig,
                 params: SamplingParams, *, first_eid: int = 0, rng_key: Any = 0
                 ) -> tuple[list[Episode], dict[str, float]]:
  """Plays one episode per entry of `seeds` (repeat a seed for a group) against `envs`; returns
  the episodes (verdicts filled in) and timings. See the module docstring."""
  tok = sampler.tokenizer
  eps = [Episode(first_eid + i, int(s)) for i, s in enumerate(seeds)]
  t0 = time.perf_counter()
  infos = envs.open([(e.eid, e.seed) for e in eps])
  gen_s, env_s = 0.0, 0.0
  try:
    for e, info in zip(eps, infos):
      e.add(tok.encode_chat(start_messages(domain, info), add_generation_prompt=True), 0.0)
      if len(e.ids) + cfg.max_new_tokens > cfg.seq_len:
        e.end = "no_room"  # counted in the metrics; its row is the cut prompt, zero weight
        e.ids, e.agent, e.logprobs = (e.ids[:cfg.seq_len], e.agent[:cfg.seq_len],
                                      e.logprobs[:cfg.seq_len])
    tail = tok.encode("\n")
    for turn in range(cfg.max_turns):
      live = [e for e in eps if not e.done]
      if not live:
        break
      sps = [params.replace(n=1, seed=_seed(rng_key, e.eid, e.seed, turn)) for e in live]
      t1 = time.perf_counter()
      gens = sampler.generate([list(e.ids) for e in live], sps)
      gen_s += time.perf_counter() - t1
      acting = []
      for e, g in zip(live, gens):
        e.add(g.token_ids, 1.0, g.logprobs)
        if not g.token_ids or g.token_ids[-1] != tok.im_end_id:
          e.add([tok.im_end_id], 0.0)  # cut at max_new_tokens: close the message as context
        e.add(tail, 0.0)
        e.replies.append(g.text)
        action = parse_action(g.text)
        if is_finish(action):
          e.end = "finish"
        else:
          acting.append((e, action))
      t1 = time.perf_counter()
      observations = envs.step([(e.eid, a) for e, a in acting]) if acting else []
      env_s += time.perf_counter() - t1
      for (e, action), obs in zip(acting, observations):
        e.turns.append((action, obs))
        if turn + 1 >= cfg.max_turns:
          e.end = "turn_limit"
          continue
        nxt = tok.encode_message({"role": "user",
                                  "content": agent_targets.observation_message(obs)})[0]
        nxt = nxt + tok.generation_prompt()
        if len(e.ids) + len(nxt) + cfg.max_new_tokens > cfg.seq_len:
          e.end = "context"
          continue
        e.add(nxt, 0.0)
    for e in eps:
      e.end = e.end or "turn_limit"
    t1 = time.perf_counter()
    verdicts = envs.verdict([(e.eid, list(e.turns)) for e in eps])
    verify_s = time.perf_counter() - t1
    for e, v in zip(eps, verdicts):
      e.success, e.credit, e.reason = bool(v.success), float(v.credit), v.reason
  finally:
    envs.close([e.eid for e in eps])
  return eps, {"episodes_s": time.perf_counter() - t0, "generate_s": gen_s, "env_s": env_s,
               "verify_s": verify_s}


def episode_rows(eps: Sequence[Episode], advantages: np.ndarray, seq_len: int, pad_id: int,
                 train_mask: Sequence[bool] | None = None) -> dict[str, np.ndarray]:
  """The GSPO batch of episodes (see the module docstring); `train_mask[i]` False empties row
  i's response mask (a group without signal)."""
  b = len(eps)
  tokens = np.full((b, seq_len), pad_id, np.int32)
  seg = np.zeros((b, seq_len), np.int32)
  mask = np.zeros((b, seq_len), np.float32)
  old = np.zeros((b, seq_len), np.float32)
  for i, e in enumerate(eps):
    n = len(e.ids)
    if n > seq_len:
      raise AssertionError(f"episode {e.eid}: {n} tokens exceed seq_len {seq_len}")
    tokens[i, :n] = e.ids
    seg[i, :n] = 1
    if train_mask is None or train_mask[i]:
      mask[i, :n] = e.agent
    old[i, :n] = e.logprobs
  positions = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (b, seq_len)).copy()
  return {"tokens": tokens, "positions": positions, "segment_ids": seg, "response_mask": mask,
          "old_logprobs": old, "advantages": np.asarray(advantages, np.float32)}


def turn_spans(e: Episode) -> list[tuple[int, int]]:
  """[start, end) token spans of the episode's replies: the runs of agent tokens, one per turn."""
  spans, start = [], None
  for i, a in enumerate(e.agent + [0.0]):
    if a > 0 and start is None:
      start = i
    elif a <= 0 and start is not None:
      spans.append((start, i))
      start = None
  return spans


def turn_advantages(eps: Sequence[Episode], rewards: np.ndarray, group_size: int, seq_len: int,
                    gamma: float, adv_eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
  """Per-turn credit: (advantages [B, seq_len] on each reply's tokens, flat groups [G]).

  The verifier scores the episode at its end, so turn t of an episode with T replies and reward
  R gets the discounted return `G_t = gamma^(T-1-t) R` (the last turn R, earlier turns less);
  the returns of all turns of a task's group are normalised together, `(G - mean) / (std + eps)`
  (unbiased std), and each reply's tokens carry its turn's value. A group whose returns are all
  equal has no signal (flat). With gamma = 1 every turn of an episode shares one value, as the
  episode credit does, but normalised over turns rather than episodes."""
  adv = np.zeros((len(eps), seq_len), np.float32)
  flat = np.zeros(len(eps) // group_size, bool)
  for g in range(len(eps) // group_size):
    rows = range(g * group_size, (g + 1) * group_size)
    per = {i: [gamma ** (len(sp) - 1 - t) * rewards[i] for t in range(len(sp))]
           for i in rows for sp in [turn_spans(eps[i])]}
    allg = np.array([x for i in rows for x in per[i]], np.float64)
    if len(allg) < 2 or np.ptp(allg) == 0:
      flat[g] = True
      continue
    mean, std = allg.mean(), allg.std(ddof=1)
    for i in rows:
      for (a, b), ret in zip(turn_spans(eps[i]), per[i]):
        adv[i, a:min(b, seq_len)] = (ret - mean) / (std + adv_eps)
  return adv, flat


def rewards_of(eps: Sequence[Episode], kind: str) -> np.ndarray:
  return np.array([e.credit if kind == "credit" else float(e.success) for e in eps], np.float64)


class TaskOrder:
  """An endless seeded order over the task seeds (a new permutation each epoch); resumable."""

  def __init__(self, tasks: Sequence[int], seed: int):
    self.tasks, self.seed, self.epoch, self.pos = list(tasks), seed, 0, 0

  def take(self, k: int) -> list[int]:
    out = []
    while len(out) < k:
      if self.pos >= len(self.tasks):
        self.epoch, self.pos = self.epoch + 1, 0
      perm = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.tasks))
      out.append(self.tasks[int(perm[self.pos])])
      self.pos += 1
    return out


class AgentEpisodeSource:
  """The trainer's batch source for "agent-rl" (`bind`, `next_batch`, `evaluate`, state).

  `envs` is where training episodes run (`agent_envs.LocalEnvs` / `ProcessEnvs`, real or
  simulated), `eval_envs` (optional) where the held-out tasks `eval_tasks` are played greedily,
  one episode each, every `train.eval_every` steps (real envs: success is measured there).
  """

  def __init__(self, tokenizer: Any, envs: Any, cfg: AgentConfig, *, model: Any = None,
               eval_envs: Any = None, eval_tasks: Sequence[int] = (), mesh: Any = None,
               **engine_kw: Any):
    self.cfg = cfg.validate()
    self.tok, self.envs, self.eval_envs, self.eval_tasks = tokenizer, envs, eval_envs, eval_tasks
    engine_kw.setdefault("max_batch", max(1, cfg.batch_size, len(eval_tasks)))
    # The static engine until the rollouts move to the continuous one (issue 67, part 3).
    engine_kw.setdefault("engine", "static")
    self.engine_kw, self.mesh = engine_kw, mesh
    self.sampler: Sampler | None = None
    self._graphdef = None
    self.order = TaskOrder(cfg.tasks, cfg.seed)
    self.calls, self.episodes_played = 0, 0
    self._pending: list[dict[str, np.ndarray]] = []
    self.metrics: dict[str, float] = {}
    self.last: list[Episode] = []
    self.last_eval: list[Episode] = []
    self.history: list[dict[str, float]] = []   # per evaluation: episodes so far, success
    if model is not None:
      self._build(model)

  # ------------------------------------------------------------------------ model and params
  def _build(self, model: Any) -> None:
    self.sampler = Sampler(model, self.tok, mesh=self.mesh, decode_layout="model",
                           **self.engine_kw)
    self._treedef = jax.tree.structure(self.sampler.engine.state)

  def bind(self, run: Any) -> None:
    c = self.cfg
    if run.process_count != 1:
      raise ValueError("agent-rl runs on one process (its envs and engine are local); got "
                       f"{run.process_count} processes")
    if run.seq_len != c.seq_len:
      raise ValueError(f"config.train.seq_len ({run.seq_len}) must equal the episode seq_len "
                       f"({c.seq_len})")
    if run.batch_size != c.minibatch_size:
      raise ValueError(f"config.train.batch_size ({run.batch_size}) must be agent.tasks_per_batch"
                       f" x rl.group_size / rl.updates_per_batch = {c.tasks_per_batch} x "
                       f"{c.group_size} / {c.updates_per_batch}")
    self._graphdef = run.graphdef
    if self.mesh is None:
      self.mesh = run.mesh

  def _use(self, state: Any) -> None:
    params = getattr(state, "params", state)
    if self.sampler is None:
      if params is None or self._graphdef is None:
        raise RuntimeError("AgentEpisodeSource: give a model, or bind(run) and pass the state")
      self._build(nnx.merge(self._graphdef, params))
    elif params is not None:
      if jax.tree.structure(params) != self._treedef:
        raise ValueError("the parameter tree does not match the agent model's")
      self.sampler.engine.state = params
      self.sampler.engine.decode_state = params

  def describe(self) -> str:
    c = self.cfg
    return (f"agent episodes: {len(c.tasks)} {c.domain} tasks, {c.group_size} episodes each, "
            f"up to {c.max_turns} turns")

  # ------------------------------------------------------------------------ batches
  def next_batch(self, state: Any = None) -> dict[str, np.ndarray]:
    if not self._pending:
      batch = self.rollout(state)
      k, rows = self.cfg.updates_per_batch, self.cfg.minibatch_size
      self._pending = [{n: v[j * rows:(j + 1) * rows] for n, v in batch.items()}
                       for j in range(k)]
    return self._pending.pop(0)

  def sampling_params(self, greedy: bool = False) -> SamplingParams:
    c = self.cfg
    if greedy:
      return SamplingParams(temperature=0.0, max_new_tokens=c.max_new_tokens)
    return SamplingParams(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                          max_new_tokens=c.max_new_tokens)

  def rollout(self, state: Any = None) -> dict[str, np.ndarray]:
    """One batch of `tasks_per_batch x group_size` episodes (see the module docstring)."""
    self._use(state)
    c = self.cfg
    tasks = self.order.take(c.tasks_per_batch)
    seeds = [s for s in tasks for _ in range(c.group_size)]
    eps, times = run_episodes(self.sampler, self.envs, c.domain, seeds, c, self.sampling_params(),
                              first_eid=self.calls * c.batch_size,
                              rng_key=(c.seed, "train", self.calls))
    rewards = rewards_of(eps, c.reward)
    if c.credit == "turn":
      adv, flat = turn_advantages(eps, rewards, c.group_size, c.seq_len, c.gamma, c.adv_eps)
    else:
      adv = group_advantages_np(rewards, c.group_size, c.adv_eps)
      flat = np.ptp(rewards.reshape(-1, c.group_size), axis=1) == 0
    keep = [not (c.filter_zero_variance and flat[i // c.group_size]) for i in range(len(eps))]
    batch = episode_rows(eps, adv, c.seq_len, self.tok.pad_id, keep)
    self.calls += 1
    self.episodes_played += len(eps)
    self.last = eps
    self.metrics = dict(times, **self._summary(eps, rewards),
                        zero_variance_groups=float(flat.sum()),
                        episodes=float(self.episodes_played))
    return batch

  @staticmethod
  def _summary(eps: Sequence[Episode], rewards: np.ndarray) -> dict[str, float]:
    m = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
         "success": float(np.mean([e.success for e in eps])),
         "turns": float(np.mean([len(e.turns) for e in eps])),
         "agent_tokens": float(np.mean([sum(e.agent) for e in eps]))}
    for r in END_REASONS:
      m[f"end_{r}"] = float(np.mean([e.end == r for e in eps]))
    return m

  # ------------------------------------------------------------------------ evaluation
  def evaluate(self, state: Any = None) -> dict[str, float]:
    """Greedy episodes on the held-out tasks in `eval_envs`: success rate (and credit);
    {} without held-out tasks."""
    if not self.eval_tasks or self.eval_envs is None:
      return {}
    self._use(state)
    m = evaluate_policy(self.sampler, self.eval_envs, self.cfg, self.eval_tasks)
    self.last_eval = m.pop("_episodes")
    m["episodes_trained"] = float(self.episodes_played)
    self.history.append(dict(m))
    return m

  # ------------------------------------------------------------------------ resume
  def get_state(self) -> dict[str, Any]:
    from lwm_jax.rl.rollout import _pack  # pylint: disable=import-outside-toplevel
    return {"epoch": self.order.epoch, "pos": self.order.pos, "calls": self.calls,
            "episodes": self.episodes_played, "seed": self.cfg.seed,
            "pending": [_pack(b) for b in self._pending]}

  def set_state(self, state: dict[str, Any]) -> None:
    from lwm_jax.rl.rollout import _unpack  # pylint: disable=import-outside-toplevel
    if int(state.get("seed", self.cfg.seed)) != self.cfg.seed:
      raise ValueError(f"agent episode state was saved with seed {state['seed']}, this run has "
                       f"{self.cfg.seed}")
    self.order.epoch, self.order.pos = int(state["epoch"]), int(state["pos"])
    self.calls, self.episodes_played = int(state["calls"]), int(state.get("episodes", 0))
    self._pending = [_unpack(b) for b in state.get("pending", [])]


def evaluate_policy(sampler: Sampler, envs: Any, cfg: AgentConfig, seeds: Sequence[int]
                    ) -> dict[str, Any]:
  """One greedy episode per held-out task seed: success rate with its 95% Wilson interval over
  the tasks, mean credit, turns; the episodes under '_episodes'."""
  params = SamplingParams(temperature=0.0, max_new_tokens=cfg.max_new_tokens)
  eps, times = run_episodes(sampler, envs, cfg.domain, list(seeds), cfg, params,
                            first_eid=10 ** 9, rng_key="eval")
  k, n = sum(e.success for e in eps), len(eps)
  lo, hi = wilson(k, n)
  return {"success": k / max(n, 1), "success_lo": lo, "success_hi": hi,
          "credit": float(np.mean([e.credit for e in eps])) if eps else 0.0,
          "turns": float(np.mean([len(e.turns) for e in eps])) if eps else 0.0,
          "tasks": float(n), "eval_s": times["episodes_s"], "_episodes": eps}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """The 95% Wilson score interval of k successes in n trials."""
  if n == 0:
    return 0.0, 1.0
  p = k / n
  d = 1 + z * z / n
  mid = (p + z * z / (2 * n)) / d
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
  return max(0.0, mid - half), min(1.0, mid + half)
