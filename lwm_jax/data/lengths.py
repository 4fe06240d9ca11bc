"""Fitting samples into the token budget (`seq_len`).

CPT (`cpt_windows`): a trajectory becomes one or more documents, each the system prompt followed
by consecutive turns. When the system prompt and a turn do not fit together (a long action space,
a short `seq_len`), the document windows the turn: the system prompt's content is shortened from
its end, down to a quarter of the budget, and if the turn still does not fit, its action keeps at
most half of the room left and the observation the rest. So every document carries observation
tokens whatever the budget, instead of being all system prompt.

SFT and RL prompts (`fit_history`): with policy `drop` (the recipe) a sample longer than the
budget is dropped and counted; `truncate_history` keeps the old behaviour of dropping the oldest
history turns (then shortening the system prompt). `SkipMarked` removes dropped samples from a
Grain stream and adds their count to the next sample it yields, so the trainer's statistics see
every drop.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import grain
import numpy as np

from lwm_jax.data.tokenizer import Tokenizer

OVERLONG_POLICIES = ("drop", "truncate_history")
Encoded = tuple[list[int], list[float]]


def shorten_message(tok: Tokenizer, ids: list[int], w: list[float], role: str, size: int
                    ) -> tuple[list[int], list[float]]:
  """A message's encoding cut to at most `size` tokens by dropping content from its end (the
  `<|im_start|>role` head and the `<|im_end|>` tail stay)."""
  if len(ids) <= size:
    return list(ids), list(w)
  head = 1 + len(tok.encode(role + "\n"))
  tail = 1 + len(tok.encode("\n"))
  keep = max(head, size - tail)
  return ids[:keep] + ids[-tail:], w[:keep] + w[-tail:]


def cpt_windows(tok: Tokenizer, system: Encoded, turns: Sequence[tuple[Encoded, Encoded]],
                seq_len: int) -> tuple[list[Encoded], int]:
  """Documents of one trajectory (see the module docstring) and how many turns were cut."""
  sys_ids, sys_w = system
  docs: list[Encoded] = []
  cur: Encoded | None = None
  cut = 0
  for (u_ids, u_w), (a_ids, a_w) in turns:
    n = len(u_ids) + len(a_ids)
    if cur is not None and len(cur[0]) + n <= seq_len:
      cur = (cur[0] + u_ids + a_ids, cur[1] + u_w + a_w)
      continue
    if cur is not None:
      docs.append(cur)
    if len(sys_ids) + n <= seq_len:
      cur = (sys_ids + u_ids + a_ids, sys_w + u_w + a_w)
      continue
    s_ids, s_w = shorten_message(tok, sys_ids, sys_w, "system",
                                 max(seq_len - n, min(len(sys_ids), seq_len // 4)))
    room = seq_len - len(s_ids)
    if n > room:
      keep_u = min(len(u_ids), room // 2)
      u_ids, u_w = u_ids[:keep_u], u_w[:keep_u]
      a_ids, a_w = a_ids[:room - keep_u], a_w[:room - keep_u]
      cut += 1
    cur = (s_ids + u_ids + a_ids, s_w + u_w + a_w)
  if cur is not None:
    docs.append(cur)
  return docs, cut


def fit_history(tok: Tokenizer, msgs: list[dict], budget: int, target_weight: float,
                add_generation_prompt: bool = False, history_weight: float = 0.0):
  """Encodes system + history + target, dropping the oldest history pairs to fit `budget`
  (policy `truncate_history`); returns (ids, weights, pairs dropped, 1 if anything was cut).
  The history's assistant replies get `history_weight` (0: only the target is in the loss)."""
  enc = [tok.encode_message(m, history_weight if m["role"] == "assistant" else 0.0)
         for m in msgs[:-1]]
  last = (tok.encode_message(msgs[-1], target_weight) if not add_generation_prompt
          else tok.encode_message(msgs[-1]))
  tail_ids = last[0] + (tok.generation_prompt() if add_generation_prompt else [])
  tail_w = last[1] + ([0.0] * (len(tail_ids) - len(last[1])))
  n_hist = (len(enc) - 1) // 2
  # history pairs are enc[1:1 + 2 * n_hist]; for sft the target user message is enc[-1]
  hist = [enc[1 + 2 * j][0] + enc[2 + 2 * j][0] for j in range(n_hist)]
  hist_w = [enc[1 + 2 * j][1] + enc[2 + 2 * j][1] for j in range(n_hist)]
  rest = enc[1 + 2 * n_hist:]
  fixed = len(enc[0][0]) + sum(len(r[0]) for r in rest) + len(tail_ids)
  total = fixed + sum(len(h) for h in hist)
  drop = 0
  while total > budget and drop < n_hist:
    total -= len(hist[drop])
    drop += 1
  sys_ids, sys_w = list(enc[0][0]), list(enc[0][1])
  cut = 0
  if total > budget:  # even without history: shorten the system prompt's content from its end
    sys_ids, sys_w = shorten_message(tok, sys_ids, sys_w, msgs[0]["role"],
                                     len(sys_ids) - (total - budget))
    cut = 1
  ids, w = sys_ids, sys_w
  for h, hw in zip(hist[drop:], hist_w[drop:]):
    ids += h
    w += hw
  for r in rest:
    ids += r[0]
    w += r[1]
  ids += tail_ids
  w += tail_w
  return ids[:budget], w[:budget], drop, cut


DROPPED = {"overlong": np.ones((), np.int32)}  # the marker a sample function returns to drop


class _SkipMarkedIterator(grain.DatasetIterator):

  def __init__(self, parent: grain.DatasetIterator, limit: int, key: str):
    super().__init__(parent)
    self._limit, self._key, self._pending = limit, key, 0

  def __next__(self) -> dict[str, Any]:
    run = 0
    while True:
      try:
        x = next(self._parent)
      except StopIteration:
        if self._pending:
          logging.warning("%d over-long samples dropped at the end of the data were not counted "
                          "in the iterator's statistics", self._pending)
          self._pending = 0
        raise
      if "overlong" not in x:
        break
      self._pending += 1
      run += 1
      if run > self._limit:
        raise ValueError(f"{run} samples in a row are longer than the token budget and were "
                         f"dropped: every sample of the split is; raise `seq_len` or set "
                         f"`overlong='truncate_history'`")
    x = dict(x)
    n = x[self._key]
    if isinstance(n, np.ndarray):  # a train sample's per-token stat: the count sits at index 0
      n = n.copy()
      n[0] += self._pending
    else:
      n += self._pending
    x[self._key], self._pending = n, 0
    return x

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._parent.get_state(), "pending": self._pending}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self._pending = int(state["pending"])


class SkipMarked(grain.IterDataset):
  """Drops samples marked `DROPPED`, adding their count to field `key` of the next sample; more
  than `limit` drops in a row is an error (nothing in the split fits)."""

  def __init__(self, parent: grain.IterDataset, limit: int, key: str = "n_overlong"):
    super().__init__(parent)
    self._limit, self._key = limit, key

  def __iter__(self) -> _SkipMarkedIterator:
    return _SkipMarkedIterator(self._parent.__iter__(), self._limit, self._key)
