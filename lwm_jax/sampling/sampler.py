"""The Python sampling API: `Sampler(model, tokenizer).generate(prompts or chats, SamplingParams)`.

A prompt is a string (used as is), a chat (a list of `{"role", "content"}` messages, rendered with
the checkpoint's own Jinja chat template when it ships one, else the tokenizer's ChatML, plus the
assistant generation prompt; a folder we exported ships our ChatML template, which is encoded turn by
turn as in training, `chat_template.chatml_ids`), or a list of token ids. Replies end at the end-of-turn token, the
end-of-text token and the checkpoint's `generation_config.json` eos ids; none of them ever appears
in a reply's text.
`generate` takes one prompt or a list of them and returns a flat list of `Generation`s, prompt by
prompt, `params.n` choices each. `Sampler.from_checkpoint(dir)` loads what
`lwm_jax.checkpoints.load` finds. `Sampler(..., engine="continuous")` (the default) decodes on the
continuous-batching engine (`continuous.py`: slots, shared prefixes); `engine="static"` on the
batch engine (`engine.py`); both take the engine options (`max_batch`, `chunk_steps`, ...).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from lwm_jax.data.reply import THINK_CLOSE, THINK_OPEN, split_reasoning
from lwm_jax.hf_tokenizer import OUR_TEMPLATES
from lwm_jax.sampling.chat_template import (ChatTemplate, GenerationDefaults, chatml_ids,
                                            end_token_ids)
from lwm_jax.sampling.continuous import ContinuousEngine
from lwm_jax.sampling.engine import Engine
from lwm_jax.sampling.params import Generation, SamplingParams
from lwm_jax.sampling.text import Delta, RowText

Prompt = Any  # str | list[dict] | list[int]
# engine="continuous" (default): slots that requests enter and leave, shared prefixes
# (`continuous.py`); "static": batches run to their longest row (`engine.py`).
ENGINES = {"continuous": ContinuousEngine, "static": Engine}


@dataclasses.dataclass
class RowRequest:
  """One sequence to generate: prompt ids, its params, which choice it is, a streaming hook."""
  prompt_ids: list[int]
  params: SamplingParams
  choice: int = 0
  on_delta: Callable[[Delta], None] | None = None
  starts_thinking: bool = False  # the prompt ends inside an opened <think> block


def stop_token_ids(tokenizer, params: SamplingParams, end_ids: Sequence[int] | None = None
                   ) -> list[int]:
  ids = list(params.stop_token_ids)
  if not params.ignore_eos:
    ids += [t for t in (end_ids or [tokenizer.eos_id]) if t not in ids]
  return ids


class _RowsRun:
  """The text side of generating rows: stop strings, streamed deltas, the final `Generation`s."""

  def __init__(self, tokenizer, rows: Sequence[RowRequest], end_ids: Sequence[int] | None):
    self.rows = list(rows)
    self.end_ids = list(end_ids or [tokenizer.eos_id])
    self.stops = [stop_token_ids(tokenizer, r.params, self.end_ids) for r in self.rows]
    self.texts = [RowText(tokenizer, r.params.stop, s, hidden_ids=self.end_ids,
                          thinking=r.starts_thinking, min_tokens=r.params.min_tokens,
                          include_stop=r.params.include_stop_str_in_output)
                  for r, s in zip(self.rows, self.stops)]

  def engine_args(self):
    return ([r.prompt_ids for r in self.rows], [r.params for r in self.rows], self.stops,
            [r.choice for r in self.rows])

  def on_chunk(self, new_t, new_l) -> list[int]:
    finished = []
    for i, (row, tr) in enumerate(zip(self.rows, self.texts)):
      if not new_t[i]:
        continue
      delta = tr.feed(new_t[i], new_l[i])
      if delta and row.on_delta is not None:
        row.on_delta(delta)
      if tr.stopped:
        finished.append(i)
    return finished

  def finish(self, outs) -> list[Generation]:
    results = []
    for row, tr, out in zip(self.rows, self.texts, outs):
      tail = tr.finish()
      if tail and row.on_delta is not None:
        row.on_delta(tail)
      text = (THINK_OPEN + tr.text) if row.starts_thinking else tr.text
      reasoning, content = split_reasoning(text)
      top = None if out.top_logprobs is None else out.top_logprobs[:len(tr.ids)]
      stop_reason = tr.stop_str
      if stop_reason is None and out.finish_reason == "stop" and tr.ids and \
          tr.ids[-1] in row.params.stop_token_ids and tr.ids[-1] not in self.end_ids:
        stop_reason = tr.ids[-1]  # a stop token the request named (end tokens report None)
      results.append(Generation(text=tr.text, token_ids=tr.ids, logprobs=tr.logprobs,
                                finish_reason="stop" if tr.stopped else out.finish_reason,
                                prompt_tokens=len(row.prompt_ids), reasoning=reasoning,
                                content=content, top_logprobs=top, raw_content=tr.content,
                                raw_reasoning=tr.reasoning, stop_reason=stop_reason))
    return results


def run_rows(engine: Engine, tokenizer, rows: Sequence[RowRequest],
             end_ids: Sequence[int] | None = None) -> list[Generation]:
  """Generates every row; streams text deltas through each row's `on_delta`."""
  run = _RowsRun(tokenizer, rows, end_ids)
  prompts, params, stops, choices = run.engine_args()
  return run.finish(engine.generate(prompts, params, stops, choices=choices,
                                    on_chunk=run.on_chunk))


