"""The Python sampling API: `Sampler(model, tokenizer).generate(prompts or chats, SamplingParams)`.

A prompt is a string (used as is), a chat (a list of `{"role", "content"}` messages, rendered with
the tokenizer's ChatML template plus the assistant generation prompt), or a list of token ids.
`generate` takes one prompt or a list of them and returns a flat list of `Generation`s, prompt by
prompt, `params.n` choices each. `Sampler.from_checkpoint(dir)` loads what
`lwm_jax.checkpoints.load` finds.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from lwm_jax.data.reply import split_reasoning
from lwm_jax.sampling.engine import Engine
from lwm_jax.sampling.params import Generation, SamplingParams
from lwm_jax.sampling.text import Delta, RowText

Prompt = Any  # str | list[dict] | list[int]


@dataclasses.dataclass
class RowRequest:
  """One sequence to generate: prompt ids, its params, which choice it is, a streaming hook."""
  prompt_ids: list[int]
  params: SamplingParams
  choice: int = 0
  on_delta: Callable[[Delta], None] | None = None


def stop_token_ids(tokenizer, params: SamplingParams) -> list[int]:
  ids = list(params.stop_token_ids)
  if not params.ignore_eos and tokenizer.eos_id not in ids:
    ids.append(tokenizer.eos_id)
  return ids


def run_rows(engine: Engine, tokenizer, rows: Sequence[RowRequest]) -> list[Generation]:
  """Generates every row in one batch; streams text deltas through each row's `on_delta`."""
  stops = [stop_token_ids(tokenizer, r.params) for r in rows]
  texts = [RowText(tokenizer, r.params.stop, s) for r, s in zip(rows, stops)]

  def on_chunk(new_t, new_l):
    finished = []
    for i, (row, tr) in enumerate(zip(rows, texts)):
      if not new_t[i]:
        continue
      delta = tr.feed(new_t[i], new_l[i])
      if delta and row.on_delta is not None:
        row.on_delta(delta)
      if tr.stopped:
        finished.append(i)
    return finished

  outs = engine.generate([r.prompt_ids for r in rows], [r.params for r in rows], stops,
                         choices=[r.choice for r in rows], on_chunk=on_chunk)
  results = []
  for row, tr, out in zip(rows, texts, outs):
    tail = tr.finish()
    if tail and row.on_delta is not None:
      row.on_delta(tail)
    reasoning, content = split_reasoning(tr.text)
    results.append(Generation(text=tr.text, token_ids=tr.ids, logprobs=tr.logprobs,
                              finish_reason="stop" if tr.stopped else out.finish_reason,
                              prompt_tokens=len(row.prompt_ids), reasoning=reasoning,
                              content=content))
  return results


def _is_chat(p: Any) -> bool:
  return isinstance(p, (list, tuple)) and len(p) > 0 and all(isinstance(m, dict) for m in p)


def _is_ids(p: Any) -> bool:
  return isinstance(p, (list, tuple)) and len(p) > 0 and all(isinstance(t, int) for t in p)


class Sampler:
  """Generation for one model and tokenizer (see the module docstring)."""

  def __init__(self, model, tokenizer, *, mesh=None, **engine_kw: Any):
    self.model, self.tokenizer = model, tokenizer
    self.cfg = model.cfg
    if tokenizer.vocab_size > self.cfg.vocab_size:
      raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
                       f"{self.cfg.vocab_size}")
    self.engine = Engine(model, mesh=mesh, **engine_kw)

  @classmethod
  def from_checkpoint(cls, path: str, *, tokenizer=None, mesh=None, **engine_kw: Any) -> "Sampler":
    """A Hugging Face folder, a training workdir (latest step) or a step folder."""
    from lwm_jax import checkpoints  # pylint: disable=import-outside-toplevel
    model, tok = checkpoints.load(path, tokenizer=tokenizer, mesh=mesh)
    return cls(model, tok, mesh=mesh, **engine_kw)

  # ------------------------------------------------------------------------ prompts
  def encode_prompt(self, prompt: Prompt) -> list[int]:
    """Token ids of one prompt; raises ValueError for a malformed one."""
    if isinstance(prompt, str):
      ids = self.tokenizer.encode(prompt)
    elif _is_chat(prompt):
      for i, m in enumerate(prompt):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
          raise ValueError(f"messages[{i}]: needs string fields 'role' and 'content'")
      ids = self.tokenizer.encode_chat(list(prompt), add_generation_prompt=True)
    elif _is_ids(prompt):
      ids = [int(t) for t in prompt]
      bad = [t for t in ids if not 0 <= t < self.cfg.vocab_size]
      if bad:
        raise ValueError(f"prompt: token id {bad[0]} outside [0, {self.cfg.vocab_size})")
    else:
      raise ValueError(f"prompt: expected a string, a list of messages or a list of token ids, "
                       f"got {type(prompt).__name__}")
    self.engine.check_prompt(len(ids))
    return ids

  def _split_prompts(self, prompts: Any) -> list[Prompt]:
    if isinstance(prompts, str) or _is_chat(prompts) or _is_ids(prompts):
      return [prompts]
    if isinstance(prompts, (list, tuple)):
      return list(prompts)
    raise ValueError(f"prompts: unsupported type {type(prompts).__name__}")

  # ------------------------------------------------------------------------ generation
  def generate(self, prompts: Any, params: SamplingParams | Sequence[SamplingParams] | None = None,
               on_delta: Callable[[int, Delta], None] | None = None) -> list[Generation]:
    """Generations for one prompt or a list (one params for all, or one per prompt);
    `on_delta(row, delta)` streams text, row = prompt index * n + choice."""
    plist = self._split_prompts(prompts)
    if params is None or isinstance(params, SamplingParams):
      params = [params or SamplingParams()] * len(plist)
    if len(params) != len(plist):
      raise ValueError(f"params: {len(params)} given for {len(plist)} prompts")
    rows = []
    for p, sp in zip(plist, params):
      sp.validate()
      ids = self.encode_prompt(p)
      for c in range(sp.n):
        k = len(rows)
        cb = None if on_delta is None else (lambda d, k=k: on_delta(k, d))
        rows.append(RowRequest(ids, sp, c, cb))
    return run_rows(self.engine, self.tokenizer, rows)

  def chat(self, messages: Sequence[dict], params: SamplingParams | None = None) -> Generation:
    return self.generate([list(messages)], params)[0]
