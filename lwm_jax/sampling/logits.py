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


# Rows are filtered from their `FILTER_HEAD` largest logits (`lax.top_k`) when that settles them,
# instead of sorting the whole vocabulary (about 1.5 s per decode step at batch 32 over Qwen's
# 152k-piece vocabulary on CPU); the rest of the batch falls back to the full sort.
FILTER_HEAD = 256
_WHOLE_ROW = 2 ** 30   # the top-k of a row that sets none


def _keep_sorted(srt_BxL, lse_B, top_k_B, top_p_B, min_p_B):
  """Over each row's largest logits in descending order (all of them, or a head of them), the
  count that top-k, then top-p, then min-p keep, each on the renormalised rest. `lse_B` is the
  log-normaliser of the whole row, used where top-k keeps every token."""
  keep = jnp.arange(srt_BxL.shape[-1])[None, :] < top_k_B[:, None]
  norm = jnp.where(top_k_B == _WHOLE_ROW, lse_B,
                   jax.nn.logsumexp(jnp.where(keep, srt_BxL, NEG_INF), axis=-1))
  p = jnp.where(keep, jnp.exp(srt_BxL - norm[:, None]), 0.0)
  keep &= (jnp.cumsum(p, axis=-1) - p) < top_p_B[:, None]                  # first always kept
  # min-p: p_i >= min_p * p_max, i.e. logit_i - logit_max >= log(min_p), whatever the normaliser
  keep &= srt_BxL - srt_BxL[:, :1] >= jnp.log(min_p_B)[:, None]
  return jnp.maximum(jnp.sum(keep, axis=-1), 1)


def _filter_logits(scaled_BxV, top_k_B, top_p_B, min_p_B, head: int = FILTER_HEAD):
  """Masks (to -inf) what top-k, then top-p, then min-p remove; each on the renormalised rest."""
  v = scaled_BxV.shape[-1]
  k = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, v), _WHOLE_ROW)
  lse = jax.nn.logsumexp(scaled_BxV, axis=-1)

  def threshold(srt):
    count = _keep_sorted(srt, lse, k, top_p_B, min_p_B)
    return jnp.take_along_axis(srt, (count - 1)[:, None], axis=-1), count

  def full(_):
    return threshold(-jnp.sort(-scaled_BxV, axis=-1))[0]

  if head >= v:
    cut = full(None)
  else:
    top, _ = jax.lax.top_k(scaled_BxV, head)
    cut_head, count = threshold(top)
    # A row is settled by its head when its top-k fits in the head (the normaliser is then
    # inside it), when it has no top-k (the normaliser is `lse`) and its cut falls before the
    # head's end, or when it filters nothing (a batch mixes such rows with filtered ones).
    free = (k == _WHOLE_ROW) & (top_p_B >= 1.0) & (min_p_B <= 0.0)
    settled = (k <= head) | ((k == _WHOLE_ROW) & (count < head)) | free
    cut_head = jnp.where(free[:, None], NEG_INF, cut_head)
    cut = jax.lax.cond(jnp.all(settled), lambda _: cut_head, full, None)
  return jnp.where(scaled_BxV >= cut, scaled_BxV, NEG_INF)


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


def sample_tokens(logits_BxV, keys_B, temperature_B, top_k_B, top_p_B, min_p_B, penalties=None):
  """Returns (tokens [B], log p(token) under the raw distribution [B]).

  `penalties`, when given, is (counts [B, V], seen [B, V], repetition [B], presence [B],
  frequency [B]) for `apply_penalties`; they change which token is chosen, not its logprob."""
  raw = logits_BxV.astype(jnp.float32)
  lse = jax.nn.logsumexp(raw, axis=-1)
  logits = raw if penalties is None else apply_penalties(raw, *penalties)
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
