"""Teacher-forced NLL of rendered rows: (ids, loss weights) pairs, as the drills render them.

The experiments that ask how a skill grows with training (the departure, listing and copy
drills) score held-out rows at each checkpoint: the NLL of every next token, whether it is the
model's argmax, and the weighted mean over a row set's target tokens.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lwm_jax.data import drill_sources
from lwm_jax.train import losses

Row = tuple  # (ids, weights) or (ids, weights, segment ids)


def pad(rows: Sequence[Row], seq_len: int) -> tuple[jax.Array, jax.Array]:
  """Tokens and weights [len(rows), seq_len], zero-padded after each row (the drills' packing)."""
  b = drill_sources.pack(rows, seq_len)
  return jnp.asarray(b["tokens"]), jnp.asarray(b["loss_weights"])


def token_nll(model, toks, segs=None):
  """NLL of each next token [B, S-1], whether it is the argmax, and the MoE aux loss; `segs`
  (optional [B, S] segment ids) packs several documents into a row."""
  out = model(toks, segment_ids=segs)
  logp, _ = losses.token_logprobs(out.logits[:, :-1], toks[:, 1:])
  return -logp, jnp.argmax(out.logits[:, :-1], -1) == toks[:, 1:], out.aux_loss


@nnx.jit
def score(model, toks):
  """(NLL [B, S-1], argmax hits [B, S-1]) of a padded batch."""
  nll, hit, _ = token_nll(model, toks)
  return nll, hit


def weighted_nll(model, rows: Sequence[Row], seq_len: int, batch: int) -> float:
  """Mean NLL a target token over `rows`, each target weighted by its row's loss weight (the
  last batch is filled up with copies of its last row, which are not counted)."""
  total, count = 0.0, 0.0
  for s in range(0, len(rows), batch):
    chunk = list(rows[s:s + batch])
    toks, wts = pad(chunk + [chunk[-1]] * (batch - len(chunk)), seq_len)
    nll, _ = jax.device_get(score(model, toks))
    w = np.asarray(wts)[:len(chunk), 1:]
    total += float((nll[:len(chunk)] * w).sum())
    count += float(w.sum())
  return total / max(count, 1.0)
