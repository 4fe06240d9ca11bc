"""From a row's logits to its next token: penalties, temperature, top-k / top-p / min-p, the draw.

Everything here runs inside the jitted decode step, per row of the batch.

Penalties (applied first, to the logits the token is chosen from; the log-probability returned with
a token is always that of the model's raw distribution, so GSPO's "old" log-probabilities stay
exact whatever a request sets):

* repetition (Hugging Face / vLLM semantics): for every token seen in the prompt or the output so
  far, a positive logit is divided by the penalty and a negative one multiplied by it;
* frequency and presence (OpenAI semantics, output tokens only): the logit of a token generated c
  times so far loses `frequency * c + presence * (c > 0)`.

A batch in which no row sets a penalty skips that arithmetic entirely (`lax.cond`), so its logits
are bit-for-bit the model's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def apply_penalties(logits_BxV, counts_BxV, seen_BxV, repetition_B, presence_B, frequency_B):
  """The penalised logits (see the module docstring); counts are output-token counts, `seen`
  marks prompt tokens."""
  def penalise(x):
    out = counts_BxV > 0
    rep = repetition_B[:, None]
    hit = (out | seen_BxV) & (rep != 1.0)
    x = jnp.where(hit, jnp.where(x > 0, x / rep, x * rep), x)
    return x - frequency_B[:, None] * counts_BxV - presence_B[:, None] * out.astype(x.dtype)

  wants = (repetition_B != 1.0) | (presence_B != 0.0) | (frequency_B != 0.0)
  return jax.lax.cond(jnp.any(wants), penalise, lambda x: x, logits_BxV)


# Each row's cut is found by bisection over the float32 bit patterns (as unsigned integers ordered
# like the floats): 32 masked reductions over the row find the exact value at which top-k, top-p
# or min-p stops, ties included, with no sort. Sorting Qwen's 152k-piece vocabulary (the
# reference, `method="sort"`) costs about 1.5 s per decode step at batch 32 on CPU, and
# `lax.top_k` nearly as much (benchmarks/results/speed.md).
_WHOLE_ROW = 2 ** 30   # the top-k of a row that sets none
_BLOCK_ROWS = 8        # rows bisected together: 8 x 152k float32 stay in this CPU's cache


def _keep_sorted(srt_BxL, lse_B, top_k_B, top_p_B, min_p_B):
  """Over each row's logits in descending order, the count that top-k, then top-p, then min-p
  keep, each on the renormalised rest. `lse_B` is the log-normaliser of the whole row, used where
  top-k keeps every token."""
  keep = jnp.arange(srt_BxL.shape[-1])[None, :] < top_k_B[:, None]
  norm = jnp.where(top_k_B == _WHOLE_ROW, lse_B,
                   jax.nn.logsumexp(jnp.where(keep, srt_BxL, NEG_INF), axis=-1))
  p = jnp.where(keep, jnp.exp(srt_BxL - norm[:, None]), 0.0)
  keep &= (jnp.cumsum(p, axis=-1) - p) < top_p_B[:, None]                  # first always kept
  # min-p: p_i >= min_p * p_max, i.e. logit_i - logit_max >= log(min_p), whatever the normaliser
  keep &= srt_BxL - srt_BxL[:, :1] >= jnp.log(min_p_B)[:, None]
  return jnp.maximum(jnp.sum(keep, axis=-1), 1)


def _ordered_bits(x):
  """float32 -> uint32 with the same order (-0.0 taken as +0.0)."""
  u = jax.lax.bitcast_convert_type(jnp.where(x == 0, 0.0, x), jnp.uint32)
  return jnp.where(u >> 31 == 1, ~u, u | jnp.uint32(0x80000000))


def _smallest_key(keys_BxV, holds):
  """Per row, the smallest key t of the row's own keys for which `holds(t [B, 1])` ([B] bool),
  given that it holds at the row's largest key and, once it holds, holds for every larger t."""
  lo = jnp.min(keys_BxV, axis=-1) - 1   # treated as "does not hold" (keys are never 0: NaN only)
  hi = jnp.max(keys_BxV, axis=-1)

  def step(_, c):  # lo < mid < hi while hi - lo > 1; then mid = hi, which holds: a fixed point
    lo, hi = c
    mid = hi - (hi - lo) // 2
    ok = holds(mid[:, None])
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

  return jax.lax.fori_loop(0, 32, step, (lo, hi))[1]


