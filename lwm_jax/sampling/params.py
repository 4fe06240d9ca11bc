"""Sampling parameters of one request, and the result of one generated sequence."""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

INT32_MAX = 2 ** 31 - 1


@dataclasses.dataclass
class SamplingParams:
  """How to sample one sequence.

  temperature 0 is greedy (argmax). top_k 0, top_p 1 and min_p 0 switch their filter off. Filters
  apply to the temperature-scaled distribution in the order top-k, top-p, min-p (each on what the
  previous one kept, renormalised). `seed` makes a sampled sequence reproducible whatever else is
  in the batch. Generation ends at `max_new_tokens`, at a token in `stop_token_ids` (the tokenizer's
  end-of-turn token is added unless `ignore_eos`), or at the first occurrence of a `stop` string
  (the returned text ends before it).

  Penalties change which token is drawn, never the returned logprobs: `repetition_penalty` (1 is
  off) divides positive / multiplies negative logits of tokens seen in the prompt or output;
  `presence_penalty` and `frequency_penalty` (0 is off) subtract from the logits of tokens
  generated so far (see `lwm_jax.sampling.logits`). `top_logprobs` > 0 also returns, per token,
  that many most likely alternatives with their raw logprobs (at most 20).
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  min_p: float = 0.0
  max_new_tokens: int = 256
  seed: int = 0
  stop: Sequence[str] = ()
  stop_token_ids: Sequence[int] = ()
  ignore_eos: bool = False
  n: int = 1
  repetition_penalty: float = 1.0
  presence_penalty: float = 0.0
  frequency_penalty: float = 0.0
  top_logprobs: int = 0
  min_tokens: int = 0                     # stop ids and stop strings wait for this many tokens
  include_stop_str_in_output: bool = False  # the text keeps the stop string that ended it

  def validate(self) -> "SamplingParams":
    """Raises ValueError naming the first bad field."""
    def need(cond: bool, field: str, why: str):
      if not cond:
        raise ValueError(f"{field}: {why}")
    for f in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
              "frequency_penalty"):
      v = getattr(self, f)
      need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), f,
           f"must be a finite number, got {v!r}")
    for f in ("top_k", "max_new_tokens", "n", "seed", "top_logprobs", "min_tokens"):
      v = getattr(self, f)
      need(isinstance(v, int) and not isinstance(v, bool), f, f"must be an integer, got {v!r}")
    need(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
    need(0 <= self.top_k <= INT32_MAX, "top_k", f"must be in [0, {INT32_MAX}], got {self.top_k}")
    need(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
    need(0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p}")
    need(1 <= self.max_new_tokens <= INT32_MAX, "max_new_tokens",
         f"must be in [1, {INT32_MAX}], got {self.max_new_tokens}")
    need(self.repetition_penalty > 0, "repetition_penalty",
         f"must be > 0, got {self.repetition_penalty}")
    need(0 <= self.top_logprobs <= 20, "top_logprobs", f"must be in [0, 20], got {self.top_logprobs}")
    need(self.n >= 1, "n", f"must be >= 1, got {self.n}")
    need(0 <= self.min_tokens <= self.max_new_tokens, "min_tokens",
         f"must be in [0, max_new_tokens={self.max_new_tokens}], got {self.min_tokens}")
    need(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
    need(all(isinstance(t, int) and 0 <= t <= INT32_MAX for t in self.stop_token_ids),
         "stop_token_ids", "must be non-negative token ids")
    return self

  def replace(self, **kw) -> "SamplingParams":
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass
class Generation:
  """One generated sequence.

  `token_ids` are the generated tokens (a stop token that ended the sequence included, tokens
  after a stop string excluded); `logprobs[i]` is log p(token_ids[i]) under the model's raw
  distribution (temperature 1, no filter), the "old" log-probabilities GSPO needs. `finish_reason`
  is "stop" (stop token or string) or "length" (max_new_tokens or the context filled up).
  """
  text: str
  token_ids: list[int]
  logprobs: list[float]
  finish_reason: str
  prompt_tokens: int = 0
  reasoning: str = ""
  content: str = ""
  # Per token, when asked for (SamplingParams.top_logprobs): the most likely (id, raw logprob).
  top_logprobs: list[list[tuple[int, float]]] | None = None
  # The reply split at the thinking tags exactly as streamed (nothing stripped; the server's
  # `content` and `reasoning_content`), and what ended it: the stop string, the stop token id
  # from the request's stop_token_ids, or None (an end-of-turn token, the length limit).
  raw_content: str = ""
  raw_reasoning: str = ""
  stop_reason: str | int | None = None

  @property
  def completion_tokens(self) -> int:
    return len(self.token_ids)
