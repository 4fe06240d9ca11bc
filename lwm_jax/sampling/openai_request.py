"""Reading an OpenAI-style request body: every field checked, nothing silently ignored.

`parse_request(raw, chat, ...)` turns the bytes of a `/v1/chat/completions` or `/v1/completions`
body into a `Request` (sampling params, prompts, options) or raises `BadRequest` (HTTP 400) naming
the field, or `ModelNotFound` (HTTP 404, as the OpenAI API answers an unknown model).

* Numbers: finite and in range (NaN or inf never pass; `top_k` -1 means off, as in vLLM).
* Strings anywhere in the body must be valid Unicode (a lone surrogate is a 400, not a crash);
  the body must nest at most `MAX_DEPTH` levels.
* Fields we do not implement (`response_format` other than text, `tools`, `logit_bias`, ...) are
  a 400 saying so, unless they hold their do-nothing value (`response_format: {"type": "text"}`,
  `tools: []`); a field nobody defined is a 400 too. Fields that cannot change what a world model
  generates (`user`, `metadata`, `reasoning_effort`, `parallel_tool_calls`, ...) are accepted and
  ignored; docs/serving.md has the whole table.
* As pydantic's lax mode does in vLLM, a number may come as a string (`"0.5"`, `"16"`), an integer
  as a float without a fraction (`16.0`), and a switch as `"true"` / `"false"` / 0 / 1.
* Fields a request leaves out take the checkpoint's `generation_config.json` defaults.
"""
from __future__ import annotations

import dataclasses
import json
import math
import secrets
from typing import Any

from lwm_jax.sampling.params import INT32_MAX, SamplingParams

MAX_N = 16
MAX_DEPTH = 64
ROLES = ("system", "developer", "user", "assistant", "tool")  # developer is read as system
MESSAGE_KEYS = ("role", "content", "name", "reasoning_content", "tool_call_id")

COMMON = {"model", "temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "n", "seed",
          "stream", "stream_options", "ignore_eos", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "user", "logprobs", "min_tokens", "stop_token_ids",
          "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
          "add_special_tokens", "metadata", "priority", "request_id"}
CHAT = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "chat_template_kwargs",
                 "add_generation_prompt", "continue_final_message", "chat_template",
                 "reasoning_effort", "parallel_tool_calls"}
COMPLETION = COMMON | {"prompt"}
# Fields of the OpenAI / vLLM APIs we do not implement, with the value that asks for nothing.
UNSUPPORTED = {
    "response_format": lambda v: v is None or v == {"type": "text"},
    "tools": lambda v: not v, "tool_choice": lambda v: v in (None, "none", "auto"),
    "functions": lambda v: not v, "function_call": lambda v: v in (None, "none"),
    "logit_bias": lambda v: not v,
    "best_of": lambda v: v in (None, 1), "echo": lambda v: not v, "suffix": lambda v: not v,
    "guided_json": lambda v: v is None, "guided_regex": lambda v: v is None,
    "guided_choice": lambda v: v is None, "guided_grammar": lambda v: v is None,
    "structured_outputs": lambda v: v is None, "audio": lambda v: v is None,
    "modalities": lambda v: v in (None, ["text"]), "prediction": lambda v: v is None,
    "web_search_options": lambda v: v is None,
    "store": lambda v: not v, "service_tier": lambda v: v in (None, "auto", "default"),
    "use_beam_search": lambda v: not v, "length_penalty": lambda v: v in (None, 1, 1.0),
    "prompt_logprobs": lambda v: v is None, "truncate_prompt_tokens": lambda v: v is None,
    "allowed_token_ids": lambda v: v is None, "bad_words": lambda v: not v,
    "documents": lambda v: v is None, "guided_decoding_backend": lambda v: v is None,
}
_WHY = {
    "response_format": "this server does not constrain generation to JSON or a schema; leave "
                       "response_format out or send {\"type\": \"text\"}",
    "tools": "a world model calls no tools", "tool_choice": "a world model calls no tools",
}
# Switches pydantic's lax mode reads as booleans (vLLM parses requests with pydantic).
_TRUE = {"true", "t", "yes", "y", "on", "1"}
_FALSE = {"false", "f", "no", "n", "off", "0"}


