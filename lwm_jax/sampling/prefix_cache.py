"""A cache of prefilled prompt prefixes for the continuous engine, keyed by token ids.

Prompts are cut into blocks of `block` tokens; the key of the prefix made of the first k blocks is
a hash chained over those blocks (the hash of block k covers block k and the key of the k - 1
blocks before it), so one pass over a prompt gives the keys of all its block-aligned prefixes. An
entry holds what a decode slot needs to continue from that prefix: every layer's attention keys
and values for the prefix's positions and, for linear-attention layers, the recurrent and
convolution state after its last token. An entry also keeps the prefix's token ids and is used only
when they equal the prompt's, so a hash collision can never hand a request someone else's state.

Which prefixes are stored: prefilling a prompt snapshots its state at (a) the longest block
boundary it shares with a prompt seen before (a system prompt several requests repeat; the block
keys of recent prompts are remembered without their state, in a bounded set) and (b) the last
block boundary before its final token (the same prompt asked again). A later prompt that starts
with a stored prefix restores it and prefills only the rest.

Memory: the entries' bytes never exceed `max_bytes`; storing past the bound evicts the least
recently used entries first, and an entry larger than the whole bound is not stored. Counters
(lookups, hits, prompt tokens queried and tokens served from the cache, evictions) feed the
server's `/metrics`.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from typing import Any, Sequence

import jax
import numpy as np


def tree_bytes(tree: Any) -> int:
  return sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


@dataclasses.dataclass
class Entry:
  ids: tuple[int, ...]  # the prefix's token ids
  state: Any  # the per-layer cache of one row, attention trimmed to the prefix's length bucket
  nbytes: int


class PrefixCache:
  """LRU store of prefilled prefixes under a byte bound (see the module docstring)."""

  def __init__(self, max_bytes: int, block: int = 16, remember_blocks: int = 65536):
    if block < 1:
      raise ValueError(f"prefix cache block: must be at least 1 token, got {block}")
    if max_bytes < 0:
      raise ValueError(f"prefix cache max_bytes: must be >= 0, got {max_bytes}")
    self.max_bytes, self.block, self.remember = int(max_bytes), int(block), int(remember_blocks)
    self._entries: collections.OrderedDict[bytes, Entry] = collections.OrderedDict()
    self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
    self._lock = threading.Lock()
    self.bytes = 0
    self.lookups = self.hits = 0
    self.query_tokens = self.hit_tokens = 0
    self.stored = self.evicted = self.too_large = 0

  # ------------------------------------------------------------------------ keys
  def keys(self, ids: Sequence[int]) -> list[bytes]:
    """keys[k - 1] is the key of the prefix of the first k whole blocks of `ids`."""
    out, prev = [], b""
    arr = np.asarray(ids, np.int64)
    for k in range(len(arr) // self.block):
      h = hashlib.blake2b(prev, digest_size=16)
      h.update(arr[k * self.block:(k + 1) * self.block].tobytes())
      prev = h.digest()
      out.append(prev)
    return out

  # ------------------------------------------------------------------------ use
  def lookup(self, ids: Sequence[int], limit: int) -> tuple[int, Entry | None]:
    """(length, entry) of the longest stored prefix of `ids` no longer than `limit` tokens, or
    (0, None). Counts the lookup for the hit rate."""
    keys = self.keys(ids[:limit])
    with self._lock:
      self.lookups += 1
      self.query_tokens += len(ids)
      for k in range(len(keys), 0, -1):
        e = self._entries.get(keys[k - 1])
        if e is not None and e.ids == tuple(ids[:k * self.block]):
          self._entries.move_to_end(keys[k - 1])
          self.hits += 1
          self.hit_tokens += k * self.block
          return k * self.block, e
    return 0, None

  def snapshot_points(self, ids: Sequence[int], start: int) -> list[tuple[int, bytes]]:
    """The (length, key) boundaries, after `start` and before the prompt's last token, at which
    prefilling `ids` should store its state (see the module docstring); records the prompt's
    blocks as seen."""
    if self.max_bytes == 0:
      return []
    keys = self.keys(ids[:len(ids) - 1])
    points = {}
    with self._lock:
      shared = 0
      for k in range(len(keys), 0, -1):
        if keys[k - 1] in self._seen:
          shared = k
          break
      for k in (shared, len(keys)):
        if k and k * self.block > start and keys[k - 1] not in self._entries:
          points[k * self.block] = keys[k - 1]
      for key in keys:
        self._seen[key] = None
        self._seen.move_to_end(key)
      while len(self._seen) > self.remember:
        self._seen.popitem(last=False)
    return sorted(points.items())

  def store(self, key: bytes, ids: Sequence[int], state: Any) -> bool:
    """Stores a prefix's state, evicting least recently used entries to stay within the bound.
    False when it is larger than the whole bound (then nothing is evicted)."""
    nbytes = tree_bytes(state)
    with self._lock:
      if nbytes > self.max_bytes:
        self.too_large += 1
        return False
      old = self._entries.pop(key, None)
      if old is not None:
        self.bytes -= old.nbytes
      while self._entries and self.bytes + nbytes > self.max_bytes:
        _, gone = self._entries.popitem(last=False)
        self.bytes -= gone.nbytes
        self.evicted += 1
      self._entries[key] = Entry(tuple(int(t) for t in ids), state, nbytes)
      self.bytes += nbytes
      self.stored += 1
      return True

  def clear(self) -> None:
    with self._lock:
      self._entries.clear()
      self._seen.clear()
      self.bytes = 0

  def __len__(self) -> int:
    return len(self._entries)

  def stats(self) -> dict[str, float]:
    with self._lock:
      return {"lookups": self.lookups, "hits": self.hits, "query_tokens": self.query_tokens,
              "hit_tokens": self.hit_tokens, "entries": len(self._entries), "bytes": self.bytes,
              "max_bytes": self.max_bytes, "stored": self.stored, "evicted": self.evicted,
              "too_large": self.too_large,
              "hit_rate": self.hits / self.lookups if self.lookups else 0.0,
              "token_hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0}
