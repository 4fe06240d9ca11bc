"""What a checkpoint folder says about chatting with it: its Jinja chat template and its
generation defaults.

`ChatTemplate` renders `tokenizer_config.json`'s `chat_template` the way Hugging Face
`transformers` does (a sandboxed jinja2 environment with `trim_blocks` / `lstrip_blocks`, the
variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools`, any
`chat_template_kwargs` such as `enable_thinking`, and the helpers `raise_exception`, `tojson`,
`strftime_now`), then turns the text into ids: the tokenizer's added tokens (`<|im_start|>`,
`<think>`, ...) written by the template become their single ids and everything else is ordinary
text. Message text can never smuggle in a control token: before rendering, every added-token
string inside a message is broken by an invisible mark that is removed again after the split
(assistant messages keep the thinking tags, as our ChatML encoding does).

`GenerationDefaults` reads `generation_config.json`: the sampling defaults a request that leaves
them out gets (temperature, top_p, top_k, min_p, repetition_penalty; `do_sample: false` means
greedy) and the end-of-sequence ids (`eos_token_id`, an int or a list).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
from typing import Any, Sequence

from lwm_jax.data.tokenizer import ENDOFTEXT, IM_END, TAGS

_MARK = "\ue000"  # private-use character: breaks added-token strings inside message text


class TemplateError(ValueError):
  """The template refused the conversation (`raise_exception`) or failed to render."""


def _folders(*paths: str | None) -> list[str]:
  out = []
  for p in paths:
    if not p:
      continue
    p = os.fspath(p)
    d = p if os.path.isdir(p) else os.path.dirname(p) if os.path.isfile(p) else None
    if d and d not in out:
      out.append(d)
  return out


def _read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      d = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: not readable JSON ({e})") from None
  if not isinstance(d, dict):
    raise ValueError(f"{path}: expected a JSON object")
  return d


def _token_text(v: Any) -> str:
  """bos/eos in tokenizer_config.json: a string, null, or {"content": ...}."""
  if isinstance(v, dict):
    v = v.get("content")
  return v if isinstance(v, str) else ""


def added_tokens(tokenizer) -> dict[str, int]:
  """Every added token the tokenizer knows (from its tokenizer.json when it has one)."""
  out = dict(getattr(tokenizer, "special_tokens", {}))
  path = getattr(tokenizer, "path", None)
  if isinstance(path, str) and path.endswith(".json") and os.path.isfile(path):
    for t in _read_json(path).get("added_tokens") or []:
      if isinstance(t, dict) and isinstance(t.get("content"), str) and isinstance(t.get("id"),
                                                                                  int):
        out.setdefault(t["content"], t["id"])
  return out


class ChatTemplate:
  """A Jinja chat template bound to a tokenizer (see the module docstring)."""

  def __init__(self, source: str, tokenizer, bos_token: str = "", eos_token: str = "",
               origin: str = "chat_template"):
    import jinja2  # pylint: disable=import-outside-toplevel
    from jinja2 import sandbox  # pylint: disable=import-outside-toplevel
    self.tokenizer, self.origin, self.source = tokenizer, origin, source
    self.bos_token, self.eos_token = bos_token, eos_token
    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message):
      raise TemplateError(f"{origin}: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
      return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                        sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
      self.template = env.from_string(source)
    except jinja2.TemplateError as e:
      raise ValueError(f"{origin}: the chat template does not parse: {e}") from None
    self.added = added_tokens(tokenizer)
    specials = sorted(self.added, key=len, reverse=True)
    self._split_re = re.compile("(" + "|".join(re.escape(t) for t in specials) + ")")
    self._escape_re = re.compile("|".join(re.escape(t) for t in specials))

  @classmethod
  def from_folder(cls, tokenizer, *paths: str | None) -> "ChatTemplate | None":
    """The template of the first `tokenizer_config.json` with a `chat_template` in these
    folders (or the folders of these files); None when there is none."""
    for d in _folders(*paths):
      path = os.path.join(d, "tokenizer_config.json")
      if not os.path.isfile(path):
        continue
      cfg = _read_json(path)
      tpl = cfg.get("chat_template")
      if isinstance(tpl, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
      if tpl is None:
        jinja_file = os.path.join(d, "chat_template.jinja")
        if os.path.isfile(jinja_file):
          with open(jinja_file, encoding="utf-8") as f:
            tpl = f.read()
      if tpl is None:
        continue
      if not isinstance(tpl, str):
        raise ValueError(f"{path}: 'chat_template' must be a string or a list of named "
                         f"templates, got {type(tpl).__name__}")
      return cls(tpl, tokenizer, _token_text(cfg.get("bos_token")),
                 _token_text(cfg.get("eos_token")), origin=path)
    return None

  def _escape(self, text: str, keep: Sequence[str] = ()) -> str:
    def sub(m):
      t = m.group(0)
      return t if t in keep else t[0] + _MARK + t[1:]
    return self._escape_re.sub(sub, text)

  def render(self, messages: Sequence[dict], add_generation_prompt: bool = True,
             continue_final_message: bool = False, **kwargs: Any) -> str:
    """The prompt text. With `continue_final_message` the text ends where the last message's
    content ends (what the template writes after it, such as its end marker, is cut), so the
    reply continues that message, as transformers' option of the same name does."""
    safe = []
    for m in messages:
      keep = TAGS if m.get("role") == "assistant" else ()
      safe.append({k: self._escape(v, keep) if isinstance(v, str) and k != "role" else v
                   for k, v in m.items()})
    variables = dict(bos_token=self.bos_token, eos_token=self.eos_token, tools=None)
    variables.update(kwargs)
    try:
      text = self.template.render(messages=safe, add_generation_prompt=add_generation_prompt,
                                  **variables)
      if continue_final_message:
        last = safe[-1].get("content") if safe else None
        at = text.rfind(last.strip()) if isinstance(last, str) and last.strip() else -1
        if at < 0:
          raise TemplateError(f"{self.origin}: continue_final_message: the last message's "
                              "content does not appear in the rendered prompt")
        text = text[:at + len(last.strip())]
      return text
    except TemplateError:
      raise
    except Exception as e:  # noqa: BLE001 - a template bug is the request's error, with context
      raise TemplateError(f"{self.origin}: rendering failed: {type(e).__name__}: {e}") from None

  def encode(self, text: str) -> list[int]:
    """Ids of rendered text: added-token strings to their ids, the rest as ordinary text."""
    ids: list[int] = []
    for piece in self._split_re.split(text):
      if not piece:
        continue
      if piece in self.added:
        ids.append(self.added[piece])
      else:
        ids.extend(self.tokenizer.encode(piece.replace(_MARK, "")))
    return ids


