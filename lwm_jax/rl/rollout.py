"""The rollout source: RL batches sampled from the live policy, scored and ready for the GSPO step.

Each call (`source.next_batch(train_state)`, or `next(source)` after `set_params`):

1. takes the next `prompts_per_batch` prompts of the RL pool (`lwm_jax.rl.pool`) in a seeded
   order (this process's share when several processes train together);
2. samples `group_size` responses per prompt with our engine from the CURRENT parameters: the
   trainer hands its parameter state in place (`set_params`), no save or load, no host copy; the
   engine decodes with the model itself in fp32 (decode layout "model"), so the recorded
   log-probabilities are those of the policy being trained, the "old" log-probabilities of GSPO;
3. scores every response with the configured reward mix (`lwm_jax.rl.rewards`) and computes
   group advantages `(r - mean) / (std + eps)` over each prompt's group, on its VALID rewards
   only: a reply whose judgement failed (after the judge's retries) is excluded, never scored 0
   (empty response mask, advantage 0), and a group with fewer than 2 valid replies is skipped
   (`groups_skipped`); a group whose valid rewards are all equal carries no signal: it is counted
   and, with `filter_zero_variance`, its rows get an empty response mask;
4. returns a batch of fixed shape `[B = prompts_per_batch * group_size, seq_len]`: `tokens`
   (prompt then response, right-padded with the pad id), `positions`, `segment_ids` (1 on real
   tokens, 0 on padding), `response_mask` (1 on response tokens), `old_logprobs` (log p of token
   i under the sampling policy, aligned with `tokens`, 0 elsewhere) and `advantages` [B]: the
   layout `lwm_jax.train.steps.gspo_step` takes;
5. hands that batch out in `updates_per_batch` consecutive slices of rows, one per call (one
   trainer step, one optimizer update each; the paper uses 4): the policy moves between them, so
   the importance ratio departs from 1 and the clip acts. A new rollout starts when the slices
   are used up.

`metrics` holds the last call's figures: rollout and reward seconds, reward mean/std over the
valid rewards overall and per component (and per judge dimension when the rubric runs), response
length, truncated share, zero-variance groups, and the reward's health: `invalid_rewards`,
`judge_failures`, `judge_partial`, `judge_truncated`, `groups_skipped`. `get_state` / `set_state` hold the prompt order's position and the rollout
RNG (a counter: the seeds of call k are a hash of the seed, k, the process and the prompt), so a
resumed run draws the same prompts and, with the same parameters, the same responses.

In the trainer (a loop over a batch source): build the source without a model, let the trainer
call `bind(run)` once (graph definition, mesh, batch shape, process index and count) and then
`next_batch(state)` every step with its current TrainState; the first call builds the engine on
the state's parameters, later calls hand the new parameters to it in place. `get_state` /
`set_state` go into the checkpoint with the train state.
"""
from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import io
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lwm_jax.judge import DIMENSIONS
from lwm_jax.rl.pool import PromptOrder, RlPool
from lwm_jax.rl.rewards import MixedReward, RewardInput
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler

BATCH_KEYS = ("tokens", "positions", "segment_ids", "response_mask", "old_logprobs",
              "advantages")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  prompts_per_batch: int = 4
  group_size: int = 8
  seq_len: int = 2048           # batch width: prompt + response
  max_new_tokens: int = 1024
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  seed: int = 0
  shuffle: bool = True
  filter_zero_variance: bool = False
  adv_eps: float = 1e-6
  updates_per_batch: int = 1    # optimizer updates (mini-batches) per rollout batch

  def validate(self) -> "RolloutConfig":
    def need(cond: bool, field: str, why: str):
      if not cond:
        raise ValueError(f"rollout.{field}: {why}")
    need(self.prompts_per_batch >= 1, "prompts_per_batch", "must be >= 1")
    need(self.group_size >= 2, "group_size", "must be >= 2 (advantages compare a group)")
    need(0 < self.max_new_tokens < self.seq_len, "max_new_tokens", "must be in (0, seq_len)")
    need(self.temperature >= 0, "temperature", "must be >= 0")
    need(self.updates_per_batch >= 1 and self.batch_size % self.updates_per_batch == 0,
         "updates_per_batch", f"{self.updates_per_batch} must be >= 1 and divide "
         f"prompts_per_batch x group_size = {self.batch_size}")
    return self

  @property
  def batch_size(self) -> int:
    return self.prompts_per_batch * self.group_size

  @property
  def minibatch_size(self) -> int:
    """Rows of each batch handed to the trainer (one optimizer update)."""
    return self.batch_size // self.updates_per_batch

  @property
  def max_prompt_tokens(self) -> int:
    """The longest prompt that leaves room for a whole response in `seq_len`."""
    return self.seq_len - self.max_new_tokens


