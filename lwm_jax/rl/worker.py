"""The rollout worker: the part of an RL batch source that does not depend on what is rolled out.

World-model RL (`lwm_jax.rl.rollout.RolloutSource`: one reply per prompt, scored by the reward
mix) and agent RL (`lwm_jax.rl.agent_episodes.AgentEpisodeSource`: whole episodes against an
environment, scored by the task verifier) differ only in how they produce a group of samples
and how they score it. Everything around that lives here, once:

- the sampler, built on the first batch from the trainer's graph and parameters, and the
  live-parameter sync: each rollout decodes with the train state's own arrays, handed to the
  engine in place (no save or load, no host copy; with several processes, a local copy gathered
  from all of them, since each process samples its own share);
- the shared settings (`GroupConfig`: group size, batch width, sampling, the number of updates
  per rollout) with their checks, and the check of the trainer's batch shape against them;
- group credit: advantages over each group's VALID rewards (a failed judgement is left out,
  never scored 0; a group with fewer than two valid rewards is skipped), zero-variance groups
  counted and, when asked, given no weight;
- the reference log-probs of the KL term, computed by the train steps' own
  `lwm_jax.train.steps.sequence_logprobs` on the parameters of the first rollout;
- the split of a rollout batch into `updates_per_batch` mini-batches handed out one per call,
  and the resumable state (rollout counter, unused mini-batches).

A source hands the worker three things for each rollout: a `generate(sampler, call)` that
returns the samples in group order (`group_size` consecutive samples per group), a reward (the
`GroupReward` protocol: samples -> `Rewards`), and a `layout(samples, advantages, train_rows)`
that writes the batch rows. Rewards of both RL kinds share that protocol, so a failed
judgement or a failed verdict is excluded the same way in either.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler
from lwm_jax.train import steps


def seed_of(*parts: Any) -> int:
  """A sampling seed from any parts (seed, rollout number, slot, ...): a stable hash, so the
  same parts draw the same samples in any process and after a resume."""
  h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(h, "big") % (2 ** 31)


# ---------------------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class GroupConfig:
  """What every RL rollout is made of: `groups_per_batch` groups of `group_size` samples, each
  row at most `seq_len` tokens with `max_new_tokens` per generated reply, cut into
  `updates_per_batch` mini-batches. Subclasses name their groups (prompts, tasks) and add
  their own fields and checks (`_check`)."""
  group_size: int = 8
  seq_len: int = 2048
  max_new_tokens: int = 1024
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  seed: int = 0
  filter_zero_variance: bool = False
  adv_eps: float = 1e-6
  updates_per_batch: int = 1

  SECTION = "rollout"            # how errors name the settings
  GROUPS = "groups_per_batch"    # how errors name the number of groups

  @property
  def groups_per_batch(self) -> int:
    raise NotImplementedError

  @property
  def batch_size(self) -> int:
    return self.groups_per_batch * self.group_size

  @property
  def minibatch_size(self) -> int:
    """Rows of each batch handed to the trainer (one optimizer update)."""
    return self.batch_size // self.updates_per_batch

  def validate(self):
    """Raises ValueError naming the first bad field; returns self."""
    def need(cond: bool, field: str, why: str):
      if not cond:
        raise ValueError(f"{self.SECTION}.{field}: {why}")
    need(self.groups_per_batch >= 1, self.GROUPS, "must be >= 1")
    need(self.group_size >= 2, "group_size", "must be >= 2 (advantages compare a group)")
    need(0 < self.max_new_tokens < self.seq_len, "max_new_tokens", "must be in (0, seq_len)")
    need(self.temperature >= 0, "temperature", "must be >= 0")
    self._check(need)
    need(self.updates_per_batch >= 1 and self.batch_size % self.updates_per_batch == 0,
         "updates_per_batch", f"{self.updates_per_batch} must be >= 1 and divide "
         f"{self.GROUPS} x group_size = {self.batch_size}")
    return self

  def _check(self, need: Callable[[bool, str, str], None]) -> None:
    """A subclass's own checks."""

  def check_run(self, batch_size: int, seq_len: int | None = None, processes: int = 1) -> None:
    """The trainer's batch shape must be this rollout's: `seq_len` wide, one mini-batch of
    every process per step."""
    if seq_len is not None and seq_len != self.seq_len:
      raise ValueError(f"config.train.seq_len ({seq_len}) must equal the {self.SECTION} seq_len "
                       f"({self.seq_len})")
    want = self.minibatch_size * processes
    if batch_size != want:
      raise ValueError(f"config.train.batch_size: {batch_size}, but the {self.SECTION} gives "
                       f"{self.GROUPS} x group_size / updates_per_batch x processes = "
                       f"{self.groups_per_batch} x {self.group_size} / {self.updates_per_batch}"
                       f" x {processes} = {want} rows per update")

  def sampling_params(self, greedy: bool = False, **kw: Any) -> SamplingParams:
    """The rollout's sampling (or greedy decoding, for evaluation) of one reply."""
    if greedy:
      return SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens, **kw)
    return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                          max_new_tokens=self.max_new_tokens, **kw)