class BadRequest(ValueError):
  pass


class ModelNotFound(LookupError):
  pass


@dataclasses.dataclass
class Request:
  params: SamplingParams
  prompts: list[Any]           # chat: one list of messages; completions: strings or id lists
  stream: bool = False
  include_usage: bool = False
  logprobs: bool = False       # return token logprobs (chat: `logprobs`; completions: int given)
  chat_kwargs: dict = dataclasses.field(default_factory=dict)
  max_tokens_given: bool = False  # the request set max_tokens (else the server's default)
  add_generation_prompt: bool = True
  continue_final_message: bool = False
  chat_template: str | None = None  # a request-level Jinja template


# ------------------------------------------------------------------------------------ checks
def load_body(raw: bytes) -> dict:
  """The JSON object of a request body (BadRequest for anything else)."""
  try:
    body = json.loads(raw)
  except RecursionError:
    raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels") from None
  except (ValueError, UnicodeDecodeError) as e:
    raise BadRequest(f"request body is not valid JSON: {e}") from None
  if not isinstance(body, dict):
    raise BadRequest("request body must be a JSON object")
  _check_tree(body)
  return body


def _check_tree(body: dict) -> None:
  """Depth limit and valid Unicode everywhere (keys too), without recursion."""
  stack: list[tuple[Any, str, int]] = [(body, "", 1)]
  while stack:
    v, path, depth = stack.pop()
    if depth > MAX_DEPTH:
      raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels (at {path})")
    if isinstance(v, str):
      try:
        v.encode("utf-8")
      except UnicodeEncodeError:
        raise BadRequest(f"'{path}': invalid Unicode (a lone surrogate)") from None
    elif isinstance(v, dict):
      for k, x in v.items():
        stack.append((k, f"{path}.<key>" if path else "<key>", depth))
        stack.append((x, f"{path}.{k}" if path else str(k), depth + 1))
    elif isinstance(v, list):
      stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))


def _lax_number(v: Any, integer: bool) -> Any:
  """A string holding a number, or an integral float for an integer field, read as pydantic's
  lax mode reads it; anything else is returned as it is (and then refused by type)."""
  if isinstance(v, str):
    t = v.strip()
    try:
      return int(t) if integer else float(t)
    except ValueError:
      if integer:
        try:
          f = float(t)
        except ValueError:
          return v
        return int(f) if math.isfinite(f) and f == int(f) else v
      return v
  if integer and isinstance(v, float) and math.isfinite(v) and v == int(v):
    return int(v)
  return v


def _num(body: dict, key: str, default, lo=None, hi=None, integer=False, lo_open=False):
  v = body.get(key)
  if v is None:
    return default
  v = _lax_number(v, integer)
  ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
  if isinstance(v, bool) or not ok_type:
    raise BadRequest(f"'{key}' must be {'an integer' if integer else 'a number'}, got {v!r}")
  if not integer and not math.isfinite(v):
    raise BadRequest(f"'{key}' must be a finite number, got {v}")
  if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
    left = f"({lo}" if lo_open else f"[{lo}"
    rng = f"in {left}, {hi}]" if hi is not None else f"{'>' if lo_open else '>='} {lo}"
    raise BadRequest(f"'{key}' must be {rng}, got {v}")
  return v


def _bool(body: dict, key: str, default: bool = False) -> bool:
  v = body.get(key)
  if v is None:
    return default
  if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
    return v.strip().lower() in _TRUE
  if isinstance(v, int) and not isinstance(v, bool) and v in (0, 1):
    return bool(v)
  if not isinstance(v, bool):
    raise BadRequest(f"'{key}' must be true or false, got {v!r}")
  return v


def _check_fields(body: dict, chat: bool) -> None:
  known = CHAT if chat else COMPLETION
  for k, v in body.items():
    if k in known:
      continue
    if k in UNSUPPORTED:
      if UNSUPPORTED[k](v):
        continue
      why = _WHY.get(k, "remove it or leave it at its default")
      raise BadRequest(f"'{k}' = {json.dumps(v)[:80]} is not supported by this server ({why})")
    other = "/v1/completions" if chat else "/v1/chat/completions"
    hint = f" (it belongs to {other})" if k in (COMPLETION if chat else CHAT) else ""
    raise BadRequest(f"unknown field '{k}'{hint}")


