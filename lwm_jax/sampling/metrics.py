"""The server's `/metrics`: counters, gauges and histograms in the Prometheus text format (0.0.4).

Metric names follow vLLM's (`vllm:` prefix, a `model_name` label), so a dashboard or alert written
for a vLLM server reads ours: requests by outcome, prompt and generated tokens, requests running and
waiting, and histograms of end-to-end latency, time to the first token and tokens per request.
With the continuous engine, the prefix cache too: vLLM's `prefix_cache_queries` / `prefix_cache_hits`
token counters, and ours (`lwm:` prefix) for its hit rate, bytes, bound, entries and evictions.
No client library: the format is a few lines of text (https://prometheus.io/docs/instrumenting/
exposition_formats/).
"""
from __future__ import annotations

import bisect
import threading
from typing import Callable

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def _labels(d: dict[str, str]) -> str:
  if not d:
    return ""
  esc = {k: str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
         for k, v in d.items()}
  return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(esc.items())) + "}"


def _num(x: float) -> str:
  return repr(float(x)) if x != int(x) else f"{int(x)}.0" if abs(x) < 1e15 else repr(float(x))


class _Histogram:
  def __init__(self, buckets):
    self.buckets = tuple(buckets)
    self.counts = [0] * len(self.buckets)
    self.sum, self.count = 0.0, 0

  def observe(self, x: float) -> None:
    i = bisect.bisect_left(self.buckets, x)
    if i < len(self.counts):
      self.counts[i] += 1
    self.sum += x
    self.count += 1


class Metrics:
  """Thread-safe metrics of one served model; `render()` is the `/metrics` body."""

  def __init__(self, model_name: str, running: Callable[[], int] = lambda: 0,
               waiting: Callable[[], int] = lambda: 0,
               prefix_cache: Callable[[], dict] | None = None):
    self.model = model_name
    self._running, self._waiting = running, waiting
    self._prefix = prefix_cache  # the continuous engine's PrefixCache.stats, when there is one
    self._lock = threading.Lock()
    self.requests: dict[tuple[str, str], int] = {}   # (endpoint, status code) -> count
    self.finished: dict[str, int] = {}               # finish reason -> count
    self.prompt_tokens = 0
    self.generation_tokens = 0
    self.e2e = _Histogram(LATENCY_BUCKETS)
    self.ttft = _Histogram(LATENCY_BUCKETS)
    self.prompt_hist = _Histogram(TOKEN_BUCKETS)
    self.gen_hist = _Histogram(TOKEN_BUCKETS)

  def request(self, endpoint: str, status: int) -> None:
    with self._lock:
      key = (endpoint, str(status))
      self.requests[key] = self.requests.get(key, 0) + 1

  def generated(self, prompt_tokens: int, completion_tokens: int, finish_reasons, seconds: float,
                first_token_seconds: float | None = None) -> None:
    """One request that generated: its token counts, how its choices ended, its latency."""
    with self._lock:
      self.prompt_tokens += prompt_tokens
      self.generation_tokens += completion_tokens
      for r in finish_reasons:
        self.finished[r] = self.finished.get(r, 0) + 1
      self.e2e.observe(seconds)
      self.ttft.observe(seconds if first_token_seconds is None else first_token_seconds)
      self.prompt_hist.observe(prompt_tokens)
      self.gen_hist.observe(completion_tokens)

  def render(self) -> str:
    base = {"model_name": self.model}
    out: list[str] = []

    def head(name: str, kind: str, help_: str) -> None:
      out.append(f"# HELP {name} {help_}")
      out.append(f"# TYPE {name} {kind}")

    def hist(name: str, h: _Histogram, help_: str) -> None:
      head(name, "histogram", help_)
      acc = 0
      for b, c in zip(h.buckets, h.counts):
        acc += c
        out.append(f"{name}_bucket{_labels(base | {'le': _num(b)})} {acc}")
      out.append(f"{name}_bucket{_labels(base | {'le': '+Inf'})} {h.count}")
      out.append(f"{name}_sum{_labels(base)} {_num(h.sum)}")
      out.append(f"{name}_count{_labels(base)} {h.count}")

    with self._lock:
      head("vllm:num_requests_running", "gauge", "Rows being decoded now.")
      out.append(f"vllm:num_requests_running{_labels(base)} {self._running()}")
      head("vllm:num_requests_waiting", "gauge", "Requests queued for the next batch.")
      out.append(f"vllm:num_requests_waiting{_labels(base)} {self._waiting()}")
      head("vllm:http_requests_total", "counter", "HTTP requests by endpoint and status code.")
      for (ep, code), n in sorted(self.requests.items()):
        out.append(f"vllm:http_requests_total{_labels(base | {'endpoint': ep, 'status': code})} "
                   f"{n}")
      head("vllm:request_success_total", "counter", "Finished choices by finish reason.")
      for r, n in sorted(self.finished.items()):
        out.append(f"vllm:request_success_total{_labels(base | {'finished_reason': r})} {n}")
      head("vllm:prompt_tokens_total", "counter", "Prompt tokens of generating requests.")
      out.append(f"vllm:prompt_tokens_total{_labels(base)} {self.prompt_tokens}")
      head("vllm:generation_tokens_total", "counter", "Generated tokens.")
      out.append(f"vllm:generation_tokens_total{_labels(base)} {self.generation_tokens}")
      hist("vllm:e2e_request_latency_seconds", self.e2e,
           "Seconds from a request's arrival to its last token.")
      hist("vllm:time_to_first_token_seconds", self.ttft,
           "Seconds from a request's arrival to its first streamed text (the whole reply when "
           "not streamed).")
      hist("vllm:request_prompt_tokens", self.prompt_hist, "Prompt tokens per request.")
      hist("vllm:request_generation_tokens", self.gen_hist, "Generated tokens per request.")
    if self._prefix is not None:
      p = self._prefix()
      for name, kind, value, help_ in (
          ("vllm:prefix_cache_queries_total", "counter", p["query_tokens"],
           "Prompt tokens looked up in the prefix cache."),
          ("vllm:prefix_cache_hits_total", "counter", p["hit_tokens"],
           "Prompt tokens served from the prefix cache (not prefilled again)."),
          ("lwm:prefix_cache_lookups_total", "counter", p["lookups"], "Prompts looked up."),
          ("lwm:prefix_cache_request_hits_total", "counter", p["hits"],
           "Prompts that found a cached prefix."),
          ("lwm:prefix_cache_hit_rate", "gauge", p["token_hit_rate"],
           "Share of looked-up prompt tokens served from the prefix cache."),
          ("lwm:prefix_cache_bytes", "gauge", p["bytes"], "Bytes held by the prefix cache."),
          ("lwm:prefix_cache_max_bytes", "gauge", p["max_bytes"], "The prefix cache's bound."),
          ("lwm:prefix_cache_entries", "gauge", p["entries"], "Prefixes held."),
          ("lwm:prefix_cache_evictions_total", "counter", p["evicted"],
           "Prefixes evicted to stay within the bound.")):
        head(name, kind, help_)
        out.append(f"{name}{_labels(base)} {_num(value)}")
    return "\n".join(out) + "\n"
