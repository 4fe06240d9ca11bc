"""An OpenAI-compatible HTTP server over a `Sampler` (FastAPI).

Endpoints: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`.
Request fields: messages / prompt, temperature, top_p, max_tokens (or max_completion_tokens), stop,
n, seed, stream (+ stream_options.include_usage); our extensions top_k, min_p, ignore_eos.
Thinking (`<think>...</think>`) comes back as `message.reasoning_content`, apart from `content`.
A `max_tokens` beyond the room the context leaves is cut to that room (finish_reason "length").

Batching: handlers never touch the model. They turn a request into rows (one per choice) and hand
them to the `Batcher` thread, which waits `window_ms` after the first request for others to arrive,
then decodes everything it collected (up to `max_batch` rows) as one batch. Rows stream their text
back to the handler's event loop as it becomes final. Invalid requests and prompts that do not fit
the context get HTTP 400 with a message; an engine failure fails only the requests of its batch.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import queue
import secrets
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from lwm_jax.sampling.params import Generation, SamplingParams
from lwm_jax.sampling.sampler import RowRequest, Sampler, run_rows
from lwm_jax.sampling.text import Delta

log = logging.getLogger(__name__)
MAX_N = 16


class BadRequest(ValueError):
  pass


# ------------------------------------------------------------------------------------ batcher
@dataclasses.dataclass
class _Job:
  rows: list[RowRequest]
  future: concurrent.futures.Future


class Batcher:
  """A background thread that decodes requests arriving together as one batch."""

  def __init__(self, sampler: Sampler, max_batch: int = 32, window_ms: float = 10.0):
    self.sampler, self.max_batch, self.window = sampler, max_batch, window_ms / 1000.0
    self._q: queue.Queue[_Job | None] = queue.Queue()
    self._held: _Job | None = None
    self.batches = 0
    self._thread = threading.Thread(target=self._loop, name="lwm-batcher", daemon=True)
    self._thread.start()

  def submit(self, rows: list[RowRequest]) -> concurrent.futures.Future:
    fut: concurrent.futures.Future = concurrent.futures.Future()
    self._q.put(_Job(rows, fut))
    return fut

  def close(self) -> None:
    self._q.put(None)
    self._thread.join(timeout=30)

  def _collect(self) -> list[_Job] | None:
    job = self._held or self._q.get()
    self._held = None
    if job is None:
      return None
    jobs, n = [job], len(job.rows)
    deadline = time.monotonic() + self.window
    while n < self.max_batch:
      left = deadline - time.monotonic()
      try:
        nxt = self._q.get(timeout=left) if left > 0 else self._q.get_nowait()
      except queue.Empty:
        break
      if nxt is None:
        self._q.put(None)
        break
      if n + len(nxt.rows) > self.max_batch:
        self._held = nxt
        break
      jobs.append(nxt)
      n += len(nxt.rows)
    return jobs

  def _loop(self) -> None:
    while True:
      jobs = self._collect()
      if jobs is None:
        return
      rows = [r for j in jobs for r in j.rows]
      try:
        gens = run_rows(self.sampler.engine, self.sampler.tokenizer, rows)
      except Exception as e:  # noqa: BLE001 - fail this batch's requests, keep serving
        log.exception("batch of %d rows failed", len(rows))
        for j in jobs:
          j.future.set_exception(e)
        continue
      self.batches += 1
      at = 0
      for j in jobs:
        j.future.set_result(gens[at:at + len(j.rows)])
        at += len(j.rows)


# ------------------------------------------------------------------------------------ requests
def _num(body: dict, key: str, default, lo=None, hi=None, integer=False):
  v = body.get(key)
  if v is None:
    return default
  ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
  if isinstance(v, bool) or not ok_type:
    raise BadRequest(f"'{key}' must be {'an integer' if integer else 'a number'}, got {v!r}")
  if (lo is not None and v < lo) or (hi is not None and v > hi):
    rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
    raise BadRequest(f"'{key}' must be {rng}, got {v}")
  return v


def parse_params(body: dict, default_max_tokens: int) -> SamplingParams:
  """SamplingParams from an OpenAI request body; BadRequest names the bad field."""
  stop = body.get("stop")
  if stop is None:
    stop = []
  elif isinstance(stop, str):
    stop = [stop]
  if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
    raise BadRequest("'stop' must be a non-empty string or a list of them")
  max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
  max_tokens = _num({"max_tokens": max_tokens}, "max_tokens", default_max_tokens, 1, None, True)
  seed = _num(body, "seed", None, None, None, True)
  p = SamplingParams(
      temperature=float(_num(body, "temperature", 1.0, 0, 2)),
      top_p=float(_num(body, "top_p", 1.0, 0, 1)),
      top_k=_num(body, "top_k", 0, 0, None, True) or 0,
      min_p=float(_num(body, "min_p", 0.0, 0, 1)),
      max_new_tokens=max_tokens, stop=stop, n=_num(body, "n", 1, 1, MAX_N, True),
      seed=secrets.randbits(31) if seed is None else seed,
      ignore_eos=bool(body.get("ignore_eos", False)))
  if p.top_p <= 0:
    raise BadRequest("'top_p' must be > 0")
  return p


def _messages(body: dict) -> list[dict]:
  msgs = body.get("messages")
  if not isinstance(msgs, list) or not msgs:
    raise BadRequest("'messages' must be a non-empty list")
  out = []
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise BadRequest(f"messages[{i}]: needs a string 'role'")
    content = m.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
      parts = [c.get("text", "") for c in content
               if isinstance(c, dict) and c.get("type") == "text"]
      if len(parts) != len(content):
        raise BadRequest(f"messages[{i}].content: only text parts are supported")
      content = "".join(parts)
    if content is None:
      content = ""
    if not isinstance(content, str):
      raise BadRequest(f"messages[{i}].content must be a string or a list of text parts")
    out.append({"role": m["role"], "content": content})
  return out


def _prompts(body: dict) -> list[Any]:
  p = body.get("prompt")
  if isinstance(p, str):
    return [p]
  if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
    return [p]
  if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
    return p
  raise BadRequest("'prompt' must be a string, a list of strings or a list of token ids")


def _post(loop, q, k: int, delta: Delta) -> None:
  """Hands a streamed delta to the request's event loop (a vanished client is not an error)."""
  try:
    loop.call_soon_threadsafe(q.put_nowait, (k, delta))
  except RuntimeError:  # the loop is closed
    pass