def parse_params(body: dict, default_max_tokens: int, defaults: dict | None = None
                 ) -> SamplingParams:
  """SamplingParams from a request body; BadRequest names the bad field. `defaults` (from the
  checkpoint's generation config) fill sampling fields the body leaves out."""
  d = dict(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0)
  d.update(defaults or {})
  stop = body.get("stop")
  if stop is None:
    stop = []
  elif isinstance(stop, str):
    stop = [stop]
  if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
    raise BadRequest("'stop' must be a non-empty string or a list of them")
  if len(stop) > 16:
    raise BadRequest(f"'stop' holds {len(stop)} strings; at most 16 are allowed")
  key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
  max_tokens = _num(body, key, default_max_tokens, 1, INT32_MAX, True)
  min_tokens = _num(body, "min_tokens", 0, 0, INT32_MAX, True)
  if min_tokens > max_tokens:
    raise BadRequest(f"'min_tokens' ({min_tokens}) must be at most '{key}' ({max_tokens})")
  stop_ids = body.get("stop_token_ids")
  stop_ids = [] if stop_ids is None else stop_ids
  if not isinstance(stop_ids, list) or not all(
      isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX for t in stop_ids):
    raise BadRequest(f"'stop_token_ids' must be a list of token ids, got {stop_ids!r}")
  seed = _num(body, "seed", None, -2 ** 63, 2 ** 63 - 1, True)
  top_k = _num(body, "top_k", d["top_k"], -1, INT32_MAX, True)
  return SamplingParams(
      temperature=float(_num(body, "temperature", d["temperature"], 0, 2)),
      top_p=float(_num(body, "top_p", d["top_p"], 0, 1, lo_open=True)),
      top_k=max(top_k, 0), min_p=float(_num(body, "min_p", d["min_p"], 0, 1)),
      max_new_tokens=max_tokens, stop=stop, n=_num(body, "n", 1, 1, MAX_N, True),
      min_tokens=min_tokens, stop_token_ids=stop_ids,
      include_stop_str_in_output=_bool(body, "include_stop_str_in_output"),
      seed=secrets.randbits(31) if seed is None else seed,
      ignore_eos=_bool(body, "ignore_eos"),
      presence_penalty=float(_num(body, "presence_penalty", 0.0, -2, 2)),
      frequency_penalty=float(_num(body, "frequency_penalty", 0.0, -2, 2)),
      repetition_penalty=float(_num(body, "repetition_penalty", d["repetition_penalty"], 0, 100,
                                    lo_open=True)))


def _messages(body: dict) -> list[dict]:
  msgs = body.get("messages")
  if not isinstance(msgs, list) or not msgs:
    raise BadRequest("'messages' must be a non-empty list")
  out = []
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise BadRequest(f"messages[{i}]: needs a string 'role'")
    if m["role"] not in ROLES:
      raise BadRequest(f"messages[{i}].role: '{m['role']}' is not one of {', '.join(ROLES)}")
    role = "system" if m["role"] == "developer" else m["role"]
    extra = sorted(set(m) - set(MESSAGE_KEYS))
    if extra:
      raise BadRequest(f"messages[{i}].{extra[0]}: not supported by this server")
    content = m.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
      parts = [c.get("text") for c in content if isinstance(c, dict) and c.get("type") == "text"]
      if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
        raise BadRequest(f"messages[{i}].content: only text parts are supported")
      content = "".join(parts)
    if content is None:
      content = ""
    if not isinstance(content, str):
      raise BadRequest(f"messages[{i}].content must be a string or a list of text parts")
    msg = {"role": role, "content": content}
    for k in ("name", "reasoning_content", "tool_call_id"):
      if m.get(k) is not None:
        if not isinstance(m[k], str):
          raise BadRequest(f"messages[{i}].{k} must be a string")
        msg[k] = m[k]
    out.append(msg)
  return out


