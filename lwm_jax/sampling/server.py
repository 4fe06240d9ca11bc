"""An OpenAI-compatible HTTP server over a `Sampler` (FastAPI).

Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, and as in vLLM `GET /health`,
`GET|POST /ping`, `GET /v1/models`, `GET /v1/models/{id}`, `POST /tokenize`, `POST /detokenize`,
`GET /version`, `GET /metrics` (Prometheus text, `metrics.py`). Request fields: messages / prompt,
model, temperature, top_p, max_tokens (or max_completion_tokens), stop, n, seed, stream
(+ stream_options.include_usage), presence_penalty, frequency_penalty, logprobs (+ top_logprobs
for chat, streamed too); as in vLLM: top_k, min_p, repetition_penalty, ignore_eos, min_tokens,
stop_token_ids, include_stop_str_in_output, chat_template_kwargs (e.g. `{"enable_thinking":
false}`), add_generation_prompt, continue_final_message, chat_template; docs/serving.md lists
every field, implemented or accepted and ignored. Every field is checked (`openai_request`): a bad
value, an unsupported field or a lone surrogate is a 400 naming it, an unknown model a 404. Fields
a request leaves out take the checkpoint's `generation_config.json` defaults (its
`max_new_tokens` is the default max_tokens). Thinking (`<think>...</think>`) comes back as
`message.reasoning_content`, apart from `content`; both are the text as generated (nothing
stripped), the same whether streamed or not. End tokens never appear in a reply. A `max_tokens`
that does not fit the context beside the prompt is a 400 naming the limit (as in vLLM); a request
that sets none gets the default cut to the room left. `stop_reason` says which stop string or
requested stop token ended a choice. In a `/v1/completions` prompt string the tokenizer's added
tokens (`<|im_start|>`, ...) are read as their ids, as vLLM reads them.

Batching (`engine="static"`): handlers never touch the model. Parsing the body and tokenizing run
in a worker thread (the event loop keeps answering, e.g. /health, while a large body is tokenized). A request becomes
rows (one per choice, at most `max_rows_per_request`) handed to the `Batcher` thread, which waits
`window_ms` after the first request for others to arrive, then decodes everything it collected (up
to `max_batch` rows) as one batch. Rows stream their text back to the handler's event loop as it
becomes final. When a batch fails, each of its requests is retried alone, so one request that
breaks the engine fails only itself (a streamed request that already sent text is not retried).

With the continuous engine (the default, `continuous.py`) a request's rows go straight into the
engine's queue and enter decode slots as they free (`ContinuousBatcher`); a request resolves when
its own rows finish, and a streaming client that disconnects has its rows cancelled, freeing their
slots. `/metrics` then also reports the prefix cache (lookups, hits, tokens served from it, its
bytes and evictions).
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
import threading
import time
import uuid
from typing import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse


from lwm_jax.sampling.chat_template import text_ids
from lwm_jax.sampling.metrics import Metrics
from lwm_jax.sampling.openai_request import (BadRequest, ModelNotFound, _bool, load_body,
                                             parse_request)
from lwm_jax.sampling.params import Generation, SamplingParams
from lwm_jax.sampling.sampler import RowRequest, Sampler
from lwm_jax.sampling.text import Delta

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ batcher
@dataclasses.dataclass
class _Job:
  rows: list[RowRequest]
  future: concurrent.futures.Future
  streamed: bool = False  # some text already went to the client

  def __post_init__(self):
    for r in self.rows:
      if r.on_delta is not None:
        r.on_delta = functools.partial(self._delivered, r.on_delta)

  def _delivered(self, cb, delta):
    self.streamed = True
    cb(delta)


class Batcher:
  """A background thread that decodes requests arriving together as one batch."""

  def __init__(self, sampler: Sampler, max_batch: int = 32, window_ms: float = 10.0):
    self.sampler, self.max_batch, self.window = sampler, max_batch, window_ms / 1000.0
    self._q: queue.Queue[_Job | None] = queue.Queue()
    self._held: _Job | None = None
    self.batches = 0
    self.running = 0  # rows of the batch being decoded
    self._thread = threading.Thread(target=self._loop, name="lwm-batcher", daemon=True)
    self._thread.start()

  def submit(self, rows: list[RowRequest]) -> concurrent.futures.Future:
    fut: concurrent.futures.Future = concurrent.futures.Future()
    self._q.put(_Job(rows, fut))
    return fut

  def waiting(self) -> int:
    return self._q.qsize() + (self._held is not None)

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
      try:
        self._run(jobs)
      except Exception as e:  # noqa: BLE001 - fail this batch's requests, keep serving
        log.exception("batch of %d requests failed", len(jobs))
        if len(jobs) == 1:
          jobs[0].future.set_exception(e)
          continue
        for j in jobs:  # one at a time: only the request that breaks fails
          if j.streamed:
            j.future.set_exception(e)
            continue
          try:
            self._run([j])
          except Exception as e1:  # noqa: BLE001
            log.exception("request of %d rows failed alone", len(j.rows))
            j.future.set_exception(e1)

  def _run(self, jobs: list[_Job]) -> None:
    rows = [r for j in jobs for r in j.rows]
    self.running = len(rows)
    try:
      gens = self.sampler.run(rows)
    finally:
      self.running = 0
    self.batches += 1
    at = 0
    for j in jobs:
      j.future.set_result(gens[at:at + len(j.rows)])
      at += len(j.rows)


class ContinuousBatcher:
  """The continuous engine's face to the server: each request's rows are queued on the engine
  as they arrive (no batching window), a thread steps the engine while it has work, and each
  request's future resolves as soon as its own rows finish. `cancel` frees a request's slots
  (a streaming client that went away)."""

  def __init__(self, sampler: Sampler):
    self.sampler, self.engine = sampler, sampler.engine
    self._closed = False
    self._thread = threading.Thread(target=self._loop, name="lwm-engine", daemon=True)
    self._thread.start()

  @property
  def batches(self) -> int:
    return self.engine.chunks

  @property
  def running(self) -> int:
    return self.engine.running()

  def waiting(self) -> int:
    return self.engine.waiting()

  def submit(self, rows: list[RowRequest]) -> concurrent.futures.Future:
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def done(gens, error):
      if fut.done():
        return
      if error is not None:
        fut.set_exception(error)
      else:
        fut.set_result(gens)

    fut.group = self.sampler.submit(rows, done)  # type: ignore[attr-defined]
    return fut

  def cancel(self, fut: concurrent.futures.Future) -> None:
    group = getattr(fut, "group", None)
    if group is not None and not group.finished:
      self.engine.cancel(group)

  def close(self) -> None:
    self._closed = True
    with self.engine.wakeup:
      self.engine.wakeup.notify_all()
    self._thread.join(timeout=30)

  def _loop(self) -> None:
    while not self._closed:
      if not self.engine.busy():
        with self.engine.wakeup:
          self.engine.wakeup.wait(timeout=0.05)
        continue
      try:
        self.engine.step()
      except Exception:  # noqa: BLE001 - the engine fails its own requests; keep serving
        log.exception("engine step failed")


def warmup(sampler: Sampler, max_batch: int, max_prompt_len: int,
           max_tokens: Sequence[int]) -> dict:
  """Compiles the engine's shapes for batches up to `max_batch` rows (the most the batcher
  forms), prompts up to `max_prompt_len` tokens and these token budgets; logs how long it took."""
  sizes, x = [], sampler.engine.min_batch_bucket
  while x < min(max_batch, sampler.engine.max_batch):
    sizes.append(x)
    x *= 2
  sizes.append(x)
  info = sampler.engine.warmup(max_prompt_len, list(max_tokens), batch_sizes=sizes)
  log.info("warm-up: compiled %d shapes (batches up to %d rows, prompts up to %d tokens, "
           "max_tokens %s) in %.1f s", info["shapes"], max_batch, max_prompt_len,
           ",".join(map(str, max_tokens)), info["seconds"])
  return info


class BackgroundWarmup:
  """Compiles warm-up shapes on a thread while the server answers: the `first` shapes (a lone
  request's, the commonest), after which the server reports ready (/health 200, as vLLM does once
  its engine is up; 503 "loading" before), then the rest. A warm-up shape runs on its own dummy
  rows (the static engine keeps no state between calls); the continuous engine compiles the
  rest ahead of time without running them (`compile_plan`), so they never hold up its decode
  loop."""

  def __init__(self, sampler: Sampler, first: Sequence, rest: Sequence):
    self.sampler, self.first, self.rest = sampler, list(first), list(rest)
    self.done = 0
    self.ready_at: float | None = None
    self.finished_at: float | None = None
    self.error: str | None = None
    self.t0 = time.monotonic()
    self._thread = threading.Thread(target=self._loop, name="lwm-warmup", daemon=True)

  def start(self) -> "BackgroundWarmup":
    self._thread.start()
    return self

  def _loop(self) -> None:
    engine = self.sampler.engine
    # until every shape is compiled, a request runs in a larger compiled shape rather than wait
    reuse = hasattr(engine, "reuse_larger_shapes")
    if reuse:
      engine.reuse_larger_shapes = True
    try:
      for i, plan in enumerate(self.first + self.rest):
        if i >= len(self.first) and hasattr(engine, "compile_plan"):
          self._yield_to_requests(engine)
          engine.compile_plan(plan)  # while serving: compile without holding up the requests
        else:
          engine.warmup_plan(plan)
        self.done += 1
        if i + 1 == len(self.first):
          self.ready_at = time.monotonic()
          log.info("ready after %.1f s: %d warm-up shapes compiled; %d more in the background",
                   self.ready_at - self.t0, len(self.first), len(self.rest))
      if not self.first:
        self.ready_at = time.monotonic()
    except Exception as e:  # noqa: BLE001 - a failed warm-up leaves shapes to compile on use
      self.error = f"{type(e).__name__}: {e}"
      log.exception("warm-up failed; shapes will compile when first used")
      self.ready_at = self.ready_at or time.monotonic()
    if reuse:
      engine.reuse_larger_shapes = False
    self.finished_at = time.monotonic()
    log.info("warm-up finished after %.1f s (%d shapes)", self.finished_at - self.t0, self.done)

  # The most a background shape waits for the requests in flight to finish: tracing a shape is
  # Python work that competes with theirs (a warm restart's first 1,024-token answer took 6 s
  # beside the background warm-up, 1.5 s alone), yet under steady load the rest must still come.
  YIELD_S = 2.0

  def _yield_to_requests(self, engine) -> None:
    deadline = time.monotonic() + self.YIELD_S
    while engine.busy() and time.monotonic() < deadline:
      time.sleep(0.05)

  def state(self) -> tuple[bool, str]:
    total = len(self.first) + len(self.rest)
    if self.ready_at is None:
      return False, f"compiling warm-up shapes ({self.done} of {len(self.first)} before ready)"
    if self.done < total and self.error is None:
      return True, f"serving; {total - self.done} warm-up shapes still compiling in the background"
    return True, ""


# ------------------------------------------------------------------------------------ app
def _post(loop, q, k: int, delta: Delta) -> None:
  """Hands a streamed delta to the request's event loop (a vanished client is not an error)."""
  try:
    loop.call_soon_threadsafe(q.put_nowait, (k, delta))
  except RuntimeError:  # the loop is closed
    pass


