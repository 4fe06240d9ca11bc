"""From generated token ids to text: incremental decoding, stop strings, streamed deltas.

`RowText` follows one generated sequence as its tokens arrive in chunks. It re-decodes the ids
(byte-level BPE pieces only make sense together), cuts the text at the first stop string, and hands
out only text that can no longer change: a trailing incomplete UTF-8 character, or a tail that
could still grow into a stop string or a thinking tag, is held back until the next chunk.
Streamed text is split into reasoning and content by the `<think>` tags as it goes; the final,
non-streamed split uses `lwm_jax.data.reply.split_reasoning`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from lwm_jax.data.reply import THINK_CLOSE, THINK_OPEN


def _held_tail(text: str, patterns: Sequence[str]) -> int:
  """Length of the longest suffix of `text` that is a proper prefix of some pattern."""
  best = 0
  for p in patterns:
    for k in range(min(len(p) - 1, len(text)), best, -1):
      if text.endswith(p[:k]):
        best = k
        break
  return best


@dataclasses.dataclass
class Delta:
  """Newly final text: `raw` as generated, and the same split into content and reasoning (the
  `<think>` tags themselves dropped)."""
  content: str = ""
  reasoning: str = ""
  raw: str = ""

  def __bool__(self) -> bool:
    return bool(self.content or self.reasoning or self.raw)


class RowText:
  """Text state of one generated row (see the module docstring)."""

  def __init__(self, tokenizer, stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
               hidden_ids: Sequence[int] = (), thinking: bool = False, min_tokens: int = 0,
               include_stop: bool = False):
    """`hidden_ids` (end tokens) never appear in the text, wherever they are generated (with
    `ignore_eos` too); `thinking`: the prompt opened a `<think>` block the reply starts in.
    Stop strings are looked for once `min_tokens` tokens are there (an occurrence that ends
    before is text); `include_stop` keeps the stop string at the end of the text."""
    self.tok = tokenizer
    self.min_tokens, self.include_stop = min_tokens, include_stop
    self._stop_from = 0        # a stop string must end after this character
    self.stop_str: str | None = None
    self.content = ""          # everything handed out, split as streamed
    self.reasoning = ""
    self.stop = [s for s in stop if s]
    self.stop_ids = set(int(t) for t in stop_token_ids)
    self.hidden = set(int(t) for t in hidden_ids)
    self._vocab = tokenizer.vocab_size
    self.ids: list[int] = []
    self.logprobs: list[float] = []
    self.text = ""
    self.stopped = False       # a stop string was found
    self._emitted = 0          # characters of self.text handed out
    self._thinking = thinking  # streaming split state
    self._pending = ""         # emitted text not yet classified (may hold a partial tag)

  def _decode(self, ids: list[int]) -> str:
    if ids and ids[-1] in self.stop_ids:
      ids = ids[:-1]  # the end-of-turn token is not part of the text
    # A model's vocabulary may be padded past the tokenizer's: such ids have no text.
    return self.tok.decode([i for i in ids if i < self._vocab and i not in self.hidden])

  def feed(self, ids: Sequence[int], logprobs: Sequence[float]) -> Delta:
    """Adds new tokens; returns the text that became final (empty Delta when none did)."""
    if self.stopped or not ids:
      return Delta()
    start = len(self.ids)
    self.ids += [int(i) for i in ids]
    self.logprobs += [float(x) for x in logprobs]
    text = self._decode(self.ids)
    if len(self.ids) < self.min_tokens:  # too early to stop: all of this is text
      self._stop_from = len(text)
      cut = None
    else:
      first = max(start, self.min_tokens - 1)
      if first > start:  # min_tokens is reached inside this chunk
        self._stop_from = len(self._decode(self.ids[:first]))
      cut = self._find_stop(text)
    if cut is not None:
      self.stopped = True
      hit = self.stop_str
      # Keep the tokens up to the one that completed the stop string.
      for k in range(max(start, self.min_tokens - 1) + 1, len(self.ids) + 1):
        if self._find_stop(self._decode(self.ids[:k])) is not None:
          self.ids, self.logprobs = self.ids[:k], self.logprobs[:k]
          break
      self.stop_str = hit
      text = text[:cut + (len(hit) if self.include_stop else 0)]
    self.text = text
    if self.stopped:
      safe = len(text)
    else:
      safe = len(text) - _held_tail(text, self.stop)
      while safe > self._emitted and text[safe - 1] == "\ufffd":
        safe -= 1
    return self._emit(safe, final=False)

  def finish(self) -> Delta:
    """All remaining text (call once generation of the row has ended)."""
    return self._emit(len(self.text), final=True)

  def _find_stop(self, text: str) -> int | None:
    hits = [(i, s) for i, s in ((text.find(s, max(0, self._emitted - len(s),
                                                  self._stop_from - len(s) + 1)), s)
                                for s in self.stop) if i >= 0]
    if not hits:
      return None
    at, self.stop_str = min(hits)
    return at

  def _emit(self, upto: int, final: bool) -> Delta:
    out = Delta()
    if upto > self._emitted:
      out.raw = self.text[self._emitted:upto]
      self._pending += out.raw
      self._emitted = upto
    while self._pending:
      tag = THINK_CLOSE if self._thinking else THINK_OPEN
      i = self._pending.find(tag)
      if i >= 0:
        self._add(out, self._pending[:i])
        self._pending = self._pending[i + len(tag):]
        self._thinking = not self._thinking
        continue
      keep = 0 if final else _held_tail(self._pending, [tag])
      self._add(out, self._pending[:len(self._pending) - keep])
      self._pending = self._pending[len(self._pending) - keep:]
      break
    return out

  def _add(self, out: Delta, s: str) -> None:
    if self._thinking:
      out.reasoning += s
      self.reasoning += s
    else:
      out.content += s
      self.content += s
