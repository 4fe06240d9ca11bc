"""The reply format of a world model: its tags, the thinking target, and reading a reply back.

One home for the format, used by data (training targets), sampling (the server's reasoning split),
sim (observations of a simulated environment) and eval (predictions handed to the judge).

A thinking-mode reply looks like `<think>...</think>` then
`<predicted_observation>...</predicted_observation>`. Real replies deviate: the opening `<think>`
may sit in the chat template (the reply then starts inside the reasoning and only `</think>`
appears), a reply cut off by the token budget never closes `<think>`, a model may write a draft
block while reasoning, and a non-thinking model writes the observation bare.

The rules, applied in this order:

1. Reasoning. Every closed `<think>...</think>` span is reasoning. A `</think>` left without an
   opening closes reasoning that began at the start of the reply (template-injected `<think>`).
   A `<think>` left without a closing makes everything after it reasoning (the reply was cut off
   while thinking). What remains is the content.
2. Prediction. In the content, the LAST complete `<predicted_observation>...</predicted_observation>`
   block wins, even when an unclosed opening tag follows it: a reply cut off at the token limit
   must not score as its truncated tail. Only when the content holds no complete block is an
   unclosed opening tag tolerated: the text after it is the prediction (cut off while answering).
   A closing tag with no opening (the opening was in the prompt) ends the prediction. Without any
   tag, the whole content, stripped, is the prediction. A prediction that starts with the
   observation header of the history turns (a model trained without thinking answers the way those
   turns read) loses the header: it belongs to the prompt's format, not to the world.
3. Unclosed reasoning is all reasoning. When rule 1 found an unclosed `<think>`, a block written
   inside that unfinished reasoning is NOT a prediction (the official parser treats the whole
   tail as reasoning): the prediction is what rule 2 finds in the content before the `<think>`,
   usually nothing. A reply cut off at the token limit while thinking therefore predicts nothing
   and is never paid for a draft. The same rule serves RL rewards, evaluation and the simulator.
   Reasoning text itself never becomes a prediction, so thinking never reaches a judge.
"""
from __future__ import annotations

import re

from lwm_jax.data.bench_records import OBSERVATION_HEADER, parse_observation

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
OBS_OPEN = "<predicted_observation>"
OBS_CLOSE = "</predicted_observation>"


def thinking_target(observation: str, think: str = "") -> str:
  """The assistant target of thinking mode: `<think>...</think>` then the tagged observation."""
  return f"{THINK_OPEN}{think}{THINK_CLOSE}\n{OBS_OPEN}{observation}{OBS_CLOSE}"

_CLOSED_THINK_RE = re.compile(re.escape(THINK_OPEN) + r"(.*?)" + re.escape(THINK_CLOSE), re.S)
_BLOCK_RE = re.compile(re.escape(OBS_OPEN) + r"(.*?)" + re.escape(OBS_CLOSE), re.S)


def _split(text: str) -> tuple[list[str], str, str | None]:
  """Returns (reasoning pieces, content, unclosed reasoning tail or None)."""
  pieces: list[str] = []
  # A stray `</think>` before any `<think>`: the reply began inside template-opened reasoning.
  first_close = text.find(THINK_CLOSE)
  first_open = text.find(THINK_OPEN)
  if first_close != -1 and (first_open == -1 or first_close < first_open):
    pieces.append(text[:first_close])
    text = text[first_close + len(THINK_CLOSE):]

  def _take(m: re.Match) -> str:
    pieces.append(m.group(1))
    return ""

  text = _CLOSED_THINK_RE.sub(_take, text)
  unclosed = None
  open_at = text.find(THINK_OPEN)
  if open_at != -1:
    unclosed = text[open_at + len(THINK_OPEN):]
    pieces.append(unclosed)
    text = text[:open_at]
  # A `</think>` still left closes nothing we saw; it is dropped from the content.
  text = text.replace(THINK_CLOSE, "")
  return pieces, text, unclosed


def split_reasoning(text: str) -> tuple[str, str]:
  """Returns (reasoning, content): the thinking (tags removed, pieces joined by a blank line) and
  the rest of the reply, stripped (the server's `reasoning_content` and `content`)."""
  pieces, content, _ = _split(text)
  reasoning = "\n\n".join(p.strip() for p in pieces if p.strip())
  return reasoning, content.strip()


def strip_reasoning(text: str, answer_open: str | None = None) -> str:
  """The reply without its reasoning (rule 1), stripped. With `answer_open` (an opening tag such
  as a judge's `<final_evaluation>`), an unclosed `<think>` gives back the text from the first such
  tag inside it: the model answered without closing its thinking."""
  _, content, unclosed = _split(text)
  if unclosed is not None and answer_open and answer_open not in content:
    at = unclosed.find(answer_open)
    if at != -1:
      content += unclosed[at:]
  return content.strip()


def _clean_block(s: str, keep_spaces: bool = False) -> str:
  """Drops blank lines around a block's inside and trailing spaces (with `keep_spaces`, the last
  line's trailing spaces stay); keeps first-line indentation."""
  s = re.sub(r"(?:\r?\n[ \t]*)+\Z", "", s) if keep_spaces else s.rstrip()
  return re.sub(r"\A(?:[ \t]*\r?\n)+", "", s)


def _last_block(text: str, allow_unclosed: bool, keep_spaces: bool = False) -> str | None:
  """The last complete block; else, if allowed, the text after the last unclosed opening tag."""
  blocks = list(_BLOCK_RE.finditer(text))
  if blocks:
    return _clean_block(blocks[-1].group(1), keep_spaces)
  if allow_unclosed:
    open_at = text.rfind(OBS_OPEN)
    if open_at != -1:
      return _clean_block(text[open_at + len(OBS_OPEN):], keep_spaces)
  return None


def parse_prediction(text: str, keep_spaces: bool = False) -> str:
  """The predicted observation in a model's reply, by the rules in this module's docstring.
  `keep_spaces` keeps the trailing spaces of a block's last line, which a simulated environment
  returns as written (a shell's prompt `user@host:~$ ` ends in one); scoring strips them."""
  found = _prediction(text, keep_spaces)
  if found.startswith(OBSERVATION_HEADER):
    return _strip(parse_observation(found), keep_spaces)
  return found


def _strip(s: str, keep_spaces: bool) -> str:
  return _clean_block(s.lstrip(), keep_spaces=True) if keep_spaces else s.strip()


def _prediction(text: str, keep_spaces: bool = False) -> str:
  _, content, unclosed = _split(text)
  found = _last_block(content, allow_unclosed=True, keep_spaces=keep_spaces)
  if found is not None:
    return found
  close_at = content.rfind(OBS_CLOSE)
  if close_at != -1:  # the opening tag sat in the prompt: the answer ends at the closing tag
    return _strip(content[:close_at], keep_spaces)
  return _strip(content, keep_spaces)