def default_max_tokens_for(sampler: Sampler, flag: int | None = None) -> int:
  """A request's max_tokens when it sets none: the flag, else the checkpoint's
  generation_config.json `max_new_tokens`, else 1024."""
  return flag or sampler.defaults.max_new_tokens or 1024


def create_app(sampler: Sampler, model_name: str = "lwm", max_batch: int = 32,
               window_ms: float = 10.0, default_max_tokens: int | None = None,
               max_rows_per_request: int | None = None, ready=None) -> FastAPI:
  """The app; a request may ask for at most `max_rows_per_request` sequences (n x prompts,
  default `max_batch`). `ready` (a callable returning (ready, detail)) gates /health and the
  generating endpoints with 503 until it says ready (see `launch/serve.py`)."""
  if getattr(sampler, "engine_kind", "static") == "continuous":
    batcher = ContinuousBatcher(sampler)
  else:
    batcher = Batcher(sampler, max_batch=max_batch, window_ms=window_ms)
  max_rows = max_rows_per_request or max_batch
  defaults = sampler.defaults.sampling()
  default_max = default_max_tokens_for(sampler, default_max_tokens)
  context = sampler.engine.context
  prefix = getattr(sampler.engine, "prefix_cache", None)
  metrics = Metrics(model_name, running=lambda: batcher.running, waiting=batcher.waiting,
                    prefix_cache=None if prefix is None else prefix.stats)
  ready = ready or (lambda: (True, ""))

  @contextlib.asynccontextmanager
  async def lifespan(_app):
    yield
    batcher.close()

  app = FastAPI(title="lwm_jax sampler", lifespan=lifespan)
  app.state.batcher = batcher
  created = int(time.time())
  kinds = {400: "invalid_request_error", 404: "invalid_request_error"}

  def error(status: int, msg: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {
        "message": msg, "type": kinds.get(status, "server_error"), "param": None,
        "code": "model_not_found" if status == 404 else None}})

  def prepare(raw: bytes, chat: bool):
    """Body -> (checked request, [(prompt ids, starts thinking)]); runs in a worker thread."""
    req = parse_request(load_body(raw), chat, model_name, default_max, max_rows, defaults)
    if chat:
      prepared = [sampler.prepare(p, req.chat_kwargs,
                                  add_generation_prompt=req.add_generation_prompt,
                                  continue_final_message=req.continue_final_message,
                                  chat_template=req.chat_template) for p in req.prompts]
    else:
      prepared = [sampler.prepare(text_ids(sampler.tokenizer, p) if isinstance(p, str) else p)
                  for p in req.prompts]
    mt = req.params.max_new_tokens
    for ids, _ in prepared:
      if len(ids) + mt > context and req.max_tokens_given:
        raise BadRequest(
            f"'max_tokens' is too large: the model's context is {context} tokens and the prompt "
            f"takes {len(ids)}, which leaves room for {context - len(ids)} generated tokens; "
            f"{mt} were asked for")
    return req, prepared

  def rows_for(prepared, params: SamplingParams, loop, q) -> list[RowRequest]:
    rows = []
    for ids, thinking in prepared:
      for c in range(params.n):
        k = len(rows)
        cb = None
        if q is not None:
          cb = functools.partial(_post, loop, q, k)
        rows.append(RowRequest(ids, params, c, cb, thinking))
    return rows

  async def handle(request: Request, chat: bool):
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    t0 = time.monotonic()
    ok, detail = ready()
    if not ok:
      metrics.request(endpoint, 503)
      return error(503, f"the model is not ready yet: {detail}")
    try:
      req, prepared = await asyncio.to_thread(prepare, await request.body(), chat)
    except (ModelNotFound, BadRequest, ValueError) as e:
      return _refused(endpoint, e)
    loop = asyncio.get_running_loop()
    q: asyncio.Queue | None = asyncio.Queue() if req.stream else None
    rows = rows_for(prepared, req.params, loop, q)
    fut = batcher.submit(rows)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    if req.stream:
      metrics.request(endpoint, 200)
      return StreamingResponse(_stream(rid, chat, rows, fut, q, req.include_usage, req.logprobs,
                                       t0),
                               media_type="text/event-stream")
    try:
      gens: list[Generation] = await asyncio.wrap_future(fut)
    except asyncio.CancelledError:  # the client went away before the reply
      if hasattr(batcher, "cancel"):
        batcher.cancel(fut)
      raise
    except Exception as e:  # noqa: BLE001
      metrics.request(endpoint, 500)
      return error(500, f"generation failed: {e}")
    metrics.request(endpoint, 200)
    _observe(gens, rows, t0)
    return JSONResponse(_response(rid, chat, gens, rows, req.logprobs))

  def _observe(gens, rows, t0, first=None) -> None:
    u = _usage(gens, rows)
    metrics.generated(u["prompt_tokens"], u["completion_tokens"],
                      [g.finish_reason for g in gens], time.monotonic() - t0,
                      None if first is None else first - t0)

  def _token(i: int) -> tuple[str, list[int]]:
    t = sampler.tokenizer.decode([i]) if i < sampler.tokenizer.vocab_size else ""
    return t, list(t.encode("utf-8"))

  def _logprob_ids(g: Generation) -> int:
    """How many of the generation's tokens its logprobs cover (a final end token is not text)."""
    n = len(g.token_ids)
    return n - 1 if n and g.token_ids[-1] in sampler.end_ids else n

  def _chat_logprobs(g: Generation, top_n: int) -> dict:
    content = []
    for k in range(_logprob_ids(g)):
      t, b = _token(g.token_ids[k])
      entry = {"token": t, "logprob": g.logprobs[k], "bytes": b, "top_logprobs": []}
      for i, lp in (g.top_logprobs[k][:top_n] if top_n and g.top_logprobs else []):
        ti, bi = _token(i)
        entry["top_logprobs"].append({"token": ti, "logprob": lp, "bytes": bi})
      content.append(entry)
    return {"content": content}

  def _completion_logprobs(g: Generation, top_n: int) -> dict:
    tokens, offsets, tops, at = [], [], [], 0
    for k in range(_logprob_ids(g)):
      t = _token(g.token_ids[k])[0]
      tokens.append(t)
      offsets.append(at)
      at += len(t)
      if top_n and g.top_logprobs:
        tops.append({_token(i)[0]: lp for i, lp in g.top_logprobs[k][:top_n]})
    return {"tokens": tokens, "token_logprobs": g.logprobs[:len(tokens)],
            "top_logprobs": tops if top_n else None, "text_offset": offsets}

  def _usage(gens: list[Generation], rows: list[RowRequest]) -> dict:
    prompt = sum(len(r.prompt_ids) for r in rows if r.choice == 0)
    comp = sum(g.completion_tokens for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": comp, "total_tokens": prompt + comp}

  def _response(rid: str, chat: bool, gens: list[Generation], rows, logprobs: bool) -> dict:
    choices = []
    for i, (g, r) in enumerate(zip(gens, rows)):
      lp = None
      if logprobs:
        lp = (_chat_logprobs if chat else _completion_logprobs)(g, r.params.top_logprobs)
      if chat:
        msg = {"role": "assistant", "content": g.raw_content}
        if g.raw_reasoning:
          msg["reasoning_content"] = g.raw_reasoning
        choices.append({"index": i, "message": msg, "finish_reason": g.finish_reason,
                        "stop_reason": g.stop_reason, "logprobs": lp})
      else:
        choices.append({"index": i, "text": g.text, "finish_reason": g.finish_reason,
                        "stop_reason": g.stop_reason, "logprobs": lp})
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model_name, "choices": choices,
            "usage": _usage(gens, rows)}

  async def _stream(rid, chat, rows, fut, q, include_usage, logprobs=False, t0=None):
    obj = "chat.completion.chunk" if chat else "text_completion"
    t0 = time.monotonic() if t0 is None else t0
    first = None

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
    try:
      while True:
        getter = asyncio.ensure_future(q.get())
        finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
        if getter in finished:
          k, d = getter.result()
          c = _delta_choice(k, d, chat)
          if c is not None:
            first = first or time.monotonic()
            yield chunk([c])
          continue
        getter.cancel()
        break
    finally:
      if not fut.done() and hasattr(batcher, "cancel"):
        batcher.cancel(fut)  # the client went away: its rows leave their slots
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # read, not logged
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
    _observe(gens, rows, t0, first)
    for i, (g, r) in enumerate(zip(gens, rows)):
      fin = {"index": i, "finish_reason": g.finish_reason, "stop_reason": g.stop_reason}
      fin.update({"delta": {}} if chat else {"text": ""})
      if logprobs:  # the choice's logprobs arrive whole with its last chunk
        fin["logprobs"] = (_chat_logprobs if chat else _completion_logprobs)(
            g, r.params.top_logprobs)
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
    ok, detail = ready()
    if not ok:
      return JSONResponse(status_code=503, content={"status": "loading", "detail": detail,
                                                    "model": model_name})
    return {"status": "ok", "model": model_name, "batches": batcher.batches,
            **({"detail": detail} if detail else {})}

  @app.api_route("/ping", methods=["GET", "POST"])
  async def ping():
    ok, detail = ready()
    return JSONResponse(status_code=200 if ok else 503, content={} if ok else {"detail": detail})

  def card() -> dict:
    return {"id": model_name, "object": "model", "created": created, "owned_by": "lwm_jax",
            "root": model_name, "parent": None, "max_model_len": context}

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [card()]}

  @app.get("/v1/models/{model_id:path}")
  async def model(model_id: str):
    if model_id != model_name:
      return error(404, f"The model '{model_id}' does not exist (this server serves "
                        f"'{model_name}')")
    return card()

  @app.get("/version")
  async def version():
    from lwm_jax import __version__  # pylint: disable=import-outside-toplevel
    return {"version": __version__}

  @app.get("/metrics")
  async def prometheus():
    return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

  def tokenize(raw: bytes) -> dict:
    body = load_body(raw)
    known = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
             "continue_final_message", "chat_template", "chat_template_kwargs",
             "return_token_strs"}
    bad = sorted(set(body) - known)
    if bad:
      raise BadRequest(f"unknown field '{bad[0]}'")
    m = body.get("model")
    if m is not None and m != model_name:
      raise ModelNotFound(f"The model '{m}' does not exist (this server serves '{model_name}')")
    if ("prompt" in body) == ("messages" in body):
      raise BadRequest("give either 'prompt' (a string) or 'messages' (a chat)")
    if "prompt" in body:
      if not isinstance(body["prompt"], str):
        raise BadRequest("'prompt' must be a string")
      ids = text_ids(sampler.tokenizer, body["prompt"])
    else:
      req = parse_request({"messages": body["messages"],
                           **{k: body[k] for k in ("add_generation_prompt",
                                                   "continue_final_message", "chat_template",
                                                   "chat_template_kwargs") if k in body}},
                          True, model_name, default_max, max_rows, defaults)
      ids, _ = sampler._chat_ids(req.prompts[0], dict(req.chat_kwargs),  # pylint: disable=protected-access
                                 req.add_generation_prompt, req.continue_final_message,
                                 req.chat_template)
    out = {"count": len(ids), "max_model_len": context, "tokens": ids, "token_strs": None}
    if _bool(body, "return_token_strs"):
      out["token_strs"] = [sampler.tokenizer.decode([i]) for i in ids]
    return out

  def detokenize(raw: bytes) -> dict:
    body = load_body(raw)
    bad = sorted(set(body) - {"model", "tokens"})
    if bad:
      raise BadRequest(f"unknown field '{bad[0]}'")
    m = body.get("model")
    if m is not None and m != model_name:
      raise ModelNotFound(f"The model '{m}' does not exist (this server serves '{model_name}')")
    ids = body.get("tokens")
    vocab = sampler.tokenizer.vocab_size
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in ids):
      raise BadRequest("'tokens' must be a list of token ids")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
      raise BadRequest(f"'tokens': id {bad[0]} is outside the vocabulary [0, {vocab})")
    return {"prompt": sampler.tokenizer.decode(ids)}

  def _refused(endpoint: str, e: Exception):
    """A request refused before generation: 404 for an unknown model, else 400, counted."""
    status = 404 if isinstance(e, ModelNotFound) else 400
    metrics.request(endpoint, status)
    return error(status, str(e))

  async def _simple(request: Request, fn, endpoint: str):
    try:
      out = await asyncio.to_thread(fn, await request.body())
    except (ModelNotFound, BadRequest, ValueError) as e:
      return _refused(endpoint, e)
    metrics.request(endpoint, 200)
    return out

  @app.post("/tokenize")
  async def tokenize_route(request: Request):
    return await _simple(request, tokenize, "/tokenize")

  @app.post("/detokenize")
  async def detokenize_route(request: Request):
    return await _simple(request, detokenize, "/detokenize")

  @app.post("/v1/chat/completions")
  async def chat_completions(request: Request):
    return await handle(request, chat=True)

  @app.post("/v1/completions")
  async def completions(request: Request):
    return await handle(request, chat=False)

  return app