def group_advantages_np(rewards_N: np.ndarray, group_size: int, eps: float = 1e-6) -> np.ndarray:
  """`(r - group mean) / (group std, ddof 1, + eps)`, as `lwm_jax.train.losses.group_advantages`
  computes it on device, here on the host for the batch being built."""
  r = np.asarray(rewards_N, np.float64).reshape(-1, group_size)
  mean = r.mean(axis=1, keepdims=True)
  std = r.std(axis=1, ddof=1, keepdims=True)
  return ((r - mean) / (std + eps)).reshape(-1).astype(np.float32)


def group_advantages_valid(rewards_N: np.ndarray, group_size: int, eps: float = 1e-6
                           ) -> tuple[np.ndarray, np.ndarray, int]:
  """(advantages, keep, groups skipped): group advantages over each group's VALID rewards only
  (NaN marks an invalid reward: a failed judgement, excluded and never scored). Invalid rows get
  advantage 0 and `keep` False; a group with fewer than 2 valid rewards is skipped (all its rows
  `keep` False) and counted. With every reward valid this is `group_advantages_np`."""
  r = np.asarray(rewards_N, np.float64).reshape(-1, group_size)
  valid = np.isfinite(r)
  adv = np.zeros_like(r)
  keep = valid.copy()
  skipped = 0
  for g in range(r.shape[0]):
    v = r[g][valid[g]]
    if len(v) < 2:
      keep[g] = False
      skipped += 1
      continue
    adv[g][valid[g]] = (v - v.mean()) / (v.std(ddof=1) + eps)
  return adv.reshape(-1).astype(np.float32), keep.reshape(-1), skipped


def _seed(*parts: Any) -> int:
  h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(h, "big") % (2 ** 31)