# ---------------------------------------------------------------------------- rewards
@dataclasses.dataclass
class Rewards:
  """A reward's verdict on a rollout batch, one entry per sample in group order: `values` [N]
  (NaN where no valid reward could be given: that sample is left out of its group, never
  scored 0), `details` per sample (what the reward recorded, for logs and `source.last`), and
  `metrics`, the reward's own figures (e.g. judge failures) for the trainer's log."""
  values: np.ndarray
  details: list[Any] = dataclasses.field(default_factory=list)
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def valid(self) -> np.ndarray:
    return np.isfinite(self.values)


class GroupReward(Protocol):
  """Scores a rollout batch: samples in group order (each sample carries its context: the
  prompt item and reply, or the whole episode with its verdict) -> `Rewards`."""

  def __call__(self, samples: Sequence[Any]) -> Rewards: ...


# ---------------------------------------------------------------------------- group credit
def group_advantages_valid(rewards_N: np.ndarray, group_size: int, eps: float = 1e-6
                           ) -> tuple[np.ndarray, np.ndarray, int]:
  """(advantages, keep, groups skipped): group advantages over each group's VALID rewards only
  (NaN marks an invalid reward: a failed judgement, excluded and never scored). Invalid rows get
  advantage 0 and `keep` False; a group with fewer than 2 valid rewards is skipped (all its rows
  `keep` False) and counted. With every reward valid this is `(r - group mean) / (group std,
  ddof 1, + eps)`, what `lwm_jax.train.losses.group_advantages` computes on device."""
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


@dataclasses.dataclass
class Credit:
  """How a rollout batch is weighted: `advantages` ([N], or [N, seq_len] per token),
  `keep` [N] (False: an invalid reward or a skipped group), `flat` [G] (groups whose valid
  rewards are all equal: no signal) and `skipped`, the groups with fewer than 2 valid rewards."""
  advantages: np.ndarray
  keep: np.ndarray
  flat: np.ndarray
  skipped: int = 0


def group_credit(samples: Sequence[Any], rewards: np.ndarray, cfg: GroupConfig) -> Credit:
  """Per-sample credit normalised within each group, over the valid rewards only."""
  del samples
  adv, keep, skipped = group_advantages_valid(rewards, cfg.group_size, cfg.adv_eps)
  flat = np.array([np.isfinite(g).sum() >= 2 and np.ptp(g[np.isfinite(g)]) == 0
                   for g in np.asarray(rewards, np.float64).reshape(-1, cfg.group_size)], bool)
  return Credit(adv, keep, flat, skipped)


