"""The rollout source of world-model RL: prompts of the RL pool in, scored groups of replies out.

This module holds only what is particular to world-model RL; the sampler, the parameter sync,
group credit, reference log-probs, the mini-batch split and the resumable rollout state are the
shared `lwm_jax.rl.worker.RolloutWorker`. Each rollout (`source.next_batch(train_state)`, or
`next(source)` after `set_params`):

1. takes the next `prompts_per_batch` prompts of the RL pool (`lwm_jax.rl.pool`) in a seeded
   order (this process's share when several processes train together);
2. samples `group_size` responses per prompt with the worker's sampler, which decodes with the
   CURRENT parameters of the train state in fp32 (decode layout "model"), so the recorded
   log-probabilities are those of the policy being trained, the "old" log-probabilities of GSPO;
3. scores every response with the configured reward mix (`lwm_jax.rl.rewards`) through
   `TurnReward`, the mix under the shared reward protocol: a reply whose judgement failed (after
   the judge's retries) gets no reward (NaN), so the worker leaves it out of its group (empty
   response mask, advantage 0) and skips a group with fewer than 2 valid replies
   (`groups_skipped`); a group whose valid rewards are all equal carries no signal: counted and,
   with `filter_zero_variance`, given an empty response mask;
4. lays the rows out as a batch of fixed shape `[B = prompts_per_batch * group_size, seq_len]`:
   `tokens` (prompt then response, right-padded with the pad id), `positions`, `segment_ids` (1
   on real tokens, 0 on padding), `response_mask` (1 on response tokens), `old_logprobs` (log p
   of token i under the sampling policy, aligned with `tokens`, 0 elsewhere) and `advantages`
   [B] (plus `ref_logprobs` with the KL term): the layout `lwm_jax.train.steps.gspo_step` takes;
5. the worker hands that batch out in `updates_per_batch` consecutive slices of rows, one per
   call (one optimizer update each; the paper uses 4): the policy moves between them, so the
   importance ratio departs from 1 and the clip acts.

`metrics` holds the last call's figures: rollout and reward seconds, reward mean/std over the
valid rewards overall and per component (and per judge dimension when the rubric runs), response
length, truncated share, zero-variance groups, and the reward's health: `invalid_rewards`,
`judge_failures`, `judge_partial`, `judge_truncated`, `groups_skipped`. `get_state` /
`set_state` hold the prompt order's position and the worker's state (the rollout counter: the
seeds of rollout k are a hash of the seed, k, the process and the prompt; unused mini-batches),
so a resumed run draws the same prompts and, with the same parameters, the same responses.

In the trainer: build the source without a model; the trainer calls `bind(run)` once and then
`next_batch(state)` every step with its current TrainState (the first call builds the engine on
the state's parameters); `get_state` / `set_state` go into the checkpoint.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Mapping, Sequence

import numpy as np
from flax import nnx

from lwm_jax.judge import DIMENSIONS
from lwm_jax.rl.pool import PromptOrder, RlPool
from lwm_jax.rl.rewards import MixedReward, RewardInput
from lwm_jax.rl.worker import GroupConfig, Rewards, RolloutWorker, seed_of

BATCH_KEYS = ("tokens", "positions", "segment_ids", "response_mask", "old_logprobs",
              "advantages")


@dataclasses.dataclass(frozen=True)
class RolloutConfig(GroupConfig):
  """`prompts_per_batch` prompts of the RL pool per rollout, `group_size` replies each (the
  shared fields: `lwm_jax.rl.worker.GroupConfig`)."""
  prompts_per_batch: int = 4
  shuffle: bool = True

  SECTION = "rollout"
  GROUPS = "prompts_per_batch"

  @property
  def groups_per_batch(self) -> int:
    return self.prompts_per_batch

  @property
  def max_prompt_tokens(self) -> int:
    """The longest prompt that leaves room for a whole response in `seq_len`."""
    return self.seq_len - self.max_new_tokens


class TurnReward:
  """The reward mix as a `GroupReward` of world-model RL: each sample is (pool item, generation);
  the mix scores the reply against the item's real observation. An invalid mix (a failed
  judgement) gives NaN. Its metrics: the judge's health (`reward_health`), the mean of each
  component and of each judge dimension over the valid scores."""

  def __init__(self, mix: MixedReward):
    self.mix = mix

  def __call__(self, samples: Sequence[tuple[Any, Any]]) -> Rewards:
    scores = self.mix.score([RewardInput(it.domain, it.context, it.action, g.text, it.reference,
                                         it.meta) for it, g in samples])
    values = np.array([s["total"] if s.get("valid", True) else np.nan for s in scores],
                      np.float64)
    m = reward_health(scores)
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
    return Rewards(values, scores, m)


class RolloutSource:
  """A batch source for the RL stage (see the module docstring): prompts of the pool in, groups
  of replies out, scored by the reward mix; the rest is its `RolloutWorker` (`self.worker`).

  `model` is the policy (a `Transformer`; its parameters are replaced by `set_params` before each
  rollout), `tokenizer` the chat tokenizer, `pool` the RL prompts, `reward` the reward mix.
  Engine options (`chunk_steps`, `max_batch`, bucket sizes, ...) pass through `engine_kw`.
  """

  def __init__(self, model: Any, tokenizer: Any, pool: RlPool, reward: MixedReward,
               cfg: RolloutConfig, *, mesh: Any = None, process_index: int = 0,
               process_count: int = 1, heldout: Any = None, kl: bool = False,
               **engine_kw: Any):
    cfg = cfg.validate()
    self.heldout = heldout
    self.pool, self.reward, self.tok = pool, reward, tokenizer
    too_long = [it.id for it in pool.items if len(it.prompt_ids) > cfg.max_prompt_tokens]
    if too_long:
      raise ValueError(f"RL pool: {len(too_long)} prompt(s) (e.g. '{too_long[0]}') are longer than "
                       f"seq_len - max_new_tokens = {cfg.max_prompt_tokens} tokens; build the pool "
                       "with max_prompt_tokens=cfg.max_prompt_tokens")
    engine_kw.setdefault("max_batch", max(1, cfg.batch_size))
    engine_kw.setdefault("min_batch_bucket", cfg.batch_size)
    self.worker = RolloutWorker(tokenizer, cfg, model=model, mesh=mesh, kl=kl,
                                name="RolloutSource", process_index=process_index,
                                process_count=process_count, **engine_kw)
    self.order = PromptOrder(len(pool), cfg.seed, cfg.shuffle, process_index, process_count)
    self.scorer = TurnReward(reward)
    self.last: dict[str, Any] = {}

  @classmethod
  def from_params(cls, graphdef: Any, params: Any, tokenizer: Any, pool: RlPool,
                  reward: MixedReward, cfg: RolloutConfig, **kw: Any) -> "RolloutSource":
    """A source over the model `nnx.merge(graphdef, params)` (the trainer's graph and state)."""
    return cls(nnx.merge(graphdef, params), tokenizer, pool, reward, cfg, **kw)

  # the worker's state, read through the source
  cfg = property(lambda self: self.worker.cfg)
  calls = property(lambda self: self.worker.calls)
  metrics = property(lambda self: self.worker.metrics)
  sampler = property(lambda self: self.worker.sampler)

  # ------------------------------------------------------------------------ the trainer's API
  def bind(self, run: Any) -> None:
    """Takes the run's graph, mesh and process layout (`lwm_jax.train.sources.Run`) before the
    first batch; the policy model is built from the train state's parameters at the first
    `next_batch(state)`. Checks that the run's batch shape is the rollouts'."""
    self.worker.bind(run)
    c = self.cfg
    state = self.order.get_state()
    self.order = PromptOrder(len(self.pool), c.seed, c.shuffle, run.process_index,
                             run.process_count)
    self.order.set_state(state)

  def describe(self) -> str:
    s = self.pool.stats
    return (f"rollouts from the live policy: {len(self.pool)} RL prompts "
            f"({s.get('dropped_too_long', 0)} dropped as too long), {self.cfg.group_size} "
            f"responses each")

  def set_params(self, params: Any) -> None:
    """Samples the next rollouts from `params` (an `nnx.State` of the policy, e.g. the train
    state's `params`), used in place: no copy, no save or load."""
    self.worker.set_params(params)

  # ------------------------------------------------------------------------ batches
  def __iter__(self) -> "RolloutSource":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return self.next_batch()

  def next_batch(self, state: Any = None) -> dict[str, np.ndarray]:
    """The next mini-batch: the next slice of the current rollout batch, or, when that is used
    up, the first slice of a new rollout sampled from `state` (a TrainState, or a parameter
    state) when given, else from the parameters last handed in."""
    return self.worker.next_batch(lambda: self.rollout(state))

  def rollout(self, state: Any = None) -> dict[str, np.ndarray]:
    """One whole rollout batch ([prompts_per_batch x group_size] rows), see the module docstring."""
    batch, samples, scored = self.worker.rollout(state, self._generate, self.scorer,
                                                 self._layout)
    gens = [g for _, g in samples]
    lens = np.array([len(g.token_ids) for g in gens], np.float64)
    self.metrics.update({"response_len": float(lens.mean()),
                         "response_len_max": float(lens.max()),
                         "truncated": float(np.mean([g.finish_reason == "length"
                                                     for g in gens]))})
    self.last = {"ids": [it.id for it, _ in samples], "domains": [it.domain for it, _ in samples],
                 "texts": [g.text for g in gens], "rewards": scored.values,
                 "scores": scored.details}
    return batch

  def _generate(self, sampler: Any, call: int) -> list[tuple[Any, Any]]:
    """The next prompts of this process's share, `group_size` replies each: (item, generation)
    in group order."""
    c, w = self.cfg, self.worker
    items = [self.pool.items[i] for i in self.order.take(c.prompts_per_batch)]
    # a prompt's seed follows its slot in the global batch, so the samples do not depend on
    # how many processes share the batch
    sps = [c.sampling_params(n=c.group_size,
                             seed=seed_of(c.seed, "rollout", call,
                                          k * w.process_count + w.process_index))
           for k in range(len(items))]
    gens = sampler.generate([it.prompt_ids for it in items], sps)
    return list(zip([it for it in items for _ in range(c.group_size)], gens))

  def _layout(self, samples, adv: np.ndarray, train_rows: np.ndarray) -> dict[str, np.ndarray]:
    c = self.cfg
    b, s = len(samples), c.seq_len
    tokens = np.full((b, s), self.tok.pad_id, np.int32)
    seg = np.zeros((b, s), np.int32)
    mask = np.zeros((b, s), np.float32)
    old = np.zeros((b, s), np.float32)
    for i, (it, g) in enumerate(samples):
      p, r = len(it.prompt_ids), len(g.token_ids)
      if p + r > s:
        raise AssertionError(f"rollout row {i}: {p} + {r} tokens exceed seq_len {s}")
      tokens[i, :p] = it.prompt_ids
      tokens[i, p:p + r] = g.token_ids
      seg[i, :p + r] = 1
      if train_rows[i]:
        mask[i, p:p + r] = 1.0
      old[i, p:p + r] = g.logprobs
    positions = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy()
    return {"tokens": tokens, "positions": positions, "segment_ids": seg,
            "response_mask": mask, "old_logprobs": old, "advantages": adv.astype(np.float32)}

  # ------------------------------------------------------------------------ held-out evaluation
  def evaluate(self, state: Any = None) -> dict[str, float]:
    """Greedy held-out metrics of the policy `state` (or the parameters last handed in);
    {} without a held-out set. The rows of the last evaluation are in `self.last_eval`."""
    if self.heldout is None:
      return {}
    self.worker.sync(state)
    t0 = time.perf_counter()
    m, self.last_eval = self.heldout.evaluate(self.sampler, self.reward)
    m["eval_s"] = time.perf_counter() - t0
    return m

  # ------------------------------------------------------------------------ resume
  def get_state(self) -> dict[str, Any]:
    """JSON-able: the prompt order, the rollout counter and the rollout's unused mini-batches
    (see `RolloutWorker.get_state`)."""
    return dict(self.worker.get_state(), order=self.order.get_state())

  def set_state(self, state: Mapping[str, Any]) -> None:
    self.worker.set_state(state, "rollout")
    self.order.set_state(state["order"])


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
