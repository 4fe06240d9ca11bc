"""Synthetic batches for tests, benchmarks and smoke runs (`data.source = "synthetic"`).

Next-token batches (CPT/SFT) have the data pipeline's exact format: each row packs segments of "counting" sequences (start + i * stride mod vocab, with a few random
tokens), so a model can learn them; segment ids restart per row, 0 marks padding; loss weights are 1
on every real token (the pipeline's cross-segment/padding exclusion happens in the loss). Batch k is a
pure function of (seed, k, process index), so an iterator's state is just the next k.

RL batches come from a toy rollout task (`SyntheticRollouts`): G random responses to each random
prompt, rewarded by the share of response tokens below vocab/4, so a policy can learn it by
shifting probability to low token ids. It stands in for the rollout sources of lwm_jax/rl/.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import jax.numpy as jnp
import ml_collections
import numpy as np

from lwm_jax.stages import get_stage
from lwm_jax.train import losses
from lwm_jax.train import sources as sources_lib


def synthetic_batch(seed: int, index: int, batch: int, seq_len: int, vocab: int,
                    process_index: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng([seed, index, process_index])
  tokens = np.zeros((batch, seq_len), np.int32)
  positions = np.zeros((batch, seq_len), np.int32)
  segs = np.zeros((batch, seq_len), np.int32)
  for b in range(batch):
    at, seg = 0, 1
    fill = seq_len - int(rng.integers(0, max(seq_len // 8, 1)))  # a little padding at the end
    while at < fill:
      n = int(min(rng.integers(max(seq_len // 4, 2), seq_len + 1), fill - at))
      start, stride = int(rng.integers(0, vocab)), int(rng.integers(1, 4))
      seq = (start + stride * np.arange(n)) % vocab
      noise = rng.random(n) < 0.05
      seq[noise] = rng.integers(0, vocab, int(noise.sum()))
      tokens[b, at:at + n] = seq
      positions[b, at:at + n] = np.arange(n)
      segs[b, at:at + n] = seg
      at += n
      seg += 1
  return {"tokens": tokens, "positions": positions, "segment_ids": segs,
          "loss_weights": (segs > 0).astype(np.float32)}


class SyntheticIterator:
  """An endless iterator of this process's share of each global batch, with get_state/set_state."""

  def __init__(self, batch: int, seq_len: int, vocab: int, seed: int = 0, process_index: int = 0,
               process_count: int = 1):
    if batch % process_count:
      raise ValueError(f"train.batch_size={batch} is not divisible by {process_count} processes")
    self.local_batch = batch // process_count
    self.seq_len, self.vocab, self.seed = seq_len, vocab, seed
    self.process_index = process_index
    self.index = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    out = synthetic_batch(self.seed, self.index, self.local_batch, self.seq_len, self.vocab,
                          self.process_index)
    self.index += 1
    return out

  def get_state(self) -> dict[str, Any]:
    return {"index": self.index}

  def set_state(self, state: dict[str, Any]) -> None:
    self.index = int(state["index"])


# ----------------------------------------------------------------------- toy RL rollouts
def rollout_batch(rng: np.random.Generator, batch: int, seq_len: int, resp_len: int, vocab: int,
                  group: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """(batch without log-probs and advantages, reward per row): `group` random responses of
  `resp_len` tokens to each of batch/group random prompts filling the rest of `seq_len`."""
  n_prompts = batch // group
  prompt_len = seq_len - resp_len
  prompts = rng.integers(0, vocab, (n_prompts, prompt_len))
  tokens = np.concatenate([np.repeat(prompts, group, 0),
                           rng.integers(0, vocab, (batch, resp_len))], axis=1).astype(np.int32)
  mask = np.zeros((batch, seq_len), np.float32)
  mask[:, prompt_len:] = 1
  b = {"tokens": tokens,
       "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch, seq_len)).copy(),
       "segment_ids": np.ones((batch, seq_len), np.int32), "response_mask": mask}
  return b, low_token_reward(tokens[:, prompt_len:], vocab)


def low_token_reward(response_BxT: np.ndarray, vocab: int) -> np.ndarray:
  """The toy task's reward: the share of response tokens below vocab/4."""
  return (response_BxT < vocab // 4).mean(axis=1)


class SyntheticRollouts:
  """A batch source of toy GSPO batches: rollouts from `rollout_batch`, their log-probs under the
  current policy as `old_logprobs` (so the first update is exactly on-policy) and group-normalised
  advantages. Batch k is a pure function of (seed, k, process index); the state is the next k."""

  def __init__(self, group_size: int, response_len: int, seed: int = 0):
    self.group, self.response_len, self.seed = group_size, response_len, seed
    self.index = 0
    self._run: sources_lib.Run | None = None
    self._logprobs: Callable | None = None

  def bind(self, run: sources_lib.Run) -> None:
    from lwm_jax.train import steps  # pylint: disable=import-outside-toplevel
    if run.batch_size % run.process_count:
      raise ValueError(f"config.train.batch_size: {run.batch_size} is not divisible by "
                       f"{run.process_count} processes")
    self._run = run
    shape = (run.batch_size, run.seq_len)
    self._logprobs = steps.compile_logprobs(
        run.graphdef, run.mesh, run.shardings,
        {k: shape for k in ("tokens", "positions", "segment_ids")})

  def next_batch(self, state: Any) -> dict[str, Any]:
    r = self._run
    if r is None:
      raise RuntimeError("SyntheticRollouts.bind(run) must be called before next_batch")
    rng = np.random.default_rng([r.seed, self.index, r.process_index])
    b, rewards = rollout_batch(rng, r.batch_size // r.process_count, r.seq_len,
                               self.response_len, r.model_cfg.vocab_size, self.group)
    b["old_logprobs"] = self._logprobs(state, {k: b[k] for k in ("tokens", "positions",
                                                                 "segment_ids")})
    b["advantages"] = np.asarray(losses.group_advantages(jnp.asarray(rewards), self.group),
                                 np.float32)
    self.index += 1
    return b

  def get_state(self) -> dict[str, Any]:
    return {"index": self.index}

  def set_state(self, state: dict[str, Any]) -> None:
    self.index = int(state["index"])

  def describe(self) -> str:
    return "synthetic rollouts (data.source=synthetic)"


def sources_from_config(c: ml_collections.ConfigDict, vocab: int, process_index: int = 0,
                        process_count: int = 1
                        ) -> tuple[Any, Callable[[], Iterator] | None, str]:
  """(train source, eval-batch factory or None, tokenizer path "") for `data.source="synthetic"`:
  toy rollouts for the rl stage, counting sequences otherwise."""
  t = c.train
  if get_stage(c.stage).policy:
    return SyntheticRollouts(c.rl.group_size, c.rl.response_len, c.seed), None, ""
  it = SyntheticIterator(t.batch_size, t.seq_len, vocab, c.seed, process_index, process_count)
  def evals():
    return SyntheticIterator(t.batch_size, t.seq_len, vocab, c.seed + 10_000, process_index,
                             process_count)
  return sources_lib.IteratorSource(it, "synthetic batches (data.source=synthetic)"), evals, ""