# ------------------------------------------------------------------------------------ ChatML
def chatml_ids(tokenizer, messages: Sequence[dict], enable_thinking: bool | None = None,
               add_generation_prompt: bool = True, continue_final_message: bool = False
               ) -> list[int]:
  """Our built-in ChatML with the assistant generation prompt; `enable_thinking=False` closes an
  empty thinking block up front (what Qwen3's own template writes for that switch). With
  `continue_final_message` the last message is left open (no end marker) for the reply to go on."""
  msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
  if continue_final_message:
    last = msgs.pop()
    return (tokenizer.encode_chat(msgs) + [tokenizer.im_start_id]
            + tokenizer.encode(last["role"] + "\n")
            + tokenizer.encode_content(last["role"], last["content"]))
  ids = tokenizer.encode_chat(msgs, add_generation_prompt=add_generation_prompt)
  if enable_thinking is False and add_generation_prompt:
    ids += tokenizer.encode_content("assistant", "<think>\n\n</think>\n\n")
  return ids


def text_ids(tokenizer, text: str) -> list[int]:
  """Ids of a raw prompt string as vLLM reads one: the tokenizer's added tokens written in it
  (`<|im_start|>`, ...) become their ids, the rest is ordinary text. For a SentencePiece model
  these are the chat tokens, the added tokens of the tokenizer.json converted from it."""
  if getattr(tokenizer, "path", "").endswith(".json"):
    added = added_tokens(tokenizer)
  else:
    added = {t: i for t, i in getattr(tokenizer, "special_tokens", {}).items() if t not in TAGS}
  if not added or not any(t in text for t in added):
    return tokenizer.encode(text)
  split = re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))
                     + ")")
  ids: list[int] = []
  for piece in split.split(text):
    if piece in added:
      ids.append(added[piece])
    elif piece:
      ids.extend(tokenizer.encode(piece))
  return ids


# ------------------------------------------------------------------------------------ defaults
@dataclasses.dataclass
class GenerationDefaults:
  """Request defaults (None: the field's own default) and extra end-of-sequence ids."""
  temperature: float | None = None
  top_p: float | None = None
  top_k: int | None = None
  min_p: float | None = None
  repetition_penalty: float | None = None
  max_new_tokens: int | None = None  # the default max_tokens of a request that sets none
  eos_token_ids: tuple[int, ...] = ()
  source: str = ""

  def sampling(self) -> dict:
    return {k: v for k, v in dataclasses.asdict(self).items()
            if k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
            and v is not None}

  @classmethod
  def from_folder(cls, *paths: str | None) -> "GenerationDefaults":
    for d in _folders(*paths):
      path = os.path.join(d, "generation_config.json")
      if os.path.isfile(path):
        return cls.from_dict(_read_json(path), path)
    return cls()

  @classmethod
  def from_dict(cls, d: dict, source: str = "generation_config") -> "GenerationDefaults":
    def num(key, integer=False):
      v = d.get(key)
      if v is None:
        return None
      ok = isinstance(v, int) if integer else isinstance(v, (int, float))
      if isinstance(v, bool) or not ok or (not integer and not math.isfinite(v)):
        raise ValueError(f"{source}: '{key}' must be {'an integer' if integer else 'a number'}, "
                         f"got {v!r}")
      return v
    out = cls(temperature=num("temperature"), top_p=num("top_p"), top_k=num("top_k", True),
              min_p=num("min_p"), repetition_penalty=num("repetition_penalty"),
              max_new_tokens=num("max_new_tokens", True), source=source)
    if out.max_new_tokens is not None and out.max_new_tokens < 1:
      raise ValueError(f"{source}: 'max_new_tokens' must be >= 1, got {out.max_new_tokens}")
    if d.get("do_sample") is False:
      out.temperature = 0.0
    eos = d.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) and not isinstance(eos, bool) else eos
    if eos is not None and not (isinstance(eos, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in eos)):
      raise ValueError(f"{source}: 'eos_token_id' must be a token id or a list of them, "
                       f"got {d.get('eos_token_id')!r}")
    out.eos_token_ids = tuple(eos or ())
    if out.top_k is not None and out.top_k < 0:  # -1 is "off" in Hugging Face configs
      out.top_k = 0
    return out


def end_token_ids(tokenizer, defaults: GenerationDefaults | None = None) -> list[int]:
  """Ids that end a reply and never appear in its text: the end-of-turn token, the
  end-of-text token when the vocabulary has one, and the checkpoint's eos ids."""
  ids = [tokenizer.eos_id]
  specials = getattr(tokenizer, "special_tokens", {})
  ids += [specials[s] for s in (IM_END, ENDOFTEXT) if s in specials]
  ids += list(defaults.eos_token_ids if defaults else ())
  return sorted(set(ids), key=ids.index)