def submit_rows(engine: ContinuousEngine, tokenizer, rows: Sequence[RowRequest],
                end_ids: Sequence[int] | None,
                on_done: Callable[[list[Generation] | None, BaseException | None], None]):
  """Queues rows on a continuous engine without waiting; `on_done(generations, error)` is called
  on the engine's stepping thread when they finish. Returns the engine's `Group` (to cancel)."""
  run = _RowsRun(tokenizer, rows, end_ids)

  def done(outs, error):
    if error is not None:
      on_done(None, error)
      return
    try:
      gens = run.finish(outs)
    except Exception as e:  # noqa: BLE001 - reported to the caller, not the engine
      on_done(None, e)
      return
    on_done(gens, None)

  prompts, params, stops, choices = run.engine_args()
  return engine.submit(prompts, params, stops, choices, on_chunk=run.on_chunk, on_done=done)


def fit_chat(sampler: Any, messages: Sequence[dict], budget: int
             ) -> tuple[list[dict] | None, int]:
  """(messages without their oldest history turns (user/assistant pairs after the system prompt)
  so that `sampler`'s prompt has at most `budget` tokens, or None when even the system prompt and
  the last message do not fit; turns dropped)."""
  msgs, dropped = list(messages), 0
  while True:
    try:
      n = len(sampler.encode_prompt(msgs))
    except ValueError:  # the sampler refuses a prompt over its context: drop history too
      n = budget + 1
    if n <= budget:
      return msgs, dropped
    if len(msgs) <= 2:
      return None, dropped
    msgs = [msgs[0]] + msgs[3:]
    dropped += 1


def _opens_thinking(text: str) -> bool:
  """The text ends inside a `<think>` block it opened."""
  return text.rfind(THINK_OPEN) > text.rfind(THINK_CLOSE)


def _is_chat(p: Any) -> bool:
  return isinstance(p, (list, tuple)) and len(p) > 0 and all(isinstance(m, dict) for m in p)


def _is_ids(p: Any) -> bool:
  return isinstance(p, (list, tuple)) and len(p) > 0 and all(isinstance(t, int) for t in p)


