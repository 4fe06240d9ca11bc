"""Synthetic batches in the data pipeline's exact format, for tests, benchmarks and smoke runs.

Each row packs segments of "counting" sequences (start + i * stride mod vocab, with a few random
tokens), so a model can learn them; segment ids restart per row, 0 marks padding; loss weights are 1
on every real token (the pipeline's cross-segment/padding exclusion happens in the loss). Batch k is a
pure function of (seed, k, process index), so an iterator's state is just the next k.
"""
from __future__ import annotations

from typing import Any

import numpy as np


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
