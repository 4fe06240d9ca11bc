"""Model backends: our own Sampler, any OpenAI-compatible endpoint, or a plain function.

Evaluation, judging and RL rewards all ask a model the same way through these.

A backend turns conversations (lists of chat messages) into completions. `complete_many` yields
`(index, Completion | Exception)` as results arrive, so a caller can save each at once; an
exception is one conversation's failure, never the whole run's.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import random
import time
from typing import Any, Callable, Iterator, Sequence

import httpx

from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]


@dataclasses.dataclass
class Completion:
  text: str
  reasoning: str = ""
  finish_reason: str | None = None


class BackendError(RuntimeError):
  pass


class Backend:
  """Base: subclasses implement `complete` (one at a time, thread-safe) or `complete_many`."""
  name = "backend"
  concurrency = 1

  def complete(self, messages: Messages) -> Completion:
    raise NotImplementedError

  def complete_many(self, convs: Sequence[Messages]
                    ) -> Iterator[tuple[int, Completion | Exception]]:
    if self.concurrency <= 1:
      for i, msgs in enumerate(convs):
        try:
          yield i, self.complete(msgs)
        except Exception as e:  # noqa: BLE001 - one conversation's failure is reported, not raised
          yield i, e
      return
    with cf.ThreadPoolExecutor(self.concurrency) as pool:
      futures = {pool.submit(self.complete, msgs): i for i, msgs in enumerate(convs)}
      try:
        for fut in cf.as_completed(futures):
          try:
            yield futures[fut], fut.result()
          except Exception as e:  # noqa: BLE001
            yield futures[fut], e
      finally:
        for fut in futures:
          fut.cancel()


class FunctionBackend(Backend):
  """Wraps `fn(messages) -> str` (tests, rule-based systems)."""

  def __init__(self, fn: Callable[[Messages], str], name: str = "function", concurrency: int = 1):
    self.fn, self.name, self.concurrency = fn, name, concurrency

  def complete(self, messages: Messages) -> Completion:
    return Completion(text=self.fn(messages))


def chat_url(endpoint: str) -> str:
  """`http://host:8000/v1` -> `http://host:8000/v1/chat/completions` (a full URL is kept)."""
  endpoint = endpoint.rstrip("/")
  return endpoint if endpoint.endswith("/chat/completions") else endpoint + "/chat/completions"


class OpenAIBackend(Backend):
  """POSTs to `{endpoint}/chat/completions` with bounded concurrency and retries.

  Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff and jitter
  (a `Retry-After` header is honoured); other HTTP errors fail at once. `temperature=None` leaves
  the field out for APIs that reject it.
  """

  def __init__(self, endpoint: str, model: str, *, temperature: float | None = 0.6,
               max_tokens: int | None = 32768, concurrency: int = 8, retries: int = 5,
               backoff_s: float = 1.0, max_backoff_s: float = 60.0, timeout_s: float = 600.0,
               api_key: str | None = None, seed: int | None = None,
               extra_body: dict[str, Any] | None = None):
    self.url, self.model, self.name = chat_url(endpoint), model, model
    self.temperature, self.max_tokens, self.seed = temperature, max_tokens, seed
    self.concurrency, self.retries = max(1, concurrency), retries
    self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
    self.extra_body = dict(extra_body or {})
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    self.client = httpx.Client(timeout=timeout_s, headers=headers,
                               limits=httpx.Limits(max_connections=self.concurrency))

  def payload(self, messages: Messages) -> dict[str, Any]:
    body: dict[str, Any] = {"model": self.model, "messages": messages}
    if self.temperature is not None:
      body["temperature"] = self.temperature
    if self.max_tokens is not None:
      body["max_tokens"] = self.max_tokens
    if self.seed is not None:
      body["seed"] = self.seed
    body.update(self.extra_body)
    return body

  def _wait(self, attempt: int, retry_after: str | None) -> None:
    delay = min(self.max_backoff_s, self.backoff_s * 2 ** attempt) * (0.5 + random.random() / 2)
    if retry_after:
      try:
        delay = max(delay, min(self.max_backoff_s, float(retry_after)))
      except ValueError:
        pass
    time.sleep(delay)

  def complete(self, messages: Messages) -> Completion:
    body = self.payload(messages)
    last: str = ""
    for attempt in range(self.retries + 1):
      retry_after = None
      try:
        resp = self.client.post(self.url, json=body)
      except httpx.TransportError as e:
        last = f"{type(e).__name__}: {e}"
      else:
        if resp.status_code == 200:
          return _parse_chat_response(resp, self.url)
        last = f"HTTP {resp.status_code}: {resp.text[:300]}"
        if resp.status_code != 429 and resp.status_code < 500:
          raise BackendError(f"{self.url}: {last}")
        retry_after = resp.headers.get("retry-after")
      if attempt < self.retries:
        log.debug("retrying %s after %s", self.url, last)
        self._wait(attempt, retry_after)
    raise BackendError(f"{self.url}: gave up after {self.retries + 1} attempts; last: {last}")

  def close(self) -> None:
    self.client.close()


def _parse_chat_response(resp: httpx.Response, url: str) -> Completion:
  try:
    data = resp.json()
    choice = data["choices"][0]
    msg = choice.get("message") or {}
  except (ValueError, KeyError, IndexError, TypeError) as e:
    raise BackendError(f"{url}: malformed chat completion ({e}): {resp.text[:300]}") from None
  reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
  return Completion(text=msg.get("content") or "", reasoning=reasoning if isinstance(
      reasoning, str) else "", finish_reason=choice.get("finish_reason"))


class SamplerBackend(Backend):
  """Our `Sampler`, fed `batch_size` conversations per `generate` call. `make_params` builds the
  sampling parameters (default `SamplingParams`); tests pass a stand-in with a fake sampler."""

  def __init__(self, sampler: Any, *, temperature: float = 0.6, max_new_tokens: int = 32768,
               seed: int = 0, batch_size: int = 8, name: str = "sampler",
               make_params: Callable[..., Any] | None = None):
    self.sampler, self.name, self.batch_size = sampler, name, max(1, batch_size)
    self.make_params = make_params
    self.temperature, self.max_new_tokens, self.seed = temperature, max_new_tokens, seed

  @classmethod
  def from_checkpoint(cls, directory: str, decode_dtype: str | None = None,
                      **kw: Any) -> "SamplerBackend":
    kw.setdefault("name", directory.rstrip("/").rsplit("/", 1)[-1] or "checkpoint")
    return cls(Sampler.from_checkpoint(directory, decode_dtype=decode_dtype), **kw)

  def _params(self, batch_no: int) -> Any:
    kw = dict(temperature=self.temperature, max_new_tokens=self.max_new_tokens,
              seed=self.seed + batch_no)
    return (self.make_params or SamplingParams)(**kw)

  def complete_many(self, convs: Sequence[Messages]
                    ) -> Iterator[tuple[int, Completion | Exception]]:
    for b, start in enumerate(range(0, len(convs), self.batch_size)):
      chunk = list(convs[start:start + self.batch_size])
      try:
        results = self.sampler.generate(chunk, self._params(b))
        if len(results) != len(chunk):
          raise BackendError(f"sampler returned {len(results)} results for {len(chunk)} prompts")
      except Exception as e:  # noqa: BLE001 - the batch fails, the run goes on
        for j in range(len(chunk)):
          yield start + j, e
        continue
      for j, r in enumerate(results):
        if isinstance(r, (list, tuple)):  # n > 1 samples per prompt: the first is used
          r = r[0]
        yield start + j, Completion(text=getattr(r, "text", r),
                                    finish_reason=getattr(r, "finish_reason", None))

  def complete(self, messages: Messages) -> Completion:
    (_, out), = list(self.complete_many([messages]))
    if isinstance(out, Exception):
      raise out
    return out