class Sampler:
  """Generation for one model and tokenizer (see the module docstring)."""

  def __init__(self, model, tokenizer, *, mesh=None, chat_template: ChatTemplate | None = None,
               defaults: GenerationDefaults | None = None, engine: str = "continuous",
               **engine_kw: Any):
    self.model, self.tokenizer = model, tokenizer
    self.cfg = model.cfg
    if tokenizer.vocab_size > self.cfg.vocab_size:
      raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
                       f"{self.cfg.vocab_size}")
    self.chat_template = chat_template
    self.defaults = defaults or GenerationDefaults()
    self.end_ids = end_token_ids(tokenizer, self.defaults)
    if engine not in ENGINES:
      raise ValueError(f"engine: '{engine}' is not one of {', '.join(ENGINES)}")
    self.engine_kind = engine
    self.engine = ENGINES[engine](model, mesh=mesh, **engine_kw)

  @classmethod
  def from_checkpoint(cls, path: str, *, tokenizer=None, mesh=None, **engine_kw: Any) -> "Sampler":
    """A Hugging Face folder, a training workdir (latest step) or a step folder. The chat template
    (`tokenizer_config.json`) and `generation_config.json` are looked for in the checkpoint
    folder, then in the tokenizer's."""
    from lwm_jax import checkpoints  # pylint: disable=import-outside-toplevel
    model, tok = checkpoints.load(path, tokenizer=tokenizer, mesh=mesh)
    tok_path = tokenizer if isinstance(tokenizer, str) else getattr(tok, "path", None)
    return cls(model, tok, mesh=mesh, chat_template=ChatTemplate.from_folder(tok, path, tok_path),
               defaults=GenerationDefaults.from_folder(path), **engine_kw)

  # ------------------------------------------------------------------------ prompts
  def encode_prompt(self, prompt: Prompt) -> list[int]:
    """Token ids of one prompt; raises ValueError for a malformed one."""
    return self.prepare(prompt)[0]

  def prepare(self, prompt: Prompt, chat_kwargs: dict | None = None, *,
              add_generation_prompt: bool = True, continue_final_message: bool = False,
              chat_template: str | None = None) -> tuple[list[int], bool]:
    """(token ids, whether the prompt leaves the reply inside an opened `<think>`) for one
    prompt; `chat_kwargs` (e.g. `enable_thinking`) go to the chat template, as do
    `add_generation_prompt` and `continue_final_message`; `chat_template` (Jinja source) replaces
    the checkpoint's for this prompt."""
    thinking = False
    if isinstance(prompt, str):
      ids = self.tokenizer.encode(prompt)
    elif _is_chat(prompt):
      ids, thinking = self._chat_ids(list(prompt), dict(chat_kwargs or {}),
                                     add_generation_prompt, continue_final_message,
                                     chat_template)
    elif _is_ids(prompt):
      ids = [int(t) for t in prompt]
      bad = [t for t in ids if not 0 <= t < self.cfg.vocab_size]
      if bad:
        raise ValueError(f"prompt: token id {bad[0]} outside [0, {self.cfg.vocab_size})")
    else:
      raise ValueError(f"prompt: expected a string, a list of messages or a list of token ids, "
                       f"got {type(prompt).__name__}")
    self.engine.check_prompt(len(ids))
    return ids, thinking

  def _chat_ids(self, messages: list[dict], kwargs: dict, add_generation_prompt: bool = True,
                continue_final_message: bool = False, source: str | None = None
                ) -> tuple[list[int], bool]:
    for i, m in enumerate(messages):
      if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
        raise ValueError(f"messages[{i}]: needs string fields 'role' and 'content'")
    for k in ("messages", "add_generation_prompt", "continue_final_message"):
      if k in kwargs:
        raise ValueError(f"chat_template_kwargs: '{k}' is set by the server, not by a request")
    if continue_final_message and messages[-1]["role"] != "assistant":
      raise ValueError("continue_final_message: the last message must be the assistant's")
    template = self.chat_template
    if source is not None and (template is None or source != template.source):
      base = template or ChatTemplate("", self.tokenizer)
      template = ChatTemplate(source, self.tokenizer, base.bos_token, base.eos_token,
                              origin="the request's chat_template")
    if template is not None and template.source not in OUR_TEMPLATES:
      text = template.render(messages, add_generation_prompt=add_generation_prompt,
                             continue_final_message=continue_final_message, **kwargs)
      opened = _opens_thinking(text) if continue_final_message else \
          text.rstrip().endswith(THINK_OPEN)
      return template.encode(text), opened
    unknown = sorted(set(kwargs) - {"enable_thinking"})
    if unknown:
      raise ValueError(f"chat_template_kwargs: {unknown[0]!r} is not understood by the built-in "
                       "ChatML template (the checkpoint ships no chat_template); only "
                       "'enable_thinking' is")
    think = kwargs.get("enable_thinking")
    if think is not None and not isinstance(think, bool):
      raise ValueError(f"chat_template_kwargs.enable_thinking: must be true or false, got "
                       f"{think!r}")
    ids = chatml_ids(self.tokenizer, messages, think, add_generation_prompt,
                     continue_final_message)
    return ids, continue_final_message and _opens_thinking(messages[-1]["content"])

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
      ids, thinking = self.prepare(p)
      for c in range(sp.n):
        k = len(rows)
        cb = None if on_delta is None else (lambda d, k=k: on_delta(k, d))
        rows.append(RowRequest(ids, sp, c, cb, thinking))
    return self.run(rows)

  def run(self, rows: Sequence[RowRequest]) -> list[Generation]:
    """Generates prepared rows (the static engine: as one batch) and waits for them."""
    return run_rows(self.engine, self.tokenizer, rows, self.end_ids)

  def submit(self, rows: Sequence[RowRequest],
             on_done: Callable[[list[Generation] | None, BaseException | None], None]):
    """Queues prepared rows on the continuous engine (see `submit_rows`)."""
    if not isinstance(self.engine, ContinuousEngine):
      raise ValueError("submit: needs the continuous engine (Sampler(engine='continuous'))")
    return submit_rows(self.engine, self.tokenizer, rows, self.end_ids, on_done)

  def chat(self, messages: Sequence[dict], params: SamplingParams | None = None) -> Generation:
    return self.generate([list(messages)], params)[0]