class RolloutSource:
  """A batch source for the RL stage (see the module docstring).

  `model` is the policy (a `Transformer`; its parameters are replaced by `set_params` before each
  rollout), `tokenizer` the chat tokenizer, `pool` the RL prompts, `reward` the reward mix.
  Engine options (`chunk_steps`, `max_batch`, bucket sizes, ...) pass through `engine_kw`.
  """

  def __init__(self, model: Any, tokenizer: Any, pool: RlPool, reward: MixedReward,
               cfg: RolloutConfig, *, mesh: Any = None, process_index: int = 0,
               process_count: int = 1, heldout: Any = None, kl: bool = False,
               **engine_kw: Any):
    self.cfg = cfg.validate()
    self.heldout, self.kl = heldout, kl
    self._ref_params = None
    self._ref_fn = None
    self._gather = False         # several processes: each samples with a local copy
    self.pool, self.reward, self.tok = pool, reward, tokenizer
    too_long = [it.id for it in pool.items if len(it.prompt_ids) > cfg.max_prompt_tokens]
    if too_long:
      raise ValueError(f"RL pool: {len(too_long)} prompt(s) (e.g. '{too_long[0]}') are longer than "
                       f"seq_len - max_new_tokens = {cfg.max_prompt_tokens} tokens; build the pool "
                       "with max_prompt_tokens=cfg.max_prompt_tokens")
    engine_kw.setdefault("max_batch", max(1, cfg.batch_size))
    # The static engine until the rollouts move to the continuous one (issue 67, part 3).
    engine_kw.setdefault("engine", "static")
    engine_kw.setdefault("min_batch_bucket", cfg.batch_size)
    self.engine_kw, self.mesh = engine_kw, mesh
    self.sampler: Sampler | None = None
    self._graphdef = None
    self.order = PromptOrder(len(pool), cfg.seed, cfg.shuffle, process_index, process_count)
    self.process_index, self.process_count = process_index, process_count
    self.calls = 0
    self._pending: list[dict[str, np.ndarray]] = []
    self.metrics: dict[str, float] = {}
    self.last: dict[str, Any] = {}
    if model is not None:
      self._build(model)

  def _build(self, model: Any) -> None:
    self.sampler = Sampler(model, self.tok, mesh=self.mesh, decode_layout="model",
                           **self.engine_kw)
    self.engine = self.sampler.engine
    self._treedef = jax.tree.structure(self.engine.state)

  @classmethod
  def from_params(cls, graphdef: Any, params: Any, tokenizer: Any, pool: RlPool,
                  reward: MixedReward, cfg: RolloutConfig, **kw: Any) -> "RolloutSource":
    """A source over the model `nnx.merge(graphdef, params)` (the trainer's graph and state)."""
    return cls(nnx.merge(graphdef, params), tokenizer, pool, reward, cfg, **kw)

  # ------------------------------------------------------------------------ the trainer's API
  def bind(self, run: Any) -> None:
    """Takes the run's graph, mesh and process layout (`lwm_jax.train.sources.Run`) before the
    first batch; the policy model is built from the train state's parameters at the first
    `next_batch(state)`. Checks that the run's batch shape is the rollouts'."""
    c = self.cfg
    if run.seq_len != c.seq_len:
      raise ValueError(f"config.train.seq_len ({run.seq_len}) must equal the rollout seq_len "
                       f"({c.seq_len})")
    if run.batch_size != c.minibatch_size * run.process_count:
      raise ValueError(f"config.train.batch_size ({run.batch_size}) must be prompts_per_batch x "
                       f"group_size / updates_per_batch x processes = {c.prompts_per_batch} x "
                       f"{c.group_size} / {c.updates_per_batch} x {run.process_count}")
    self._graphdef = run.graphdef
    # One process: the engine decodes with the train state's arrays in place (sharded over the
    # run's mesh). Several processes: the engine runs per process, so each samples its own
    # prompts with a local copy of the parameters gathered from all processes.
    self._gather = run.process_count > 1
    if self.mesh is None and not self._gather:
      self.mesh = run.mesh
    state = self.order.get_state()
    self.order = PromptOrder(len(self.pool), c.seed, c.shuffle, run.process_index,
                             run.process_count)
    self.order.set_state(state)
    self.process_index, self.process_count = run.process_index, run.process_count

  def describe(self) -> str:
    s = self.pool.stats
    return (f"rollouts from the live policy: {len(self.pool)} RL prompts "
            f"({s.get('dropped_too_long', 0)} dropped as too long), {self.cfg.group_size} "
            f"responses each")

  # ------------------------------------------------------------------------ parameters
  def set_params(self, params: Any) -> None:
    """Samples the next rollouts from `params` (an `nnx.State` of the policy, e.g. the train
    state's `params`), used in place: no copy, no save or load."""
    if self.sampler is None:
      raise RuntimeError("RolloutSource: no model yet (give one, or bind(run) first)")
    if jax.tree.structure(params) != self._treedef:
      raise ValueError("set_params: the parameter tree does not match the rollout model's "
                       "(another model config?)")
    self.engine.state = params
    self.engine.decode_state = params

  # ------------------------------------------------------------------------ batches
  def __iter__(self) -> "RolloutSource":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return self.next_batch()

  def next_batch(self, state: Any = None) -> dict[str, np.ndarray]:
    """The next mini-batch: the next slice of the current rollout batch, or, when that is used
    up, the first slice of a new rollout sampled from `state` (a TrainState, or a parameter
    state) when given, else from the parameters last handed in."""
    if not self._pending:
      self._pending = self._split(self.rollout(state))
    self.metrics["minibatch"] = float(self.cfg.updates_per_batch - len(self._pending))
    return self._pending.pop(0)

  def _split(self, batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    k, rows = self.cfg.updates_per_batch, self.cfg.minibatch_size
    return [{n: v[j * rows:(j + 1) * rows] for n, v in batch.items()} for j in range(k)]

  def rollout(self, state: Any = None) -> dict[str, np.ndarray]:
    """One whole rollout batch ([prompts_per_batch x group_size] rows), see the module docstring."""
    params = self._local(getattr(state, "params", state))
    if self.kl and self._ref_params is None and params is not None:
      self._ref_params = jax.tree.map(jnp.copy, params)  # the policy at the start of RL
    if self.sampler is None:
      if params is None or self._graphdef is None:
        raise RuntimeError("RolloutSource: give a model, or bind(run) and pass the train state "
                           "to next_batch")
      self._build(nnx.merge(self._graphdef, params))
    elif params is not None:
      self.set_params(params)
    c = self.cfg
    t0 = time.perf_counter()
    items = [self.pool.items[i] for i in self.order.take(c.prompts_per_batch)]
    # a prompt's seed follows its slot in the global batch, so the samples do not depend on
    # how many processes share the batch
    sps = [SamplingParams(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                          max_new_tokens=c.max_new_tokens, n=c.group_size,
                          seed=_seed(c.seed, "rollout", self.calls,
                                     k * self.process_count + self.process_index))
           for k in range(len(items))]
    gens = self.sampler.generate([it.prompt_ids for it in items], sps)
    t1 = time.perf_counter()
    owners = [it for it in items for _ in range(c.group_size)]
    inputs = [RewardInput(it.domain, it.context, it.action, g.text, it.reference,
                          it.meta)
              for it, g in zip(owners, gens)]
    scores = self.reward.score(inputs)
    t2 = time.perf_counter()
    rewards = np.array([s["total"] if s.get("valid", True) else np.nan for s in scores],
                       np.float64)
    adv, keep, skipped = group_advantages_valid(rewards, c.group_size, c.adv_eps)
    flat = np.array([np.ptp(g[np.isfinite(g)]) == 0 if np.isfinite(g).sum() >= 2 else False
                     for g in rewards.reshape(-1, c.group_size)])
    batch = self._layout(owners, gens, adv, flat, keep)
    if self.kl:
      batch["ref_logprobs"] = self._ref_logprobs(batch)
    self.calls += 1
    self.metrics = self._metrics(scores, gens, rewards, flat, t1 - t0, t2 - t1)
    self.metrics["groups_skipped"] = float(skipped)
    self.last = {"ids": [it.id for it in owners], "domains": [it.domain for it in owners],
                 "texts": [g.text for g in gens], "rewards": rewards, "scores": scores}
    return batch

  def _layout(self, owners, gens, adv: np.ndarray, flat_groups: np.ndarray,
              keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
    c = self.cfg
    b, s = len(gens), c.seq_len
    tokens = np.full((b, s), self.tok.pad_id, np.int32)
    seg = np.zeros((b, s), np.int32)
    mask = np.zeros((b, s), np.float32)
    old = np.zeros((b, s), np.float32)
    for i, (it, g) in enumerate(zip(owners, gens)):
      p, r = len(it.prompt_ids), len(g.token_ids)
      if p + r > s:
        raise AssertionError(f"rollout row {i}: {p} + {r} tokens exceed seq_len {s}")
      tokens[i, :p] = it.prompt_ids
      tokens[i, p:p + r] = g.token_ids
      seg[i, :p + r] = 1
      if (keep is None or keep[i]) and not (c.filter_zero_variance
                                            and flat_groups[i // c.group_size]):
        mask[i, p:p + r] = 1.0
      old[i, p:p + r] = g.logprobs
    positions = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy()
    return {"tokens": tokens, "positions": positions, "segment_ids": seg,
            "response_mask": mask, "old_logprobs": old, "advantages": adv.astype(np.float32)}

  def _metrics(self, scores, gens, rewards, flat, rollout_s, reward_s) -> dict[str, float]:
    lens = np.array([len(g.token_ids) for g in gens], np.float64)
    ok = rewards[np.isfinite(rewards)]
    m = {"rollout_s": rollout_s, "reward_s": reward_s,
         "reward_mean": float(ok.mean()) if len(ok) else float("nan"),
         "reward_std": float(ok.std()) if len(ok) else float("nan"),
         "response_len": float(lens.mean()),
         "response_len_max": float(lens.max()),
         "truncated": float(np.mean([g.finish_reason == "length" for g in gens])),
         "zero_variance_groups": float(flat.sum()),
         "filtered_groups": float(flat.sum()) if self.cfg.filter_zero_variance else 0.0,
         "samples": float(len(gens))}
    m.update(reward_health(scores))
    comps: dict[str, list[float]] = collections.defaultdict(list)
    dims: dict[str, list[float]] = collections.defaultdict(list)
    for s in scores:
      for k, v in s["components"].items():
        if np.isfinite(v):
          comps[k].append(v)
      judged = s["details"].get("rubric", {}).get("scores") or {}
      for d in DIMENSIONS:
        if isinstance(judged.get(d), (int, float)):
          dims[d].append(float(judged[d]))
    m.update({f"reward_{k}": float(np.mean(v)) for k, v in comps.items()})
    m.update({f"judge_{d}": float(np.mean(v)) for d, v in dims.items()})
    return m

  def _local(self, params: Any) -> Any:
    """`params` as the engine takes them: in place, or a local copy when processes share the
    parameters (gathered from all of them)."""
    if params is None or not self._gather:
      return params
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    host = multihost_utils.process_allgather(params, tiled=True)
    return jax.tree.map(jnp.asarray, host)

  def _ref_logprobs(self, batch: dict[str, np.ndarray]) -> np.ndarray:
    """log p of each token under the reference policy (the parameters of the first rollout),
    aligned like `old_logprobs`, for the KL term."""
    if self._ref_fn is None:
      graphdef = self._graphdef if self._graphdef is not None else nnx.graphdef(self.sampler.model)
      def fn(params, tokens, positions, segs):
        out = nnx.merge(graphdef, params)(tokens, positions, segs)
        logits = out.logits[:, :-1].astype(jnp.float32)
        lp = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.pad(lp, ((0, 0), (1, 0)))
      self._ref_fn = jax.jit(fn)
    lp = self._ref_fn(self._ref_params, batch["tokens"], batch["positions"],
                      batch["segment_ids"])
    return np.asarray(jax.device_get(lp), np.float32) * (batch["segment_ids"] > 0)

  # ------------------------------------------------------------------------ held-out evaluation
  def evaluate(self, state: Any = None) -> dict[str, float]:
    """Greedy held-out metrics of the policy `state` (or the parameters last handed in);
    {} without a held-out set. The rows of the last evaluation are in `self.last_eval`."""
    if self.heldout is None:
      return {}
    params = self._local(getattr(state, "params", state))
    if self.sampler is None:
      if params is None or self._graphdef is None:
        raise RuntimeError("RolloutSource.evaluate: no policy yet")
      self._build(nnx.merge(self._graphdef, params))
    elif params is not None:
      self.set_params(params)
    t0 = time.perf_counter()
    m, self.last_eval = self.heldout.evaluate(self.sampler, self.reward)
    m["eval_s"] = time.perf_counter() - t0
    return m

  # ------------------------------------------------------------------------ resume
  def get_state(self) -> dict[str, Any]:
    """JSON-able: the prompt order, the rollout counter and the rollout's unused mini-batches
    (base64 of a compressed npz; empty at a rollout boundary or with one update per batch)."""
    return {"order": self.order.get_state(), "calls": self.calls, "seed": self.cfg.seed,
            "pending": [_pack(b) for b in self._pending]}

  def set_state(self, state: Mapping[str, Any]) -> None:
    if int(state.get("seed", self.cfg.seed)) != self.cfg.seed:
      raise ValueError(f"rollout state was saved with seed {state['seed']}, this run has "
                       f"{self.cfg.seed}")
    self.order.set_state(state["order"])
    self.calls = int(state["calls"])
    self._pending = [_unpack(b) for b in state.get("pending", [])]


def reward_health(scores) -> dict[str, float]:
  """Counts over a batch of mixed scores: invalid rewards (excluded), and of the judge's replies
  those that failed (error or unparseable after the retries), were partial (some dimensions
  invalid: scored by the evaluation's rule) or were cut off by the judge's token limit."""
  m = {"invalid_rewards": 0.0, "judge_failures": 0.0, "judge_partial": 0.0,
       "judge_truncated": 0.0}
  for s in scores:
    if not s.get("valid", True):
      m["invalid_rewards"] += 1
    d = s.get("details", {}).get("rubric")
    if not d:
      continue
    if d.get("failure"):
      m["judge_failures"] += 1
    if d.get("partial"):
      m["judge_partial"] += 1
    if d.get("truncated"):
      m["judge_truncated"] += 1
  return m


def _pack(batch: Mapping[str, np.ndarray]) -> str:
  buf = io.BytesIO()
  np.savez_compressed(buf, **batch)
  return base64.b64encode(buf.getvalue()).decode("ascii")


def _unpack(text: str) -> dict[str, np.ndarray]:
  with np.load(io.BytesIO(base64.b64decode(text))) as z:
    return {k: z[k] for k in z.files}