# ---------------------------------------------------------------------------- the worker
class RolloutWorker:
  """Owns the sampler, the parameter sync, credit, reference log-probs, mini-batches and the
  resumable state of an RL batch source (see the module docstring).

  `model` (optional) builds the sampler at once; without it the first `sync(state)` after
  `bind(run)` builds it on the train state's parameters. `kl` adds `ref_logprobs` to every
  batch, under the policy the first rollout sampled from. `one_process` refuses a multi-process
  run (for sources whose environments are local). Engine options (`chunk_steps`, `max_batch`,
  bucket sizes, ...) pass through `engine_kw`."""

  def __init__(self, tokenizer: Any, cfg: GroupConfig, *, model: Any = None, mesh: Any = None,
               kl: bool = False, one_process: bool = False, name: str = "RolloutSource",
               process_index: int = 0, process_count: int = 1, **engine_kw: Any):
    self.cfg = cfg.validate()
    self.tok, self.kl, self.one_process, self.name = tokenizer, kl, one_process, name
    # The continuous engine: a group's G replies share one prefill of their prompt, and rows
    # leave their slots as they finish. set_params empties its prefix cache on every sync.
    engine_kw.setdefault("engine", "continuous")
    self.mesh, self.engine_kw = mesh, engine_kw
    self.sampler: Any = None
    self.graphdef = None
    self.process_index, self.process_count = process_index, process_count
    self.calls = 0
    self.pending: list[dict[str, np.ndarray]] = []
    self.metrics: dict[str, float] = {}
    self._treedef = None
    self._gather = False          # several processes: each samples with a local copy
    self._ref_params = None
    self._ref_fn = None
    if model is not None:
      self._build(model)

  # ------------------------------------------------------------------------ run and params
  def bind(self, run: Any) -> None:
    """Takes the run's graph, mesh and process layout (`lwm_jax.train.sources.Run`) and checks
    its batch shape against the rollout's."""
    if self.one_process and run.process_count != 1:
      raise ValueError(f"{self.name} runs on one process (its envs and engine are local); got "
                       f"{run.process_count} processes")
    self.cfg.check_run(run.batch_size, run.seq_len, run.process_count)
    self.graphdef = run.graphdef
    # One process: the engine decodes with the train state's arrays in place (sharded over the
    # run's mesh). Several processes: the engine runs per process, so each samples its own
    # share with a local copy of the parameters gathered from all processes.
    self._gather = run.process_count > 1
    if self.mesh is None and not self._gather:
      self.mesh = run.mesh
    self.process_index, self.process_count = run.process_index, run.process_count

  def _build(self, model: Any) -> None:
    self.sampler = Sampler(model, self.tok, mesh=self.mesh, decode_layout="model",
                           **self.engine_kw)
    self._treedef = jax.tree.structure(self.sampler.engine.state)

  def set_params(self, params: Any) -> None:
    """The sampler decodes with `params` (an `nnx.State` of the policy) from now on, used in
    place: no copy, no save or load."""
    if self.sampler is None:
      raise RuntimeError(f"{self.name}: no model yet (give one, or bind(run) first)")
    if jax.tree.structure(params) != self._treedef:
      raise ValueError(f"{self.name}: the parameter tree does not match the rollout model's "
                       "(another model config?)")
    self.sampler.engine.set_params(params)

  def sync(self, state: Any) -> None:
    """Points the sampler at the policy `state` (a TrainState or a parameter state; None keeps
    the parameters last handed in), building it on the first call."""
    params = self._local(getattr(state, "params", state))
    if self.sampler is None:
      if params is None or self.graphdef is None:
        raise RuntimeError(f"{self.name}: give a model, or bind(run) and pass the train state "
                           "to next_batch")
      self._build(nnx.merge(self.graphdef, params))
    elif params is not None:
      self.set_params(params)

  def _local(self, params: Any) -> Any:
    """`params` as the engine takes them: in place, or a local copy when processes share the
    parameters (gathered from all of them)."""
    if params is None or not self._gather:
      return params
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    host = multihost_utils.process_allgather(params, tiled=True)
    return jax.tree.map(jnp.asarray, host)

  # ------------------------------------------------------------------------ one rollout
  def rollout(self, state: Any, generate: Callable[[Any, int], Sequence[Any]],
              reward: GroupReward, layout: Callable[[Sequence[Any], np.ndarray, np.ndarray],
                                                    dict[str, np.ndarray]],
              credit: Callable[[Sequence[Any], np.ndarray, GroupConfig], Credit] = group_credit
              ) -> tuple[dict[str, np.ndarray], Sequence[Any], Rewards]:
    """One whole rollout batch from the policy `state`: (batch, samples, rewards).

    `generate(sampler, call)` gives `batch_size` samples in group order, `reward` scores them,
    `credit` turns the rewards into advantages (group-normalised over the valid ones unless
    the source says otherwise) and `layout(samples, advantages, train_rows)` writes the rows;
    a row whose `train_rows` entry is False (invalid reward, skipped group, or a flat group
    under `filter_zero_variance`) must get an empty response mask."""
    self.sync(state)
    if self.kl and self._ref_params is None:  # the policy of the first rollout, kept aside
      self._ref_params = jax.tree.map(jnp.copy, self.sampler.engine.state)
    c = self.cfg
    t0 = time.perf_counter()
    samples = generate(self.sampler, self.calls)
    if len(samples) != c.batch_size:
      raise AssertionError(f"{self.name}: {len(samples)} samples, want {c.batch_size}")
    t1 = time.perf_counter()
    scored = reward(samples)
    t2 = time.perf_counter()
    cr = credit(samples, scored.values, c)
    filtered = cr.flat if c.filter_zero_variance else np.zeros_like(cr.flat)
    train_rows = cr.keep & ~np.repeat(filtered, c.group_size)
    batch = layout(samples, cr.advantages, train_rows)
    if self.kl:
      batch["ref_logprobs"] = self.reference_logprobs(batch)
    self.calls += 1
    ok = scored.values[scored.valid]
    self.metrics = {"rollout_s": t1 - t0, "reward_s": t2 - t1,
                    "reward_mean": float(ok.mean()) if len(ok) else float("nan"),
                    "reward_std": float(ok.std()) if len(ok) else float("nan"),
                    "invalid_rewards": float((~scored.valid).sum()),
                    "zero_variance_groups": float(cr.flat.sum()),
                    "filtered_groups": float(filtered.sum()),
                    "groups_skipped": float(cr.skipped),
                    "samples": float(len(samples))}
    self.metrics.update(scored.metrics)
    return batch, samples, scored

  def reference_logprobs(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
    """log p of each token under the reference policy (the parameters of the first rollout),
    aligned like `old_logprobs` (0 on padding), by the train steps' `sequence_logprobs`."""
    if self._ref_params is None:
      raise RuntimeError(f"{self.name}: no reference policy yet (the first rollout sets it)")
    if self._ref_fn is None:
      graphdef = self.graphdef if self.graphdef is not None else nnx.graphdef(self.sampler.model)
      self._ref_fn = jax.jit(lambda params, b: steps.sequence_logprobs(graphdef, params, b))
    keys = ("tokens", "positions", "segment_ids")
    lp = self._ref_fn(self._ref_params, {k: batch[k] for k in keys})
    return np.asarray(jax.device_get(lp), np.float32) * (batch["segment_ids"] > 0)

  # ------------------------------------------------------------------------ mini-batches
  def next_batch(self, make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The next mini-batch: the next slice of the current rollout batch, or, when that is used
    up, the first slice of a new one (`make()`)."""
    if not self.pending:
      batch = make()
      k, rows = self.cfg.updates_per_batch, self.cfg.minibatch_size
      self.pending = [{n: v[j * rows:(j + 1) * rows] for n, v in batch.items()}
                      for j in range(k)]
    self.metrics["minibatch"] = float(self.cfg.updates_per_batch - len(self.pending))
    return self.pending.pop(0)

  # ------------------------------------------------------------------------ resume
  def get_state(self) -> dict[str, Any]:
    """JSON-able: the seed, the rollout counter and the rollout's unused mini-batches (base64
    of a compressed npz; empty at a rollout boundary or with one update per batch)."""
    return {"calls": self.calls, "seed": self.cfg.seed,
            "pending": [_pack(b) for b in self.pending]}

  def set_state(self, state: Mapping[str, Any], what: str = "rollout") -> None:
    if int(state.get("seed", self.cfg.seed)) != self.cfg.seed:
      raise ValueError(f"{what} state was saved with seed {state['seed']}, this run has "
                       f"{self.cfg.seed}")
    self.calls = int(state["calls"])
    self.pending = [_unpack(b) for b in state.get("pending", [])]


def _pack(batch: Mapping[str, np.ndarray]) -> str:
  buf = io.BytesIO()
  np.savez_compressed(buf, **batch)
  return base64.b64encode(buf.getvalue()).decode("ascii")


def _unpack(text: str) -> dict[str, np.ndarray]:
  with np.load(io.BytesIO(base64.b64decode(text))) as z:
    return {k: z[k] for k in z.files}