def _prompts(body: dict) -> list[Any]:
  p = body.get("prompt")
  if isinstance(p, str):
    return [p]
  if isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
    return [p]
  if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
    return p
  if isinstance(p, list) and p and all(isinstance(x, list) and x and all(
      isinstance(t, int) and not isinstance(t, bool) for t in x) for x in p):
    return p
  raise BadRequest("'prompt' must be a string, a list of strings, a list of token ids or a list "
                   "of such lists")


def _ignored_fields(body: dict) -> None:
  """Types of the fields accepted and ignored (see the module docstring)."""
  checks = {"user": (str,), "metadata": (dict,), "reasoning_effort": (str,),
            "request_id": (str,), "priority": (int,), "parallel_tool_calls": (bool,),
            "skip_special_tokens": (bool,), "spaces_between_special_tokens": (bool,),
            "add_special_tokens": (bool,)}
  for k, types in checks.items():
    v = body.get(k)
    if v is None:
      continue
    if types == (bool,):
      _bool(body, k)
    elif types == (int,):
      _num(body, k, 0, -INT32_MAX, INT32_MAX, True)
    elif not isinstance(v, types):
      raise BadRequest(f"'{k}' must be {'a string' if types == (str,) else 'an object'}, "
                       f"got {v!r}")
  md = body.get("metadata")
  if md and not all(isinstance(k, str) and isinstance(v, str) for k, v in md.items()):
    raise BadRequest("'metadata' must map strings to strings")


def parse_request(body: dict, chat: bool, model_name: str, default_max_tokens: int,
                  max_rows: int, defaults: dict | None = None) -> Request:
  """A checked request (see the module docstring)."""
  model = body.get("model")
  if model is not None and not isinstance(model, str):
    raise BadRequest(f"'model' must be a string, got {model!r}")
  if model is not None and model != model_name:
    raise ModelNotFound(f"The model '{model}' does not exist (this server serves "
                        f"'{model_name}')")
  _check_fields(body, chat)
  params = parse_params(body, default_max_tokens, defaults)
  prompts = [_messages(body)] if chat else _prompts(body)
  if len(prompts) * params.n > max_rows:
    raise BadRequest(f"the request asks for {len(prompts) * params.n} sequences (n x prompts); "
                     f"this server allows at most {max_rows} per request")
  stream = _bool(body, "stream")
  opts = body.get("stream_options")
  if opts is not None and not isinstance(opts, dict):
    raise BadRequest(f"'stream_options' must be an object, got {opts!r}")
  opts = opts or {}
  bad = sorted(set(opts) - {"include_usage"})
  if bad:
    raise BadRequest(f"stream_options.{bad[0]}: not supported")
  include_usage = _bool(opts, "include_usage")
  _ignored_fields(body)
  req = Request(params, prompts, stream, include_usage)
  key = "max_completion_tokens" if chat else "max_tokens"
  req.max_tokens_given = body.get(key) is not None or body.get("max_tokens") is not None
  if chat:
    req.add_generation_prompt = _bool(body, "add_generation_prompt", True)
    req.continue_final_message = _bool(body, "continue_final_message", False)
    if req.add_generation_prompt and req.continue_final_message:
      raise BadRequest("'continue_final_message' and 'add_generation_prompt' cannot both be true "
                       "(set add_generation_prompt to false to continue the last message)")
    if req.continue_final_message and prompts[0][-1]["role"] != "assistant":
      raise BadRequest("'continue_final_message' needs the last message to be the assistant's")
    tpl = body.get("chat_template")
    if tpl is not None and not (isinstance(tpl, str) and tpl.strip()):
      raise BadRequest("'chat_template' must be a non-empty Jinja template string")
    req.chat_template = tpl
    req.logprobs = _bool(body, "logprobs")
    top = _num(body, "top_logprobs", 0, 0, 20, True)
    if top and not req.logprobs:
      raise BadRequest("'top_logprobs' needs 'logprobs': true")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
      raise BadRequest(f"'chat_template_kwargs' must be an object, got {kwargs!r}")
    req.chat_kwargs = dict(kwargs or {})
  else:
    top = _num(body, "logprobs", None, 0, 5, True)
    req.logprobs = top is not None
    top = top or 0
  req.params = req.params.replace(top_logprobs=top)
  return req