def _filter_logits(scaled_BxV, top_k_B, top_p_B, min_p_B, method: str = "bisect"):
  """Masks (to -inf) what top-k, then top-p, then min-p remove; each on the renormalised rest.
  Every token tied with the last one kept is kept too. `method="sort"` is the reference."""
  b = scaled_BxV.shape[0]
  # blocks of rows that stay in cache over the 64 passes
  if method == "bisect" and b > _BLOCK_ROWS and b % _BLOCK_ROWS == 0:
    blocks = lambda a: a.reshape(b // _BLOCK_ROWS, _BLOCK_ROWS, *a.shape[1:])
    out = jax.lax.map(lambda a: _filter_logits(*a, method=method),
                      (blocks(scaled_BxV), blocks(top_k_B), blocks(top_p_B), blocks(min_p_B)))
    return out.reshape(scaled_BxV.shape)
  v = scaled_BxV.shape[-1]
  k = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, v), _WHOLE_ROW)
  lse = jax.nn.logsumexp(scaled_BxV, axis=-1)
  if method == "sort":
    srt = -jnp.sort(-scaled_BxV, axis=-1)
    count = _keep_sorted(srt, lse, k, top_p_B, min_p_B)
    cut = jnp.take_along_axis(srt, (count - 1)[:, None], axis=-1)
    return jnp.where(scaled_BxV >= cut, scaled_BxV, NEG_INF)
  keys = _ordered_bits(scaled_BxV)
  top = jnp.max(scaled_BxV, axis=-1)
  has_k, has_p = k < v, top_p_B < 1.0

  def top_k_cut(_):
    """The k-th largest value (fewer than k tokens lie above it) and top-k's normaliser, which
    counts exactly k tokens: those above the cut plus as many tied at it as fit."""
    cut = _smallest_key(keys, lambda t: ~has_k | (jnp.sum(keys > t, axis=-1) < k))
    over = keys > cut[:, None]
    at_cut = jnp.min(jnp.where(keys >= cut[:, None], scaled_BxV, jnp.inf), axis=-1)
    mass_over = jnp.sum(jnp.where(over, jnp.exp(scaled_BxV - top[:, None]), 0.0), axis=-1)
    norm = top + jnp.log(mass_over + (k - jnp.sum(over, axis=-1)) * jnp.exp(at_cut - top))
    return cut, jnp.where(has_k, norm, lse)

  cut_k, norm = jax.lax.cond(jnp.any(has_k), top_k_cut,
                             lambda _: (jnp.zeros_like(top, jnp.uint32), lse), None)

  def top_p_cut(_):  # the smallest value with less than top_p of the mass above it
    q = jnp.exp(scaled_BxV - norm[:, None])
    return _smallest_key(keys, lambda t: ~has_p | (jnp.sum(jnp.where(keys > t, q, 0.0), axis=-1)
                                                    < top_p_B))

  cut_p = jax.lax.cond(jnp.any(has_p), top_p_cut, lambda _: jnp.zeros_like(top, jnp.uint32), None)
  cut = jnp.maximum(jnp.where(has_k, cut_k, 0), jnp.where(has_p, cut_p, 0))
  keep = (keys >= cut[:, None]) & (scaled_BxV - top[:, None] >= jnp.log(min_p_B)[:, None])
  return jnp.where(keep, scaled_BxV, NEG_INF)


def _draw(keys_B, scaled_BxV):
  """One categorical draw per row by inverting the CDF with a single uniform (cheaper on CPU than
  Gumbel noise over the whole vocabulary)."""
  cdf = jnp.cumsum(jax.nn.softmax(scaled_BxV, axis=-1), axis=-1)
  u = jax.vmap(jax.random.uniform)(keys_B) * cdf[:, -1]
  tok = jnp.sum(cdf < u[:, None], axis=-1)
  return jnp.minimum(tok, scaled_BxV.shape[-1] - 1).astype(jnp.int32)


def _argmax(x_BxV):
  """First index of the row maximum, as two plain reductions (XLA's CPU argmax, one reduction of
  (value, index) pairs, takes ~4x as long over a vocabulary)."""
  v = x_BxV.shape[-1]
  hit = x_BxV == jnp.max(x_BxV, axis=-1, keepdims=True)
  return jnp.minimum(jnp.min(jnp.where(hit, jnp.arange(v, dtype=jnp.int32), v), axis=-1), v - 1)


def sample_tokens(logits_BxV, keys_B, temperature_B, top_k_B, top_p_B, min_p_B, penalties=None,
                  banned_BxV=None):
  """Returns (tokens [B], log p(token) under the raw distribution [B]).

  `penalties`, when given, is (counts [B, V], seen [B, V], repetition [B], presence [B],
  frequency [B]) for `apply_penalties`; they change which token is chosen, not its logprob.
  `banned_BxV` (bool) ids are never chosen (a request's `min_tokens` bans its stop ids)."""
  raw = logits_BxV.astype(jnp.float32)
  lse = jax.nn.logsumexp(raw, axis=-1)
  logits = raw if penalties is None else apply_penalties(raw, *penalties)
  if banned_BxV is not None:
    logits = jnp.where(banned_BxV, -jnp.inf, logits)
  greedy = _argmax(logits)
  sampling = temperature_B > 0

  def sample(_):
    scaled = logits / jnp.where(sampling, temperature_B, 1.0)[:, None]
    wants = sampling & ((top_k_B > 0) | (top_p_B < 1.0) | (min_p_B > 0.0))
    scaled = jax.lax.cond(jnp.any(wants), _filter_logits, lambda x, *_: x,
                          scaled, jnp.where(wants, top_k_B, 0), jnp.where(wants, top_p_B, 1.0),
                          jnp.where(wants, min_p_B, 0.0))
    return jnp.where(sampling, _draw(keys_B, scaled), greedy)

  tokens = jax.lax.cond(jnp.any(sampling), sample, lambda _: greedy, None)
  return tokens, jnp.take_along_axis(raw, tokens[:, None], axis=-1)[:, 0] - lse