# ------------------------------------------------------------------------------------ app
def create_app(sampler: Sampler, model_name: str = "lwm", max_batch: int = 32,
               window_ms: float = 10.0, default_max_tokens: int = 1024) -> FastAPI:
  batcher = Batcher(sampler, max_batch=max_batch, window_ms=window_ms)

  @contextlib.asynccontextmanager
  async def lifespan(_app):
    yield
    batcher.close()

  app = FastAPI(title="lwm_jax sampler", lifespan=lifespan)
  app.state.batcher = batcher
  created = int(time.time())

  def error(status: int, msg: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {
        "message": msg, "type": "invalid_request_error" if status == 400 else "server_error",
        "param": None, "code": None}})

  async def body_of(request: Request) -> dict:
    try:
      body = await request.json()
    except ValueError:
      raise BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
      raise BadRequest("request body must be a JSON object")
    return body

  def rows_for(prompt_ids: list[list[int]], params: SamplingParams, loop, q) -> list[RowRequest]:
    rows = []
    for ids in prompt_ids:
      for c in range(params.n):
        k = len(rows)
        cb = None
        if q is not None:
          cb = functools.partial(_post, loop, q, k)
        rows.append(RowRequest(ids, params, c, cb))
    return rows

  async def handle(request: Request, chat: bool):
    try:
      body = await body_of(request)
      params = parse_params(body, default_max_tokens)
      prompts = [_messages(body)] if chat else _prompts(body)
      ids = [sampler.encode_prompt(p) for p in prompts]
    except (BadRequest, ValueError) as e:
      return error(400, str(e))
    stream = bool(body.get("stream", False))
    loop = asyncio.get_running_loop()
    q: asyncio.Queue | None = asyncio.Queue() if stream else None
    rows = rows_for(ids, params, loop, q)
    fut = batcher.submit(rows)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    if stream:
      include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
      return StreamingResponse(_stream(rid, chat, rows, fut, q, include_usage),
                               media_type="text/event-stream")
    try:
      gens: list[Generation] = await asyncio.wrap_future(fut)
    except Exception as e:  # noqa: BLE001
      return error(500, f"generation failed: {e}")
    return JSONResponse(_response(rid, chat, gens, rows))

  def _usage(gens: list[Generation], rows: list[RowRequest]) -> dict:
    prompt = sum(len(r.prompt_ids) for r in rows if r.choice == 0)
    comp = sum(g.completion_tokens for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": comp, "total_tokens": prompt + comp}

  def _response(rid: str, chat: bool, gens: list[Generation], rows) -> dict:
    choices = []
    for i, g in enumerate(gens):
      if chat:
        msg = {"role": "assistant", "content": g.content}
        if g.reasoning:
          msg["reasoning_content"] = g.reasoning
        choices.append({"index": i, "message": msg, "finish_reason": g.finish_reason,
                        "logprobs": None})
      else:
        choices.append({"index": i, "text": g.text, "finish_reason": g.finish_reason,
                        "logprobs": None})
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model_name, "choices": choices,
            "usage": _usage(gens, rows)}

  async def _stream(rid, chat, rows, fut, q, include_usage):
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices, usage=None) -> str:
      d = {"id": rid, "object": obj, "created": int(time.time()), "model": model_name,
           "choices": choices}
      if usage is not None:
        d["usage"] = usage
      return f"data: {json.dumps(d)}\n\n"

    if chat:
      yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                    "finish_reason": None} for i in range(len(rows))])
    done = asyncio.ensure_future(asyncio.wrap_future(fut))
    while True:
      getter = asyncio.ensure_future(q.get())
      finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
      if getter in finished:
        k, d = getter.result()
        c = _delta_choice(k, d, chat)
        if c is not None:
          yield chunk([c])
        continue
      getter.cancel()
      break
    while not q.empty():  # deltas queued before the batch finished
      k, d = q.get_nowait()
      c = _delta_choice(k, d, chat)
      if c is not None:
        yield chunk([c])
    try:
      gens = done.result()
    except Exception as e:  # noqa: BLE001
      yield f"data: {json.dumps({'error': {'message': f'generation failed: {e}'}})}\n\n"
      yield "data: [DONE]\n\n"
      return
    for i, g in enumerate(gens):
      fin = {"index": i, "finish_reason": g.finish_reason}
      fin.update({"delta": {}} if chat else {"text": ""})
      yield chunk([fin])
    if include_usage:
      yield chunk([], usage=_usage(gens, rows))
    yield "data: [DONE]\n\n"

  def _delta_choice(k: int, d: Delta, chat: bool) -> dict | None:
    if not chat:
      return {"index": k, "text": d.raw, "finish_reason": None}
    delta = {}
    if d.reasoning:
      delta["reasoning_content"] = d.reasoning
    if d.content:
      delta["content"] = d.content
    if not delta:
      return None
    return {"index": k, "delta": delta, "finish_reason": None}

  @app.get("/health")
  async def health():
    return {"status": "ok", "model": model_name, "batches": batcher.batches}

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                        "owned_by": "lwm_jax",
                                        "max_model_len": sampler.cfg.max_position_embeddings}]}

  @app.post("/v1/chat/completions")
  async def chat_completions(request: Request):
    return await handle(request, chat=True)

  @app.post("/v1/completions")
  async def completions(request: Request):
    return await handle(request, chat=False)

  return app
