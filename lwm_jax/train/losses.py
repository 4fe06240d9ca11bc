"""Losses: weighted next-token cross-entropy, and the policy-gradient losses GSPO, GSPO-token and GRPO.

Conventions for the policy losses (docs/recipe.md, "Stage 3"): every per-token array is [B, T]
over the response positions of B sampled responses, `mask_BxT` is 1 on response tokens and 0
elsewhere (prompt, padding); `logp_BxT` are the current policy's log-probabilities of the sampled tokens, `old_logp_BxT` those of
the policy that sampled them. Each loss returns (scalar loss to MINIMISE, metrics dict). The
advantages are per sequence `[B]` (broadcast over tokens) or per token `[B, T]` (GSPO-token, GRPO).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from lwm_jax import sharding as shd

Metrics = dict[str, jax.Array]


# ----------------------------------------------------------------------- next-token cross-entropy
def token_logprobs(logits_BxSxV: jax.Array, targets_BxS: jax.Array) -> tuple[jax.Array, jax.Array]:
  """log p(target) per position and the log-partition (fp32), both [B, S]."""
  logits = logits_BxSxV.astype(jnp.float32)
  lse_BxS = jax.nn.logsumexp(logits, axis=-1)
  picked_BxS = jnp.take_along_axis(logits, targets_BxS[..., None], axis=-1)[..., 0]
  return picked_BxS - lse_BxS, lse_BxS


def _position_slices(x_BxT, p: int):
  """[B, T, ...] -> [n, B, p, ...]: slice i holds positions [i * p, (i + 1) * p) of every row
  (the last one padded with zeros)."""
  b, t = x_BxT.shape[:2]
  n = -(-t // p)
  x = jnp.pad(x_BxT, [(0, 0), (0, n * p - t)] + [(0, 0)] * (x_BxT.ndim - 2))
  return jnp.swapaxes(x.reshape((b, n, p) + x_BxT.shape[2:]), 0, 1)


def _unslice(x_NxBxP, t: int):
  """`_position_slices`' inverse: [n, B, p, ...] -> [B, T, ...]."""
  n, b, p = x_NxBxP.shape[:3]
  return jnp.swapaxes(x_NxBxP, 0, 1).reshape((b, n * p) + x_NxBxP.shape[3:])[:, :t]


def sliced_token_logprobs(hidden_BxTxD, head_DxV, targets_BxT, positions: int) -> jax.Array:
  """`token_logprobs(hidden @ head, targets)[0]`, [B, T] fp32, made `positions` positions of every
  row at a time (a `lax.map` over slices), so only [B, positions, V] logits exist at once."""
  t = hidden_BxTxD.shape[1]
  p = max(1, min(positions, t))
  head = head_DxV.astype(hidden_BxTxD.dtype)

  def one(xs):
    h_s, t_s = xs
    logits = jnp.einsum("bpd,dv->bpv", h_s, head, preferred_element_type=jnp.float32)
    return token_logprobs(logits, t_s)[0]

  return _unslice(jax.lax.map(one, (_position_slices(hidden_BxTxD, p),
                                    _position_slices(targets_BxT, p))), t)


def shifted_targets(tokens_BxS, segment_ids_BxS, loss_weights_BxS):
  """Targets tokens[:, 1:] with weights loss_weights[:, 1:]; pairs that cross a segment boundary or
  lead into padding (segment 0) get weight 0."""
  same = (segment_ids_BxS[:, 1:] == segment_ids_BxS[:, :-1]) & (segment_ids_BxS[:, 1:] != 0)
  w = loss_weights_BxS[:, 1:].astype(jnp.float32) * same.astype(jnp.float32)
  return tokens_BxS[:, 1:], w


def cross_entropy_sums(logits_BxSxV, tokens_BxS, segment_ids_BxS, loss_weights_BxS,
                       z_loss_coef: float = 0.0) -> Metrics:
  """Sums (not means) so that micro-batches and devices can be added before normalising:
  `nll` = sum w * -log p, `z` = sum w * logZ^2, `weight` = sum w, `correct` = sum w * [argmax hit]."""
  targets, w = shifted_targets(tokens_BxS, segment_ids_BxS, loss_weights_BxS)
  logits = logits_BxSxV[:, :-1]
  logp, lse = token_logprobs(logits, targets)
  hit = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  out = {"nll": -jnp.sum(w * logp), "weight": jnp.sum(w), "correct": jnp.sum(w * hit),
         "tokens": jnp.sum((w > 0).astype(jnp.float32))}
  out["z"] = jnp.sum(w * lse * lse) if z_loss_coef else jnp.zeros((), jnp.float32)
  return out


def cross_entropy_loss(logits_BxSxV, tokens_BxS, segment_ids_BxS, loss_weights_BxS,
                       z_loss_coef: float = 0.0) -> tuple[jax.Array, Metrics]:
  """Mean weighted next-token cross-entropy over kept tokens (+ z_loss_coef * mean logZ^2)."""
  s = cross_entropy_sums(logits_BxSxV, tokens_BxS, segment_ids_BxS, loss_weights_BxS, z_loss_coef)
  denom = jnp.maximum(s["weight"], 1e-8)
  xent = s["nll"] / denom
  loss = xent + z_loss_coef * s["z"] / denom
  return loss, {"xent": xent, "weight": s["weight"], "accuracy": s["correct"] / denom}


# ----------------------------------------------------------------------- chunked cross-entropy
# The loss is read from the final hidden states in slices of about `chunk` tokens (the same few
# positions of every row): each slice's [tokens, V] logits are made, reduced and dropped. Under
# `jax.grad`, each slice also yields its share of both gradients at once (dlogits = w * ((1 + 2 z lse) * p - onehot(target)), then
# dh = dlogits @ head^T and dhead += h^T @ dlogits), so the step runs the three products of the
# plain loss and never a fourth to recompute logits; the backward pass only scales the stored
# gradients by the loss's cotangent. Slicing by tokens instead of vocabulary columns is what
# makes that possible: a token's logsumexp is complete within its slice.


def _xent_rows(h_BxTxD, head_DxV, targets_BxT, weights_BxT, z_coef: float, chunk: int,
               grads: bool, head_grad_f32: bool = False):
  """(loss, nll, z, hit) sums, and with `grads` the gradients of `loss` w.r.t. h and the head
  (accumulated in fp32, returned in their dtypes, or the head's in fp32 with `head_grad_f32`).
  A slice is `chunk // B` positions of every row (at least one, at most the row)."""
  b, t, d = h_BxTxD.shape
  p = min(max(1, chunk // b), t)

  def slices(x):  # [B, T, ...] -> [n, B * p, ...], slice i holding positions [i * p, (i + 1) * p)
    x = _position_slices(x, p)
    return x.reshape((x.shape[0], b * p) + x.shape[3:])

  hc, tc, wc = slices(h_BxTxD), slices(targets_BxT), slices(weights_BxT.astype(jnp.float32))
  head = head_DxV.astype(h_BxTxD.dtype)

  def body(dhead, xs):
    h, tgt, w = xs
    logits = jnp.dot(h, head, preferred_element_type=jnp.float32)
    m = jnp.max(logits, axis=1)
    lse = m + jnp.log(jnp.sum(jnp.exp(logits - m[:, None]), axis=1))
    picked = jnp.take_along_axis(logits, tgt[:, None], axis=1)[:, 0]
    # the target holds the largest logit (a tie counts as a hit): argmax's index-carrying reduce
    # cost about 40 ms per [512, 32000] slice on CPU, this comparison nothing
    hit = (picked >= m).astype(jnp.float32)
    sums = (jnp.sum(w * (lse - picked)), jnp.sum(w * lse * lse), jnp.sum(w * hit))
    if not grads:
      return dhead, (sums, None)
    dlogits = ((w * (1.0 + 2.0 * z_coef * lse))[:, None] * jnp.exp(logits - lse[:, None])
               ).at[jnp.arange(b * p), tgt].add(-w)
    dh = jnp.dot(dlogits.astype(h.dtype), head.T, preferred_element_type=jnp.float32)
    dhead = dhead + jnp.dot(h.T, dlogits.astype(h.dtype), preferred_element_type=jnp.float32)
    return dhead, (sums, dh)

  init = jnp.zeros(head_DxV.shape, jnp.float32) if grads else None
  dhead, ((nll, z, hit), dh) = jax.lax.scan(body, init, (hc, tc, wc))
  nll, z, hit = jnp.sum(nll), jnp.sum(z), jnp.sum(hit)
  out = (nll + z_coef * z, nll, z, hit)
  if not grads:
    return out, None
  dh = _unslice(dh.reshape(-1, b, p, d), t)
  return out, (dh.astype(h_BxTxD.dtype), dhead if head_grad_f32 else dhead.astype(head_DxV.dtype))


def _on_mesh(h_BxTxD, head_DxV, targets_BxT, weights_BxT, z_coef: float, chunk: int,
             grads: bool):
  """`_xent_rows` on every device's own rows under a mesh of several devices. The head comes in
  split as the parameters are (embed over fsdp, vocab over tensor) and is gathered whole inside,
  once a call; the sums are added over the devices; the head's gradient, summed over the rows'
  devices, leaves split as the head came in (a reduce-scatter over fsdp when the rows are split
  over fsdp too), and each device keeps its rows' hidden-state gradient. Made in the forward pass
  only, so nothing here is differentiated: one all-gather and one reduce-scatter of the head a
  call, where XLA left to itself all-reduced logits or fp32 head gradients inside the loop."""
  mesh = jax.sharding.get_abstract_mesh()
  shape = dict(mesh.shape)
  d, v = head_DxV.shape
  rows = shd.batch_axes(h_BxTxD.shape[0], mesh)
  fs = "fsdp" if shape.get("fsdp", 1) > 1 and d % shape["fsdp"] == 0 else None
  tp = "tensor" if shape.get("tensor", 1) > 1 and v % shape["tensor"] == 0 else None
  rspec = P(rows or None)
  hspec = P(fs, tp)

  def body(h, head, tgt, w):
    if fs:
      head = jax.lax.all_gather(head, fs, axis=0, tiled=True)
    if tp:
      head = jax.lax.all_gather(head, tp, axis=1, tiled=True)
    out, g = _xent_rows(h, head, tgt, w, z_coef, chunk, grads, head_grad_f32=True)
    if rows:
      out = tuple(jax.lax.psum(x, rows) for x in out)
    if not grads:
      return out, None
    dh, dhead = g
    for ax, dim in ((fs, 0), (tp, 1)):    # back to the head's own split
      if ax is None:
        continue
      if ax in rows:
        dhead = jax.lax.psum_scatter(dhead, ax, scatter_dimension=dim, tiled=True)
      else:                                # every device of `ax` saw the same rows
        n = dhead.shape[dim] // shape[ax]
        dhead = jax.lax.dynamic_slice_in_dim(dhead, jax.lax.axis_index(ax) * n, n, axis=dim)
    rest = tuple(a for a in rows if a not in (fs, tp))
    if rest:
      dhead = jax.lax.psum(dhead, rest)
    return out, (dh, dhead.astype(head_DxV.dtype))

  sums = (P(),) * 4
  out_specs = (sums, (rspec, hspec) if grads else None)
  return jax.shard_map(body, mesh=mesh, in_specs=(rspec, hspec, rspec, rspec),
                       out_specs=out_specs, check_vma=False)(h_BxTxD, head_DxV, targets_BxT,
                                                             weights_BxT)


def _xent(h_BxTxD, head_DxV, targets_BxT, weights_BxT, z_coef: float, chunk: int, grads: bool):
  """`_xent_rows`, on each device's own rows under a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  on = _on_mesh if not mesh.empty and mesh.size > 1 else _xent_rows
  return on(h_BxTxD, head_DxV, targets_BxT, weights_BxT, z_coef, chunk, grads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _chunked_xent(h_BxTxD, head_DxV, targets_BxT, weights_BxT, z_coef: float, chunk: int):
  return _xent(h_BxTxD, head_DxV, targets_BxT, weights_BxT, z_coef, chunk, grads=False)[0]


def _chunked_xent_fwd(h_BxTxD, head_DxV, targets_BxT, weights_BxT, z_coef, chunk):
  return _xent(h_BxTxD, head_DxV, targets_BxT, weights_BxT, z_coef, chunk, grads=True)


def _chunked_xent_bwd(z_coef, chunk, res, g):
  """Only the first output (the loss) carries a gradient: the stored ones, scaled."""
  del z_coef, chunk
  dh, dhead = res
  return (g[0] * dh).astype(dh.dtype), (g[0] * dhead).astype(dhead.dtype), None, None


_chunked_xent.defvjp(_chunked_xent_fwd, _chunked_xent_bwd)


def chunked_cross_entropy_sums(hidden_BxSxD, head_DxV, tokens_BxS, segment_ids_BxS,
                               loss_weights_BxS, z_loss_coef: float = 0.0,
                               chunk: int = 512) -> Metrics:
  """`cross_entropy_sums` from the final hidden states and the output head, without ever holding
  the [B*S, V] logits: about `chunk` tokens at a time on each device (chunk // B positions of
  every row it holds), gradients made in the same pass (see above). Also returns `loss` = nll +
  z_loss_coef * z, the one entry that carries gradients (to hidden_BxSxD and head_DxV)."""
  if chunk <= 0:
    raise ValueError(f"chunked_cross_entropy_sums: chunk={chunk} must be positive")
  targets, w = shifted_targets(tokens_BxS, segment_ids_BxS, loss_weights_BxS)
  loss, nll, z, hit = _chunked_xent(hidden_BxSxD[:, :-1], head_DxV, targets, w,
                                    float(z_loss_coef), int(chunk))
  sg = jax.lax.stop_gradient
  return {"loss": loss, "nll": sg(nll), "weight": jnp.sum(w), "correct": sg(hit),
          "tokens": jnp.sum((w > 0).astype(jnp.float32)),
          "z": sg(z) if z_loss_coef else jnp.zeros((), jnp.float32)}


# ----------------------------------------------------------------------- advantages
def group_advantages(rewards_N: jax.Array, group_size: int, eps: float = 1e-6) -> jax.Array:
  """A_i = (r_i - mean_group r) / (std_group r + eps), unbiased std (ddof=1); groups are consecutive
  runs of `group_size` rewards."""
  n = rewards_N.shape[0]
  if group_size < 2 or n % group_size:
    raise ValueError(f"group_advantages: group_size={group_size} must be >= 2 and divide the "
                     f"number of rewards ({n})")
  r = rewards_N.astype(jnp.float32).reshape(n // group_size, group_size)
  mean = r.mean(axis=1, keepdims=True)
  std = jnp.std(r, axis=1, keepdims=True, ddof=1)
  return ((r - mean) / (std + eps)).reshape(n)


def _per_token(adv, like_BxT):
  adv = adv.astype(jnp.float32)
  return jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, like_BxT.shape)


def _masked_seq_mean(x_BxT, mask_BxT):
  """Mean over each sequence's masked tokens, [B] (0 for an empty sequence)."""
  n = jnp.sum(mask_BxT, axis=1)
  return jnp.sum(x_BxT * mask_BxT, axis=1) / jnp.maximum(n, 1.0)


def _valid_seqs(mask_BxT):
  return (jnp.sum(mask_BxT, axis=1) > 0).astype(jnp.float32)


def _mean_over(x_B, valid_B):
  return jnp.sum(x_B * valid_B) / jnp.maximum(jnp.sum(valid_B), 1.0)


def kl_k3(logp_BxT, ref_logp_BxT):
  """Schulman's k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0."""
  d = ref_logp_BxT - logp_BxT
  return jnp.exp(d) - d - 1.0


def _add_kl(loss, metrics, logp, ref_logp, mask, valid, kl_coef):
  if ref_logp is None or not kl_coef:
    return loss, metrics
  kl_B = _masked_seq_mean(kl_k3(logp, ref_logp), mask)
  kl = _mean_over(kl_B, valid)
  metrics["kl"] = kl
  return loss + kl_coef * kl, metrics


# ----------------------------------------------------------------------- policy losses
def gspo_loss(logp_BxT, old_logp_BxT, advantages, mask_BxT, eps_low: float = 3e-4,
              eps_high: float = 4e-4, log_ratio_cap: float | None = 10.0,
              ref_logp_BxT=None, kl_coef: float = 0.0) -> tuple[jax.Array, Metrics]:
  """GSPO: s_i = exp(mean_t (logp - logp_old)); loss = -mean_i min(s_i A_i, clip(s_i) A_i).

  `advantages` is [B]. `log_ratio_cap` caps the sequence log-ratio from above before exp (verl uses
  10); None disables it."""
  mask = mask_BxT.astype(jnp.float32)
  valid = _valid_seqs(mask)
  log_s_B = _masked_seq_mean(logp_BxT - old_logp_BxT, mask)
  if log_ratio_cap is not None:
    log_s_B = jnp.minimum(log_s_B, log_ratio_cap)
  s_B = jnp.exp(log_s_B)
  adv_B = advantages.astype(jnp.float32)
  unclipped = s_B * adv_B
  clipped = jnp.clip(s_B, 1.0 - eps_low, 1.0 + eps_high) * adv_B
  obj_B = jnp.minimum(unclipped, clipped)
  loss = -_mean_over(obj_B, valid)
  metrics = _ratio_metrics(s_B, (clipped < unclipped).astype(jnp.float32), valid)
  return _add_kl(loss, metrics, logp_BxT, ref_logp_BxT, mask, valid, kl_coef)


def gspo_token_loss(logp_BxT, old_logp_BxT, advantages, mask_BxT, eps_low: float = 3e-4,
                    eps_high: float = 4e-4, log_ratio_cap: float | None = 10.0,
                    ref_logp_BxT=None, kl_coef: float = 0.0) -> tuple[jax.Array, Metrics]:
  """GSPO-token: s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)], per-token clipped objective, averaged
  over each sequence's tokens and then over sequences. Equals GSPO (value and gradient) when every
  token of a sequence has the same advantage."""
  mask = mask_BxT.astype(jnp.float32)
  valid = _valid_seqs(mask)
  log_s_B = jax.lax.stop_gradient(_masked_seq_mean(logp_BxT - old_logp_BxT, mask))
  log_s_BxT = logp_BxT - jax.lax.stop_gradient(logp_BxT) + log_s_B[:, None]
  if log_ratio_cap is not None:
    log_s_BxT = jnp.minimum(log_s_BxT, log_ratio_cap)
  s_BxT = jnp.exp(log_s_BxT)
  adv = _per_token(advantages, mask)
  unclipped = s_BxT * adv
  clipped = jnp.clip(s_BxT, 1.0 - eps_low, 1.0 + eps_high) * adv
  obj_B = _masked_seq_mean(jnp.minimum(unclipped, clipped), mask)
  loss = -_mean_over(obj_B, valid)
  clip_B = _masked_seq_mean((clipped < unclipped).astype(jnp.float32), mask)
  metrics = _ratio_metrics(jnp.exp(log_s_B), clip_B, valid)
  return _add_kl(loss, metrics, logp_BxT, ref_logp_BxT, mask, valid, kl_coef)


def grpo_loss(logp_BxT, old_logp_BxT, advantages, mask_BxT, eps_low: float = 0.2,
              eps_high: float = 0.27, ref_logp_BxT=None, kl_coef: float = 0.0,
              aggregation: str = "seq_mean_token_mean") -> tuple[jax.Array, Metrics]:
  """GRPO/PPO-clip with token-level ratios r_it = exp(logp - logp_old).

  aggregation: `seq_mean_token_mean` (GRPO paper: mean over each sequence's tokens, then over
  sequences) or `token_mean` (DAPO: mean over all response tokens of the batch)."""
  mask = mask_BxT.astype(jnp.float32)
  valid = _valid_seqs(mask)
  r_BxT = jnp.exp(logp_BxT - old_logp_BxT)
  adv = _per_token(advantages, mask)
  unclipped = r_BxT * adv
  clipped = jnp.clip(r_BxT, 1.0 - eps_low, 1.0 + eps_high) * adv
  obj_BxT = jnp.minimum(unclipped, clipped)
  is_clip = (clipped < unclipped).astype(jnp.float32)
  if aggregation == "seq_mean_token_mean":
    loss = -_mean_over(_masked_seq_mean(obj_BxT, mask), valid)
  elif aggregation == "token_mean":
    loss = -jnp.sum(obj_BxT * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  else:
    raise ValueError(f"grpo_loss: aggregation '{aggregation}' is not seq_mean_token_mean or "
                     "token_mean")
  metrics = _ratio_metrics(jnp.exp(_masked_seq_mean(jnp.log(r_BxT), mask)),
                           _masked_seq_mean(is_clip, mask), valid)
  return _add_kl(loss, metrics, logp_BxT, ref_logp_BxT, mask, valid, kl_coef)


def _ratio_metrics(s_B, clip_B, valid_B) -> Metrics:
  big = jnp.finfo(jnp.float32).max
  return {"clip_frac": _mean_over(clip_B, valid_B),
          "ratio_mean": _mean_over(s_B, valid_B),
          "ratio_min": jnp.min(jnp.where(valid_B > 0, s_B, big)),
          "ratio_max": jnp.max(jnp.where(valid_B > 0, s_B, -big))}


POLICY_LOSSES = {"gspo": gspo_loss, "gspo_token": gspo_token_loss, "grpo": grpo_loss}

# Each algorithm's own clip band (eps_low, eps_high): GSPO's paper uses 3e-4 / 4e-4 on its
# sequence ratio; GRPO's token ratios use 0.2 / 0.27 (a band of 3e-4 would clip nearly every
# token at ratios of 1.01).
CLIP_BANDS = {"gspo": (3e-4, 4e-4), "gspo_token": (3e-4, 4e-4), "grpo": (0.2, 0.27)}


def clip_band(algo: str, eps_low: float = -1.0, eps_high: float = -1.0) -> tuple[float, float]:
  """The clip band of `algo`: each bound set (> 0) is kept, a negative one (the configs' -1) takes
  the algorithm's own from CLIP_BANDS."""
  if algo not in CLIP_BANDS:
    raise ValueError(f"rl.algo: '{algo}' is not one of {sorted(CLIP_BANDS)}")
  lo, hi = CLIP_BANDS[algo]
  return (float(eps_low) if eps_low is not None and eps_low >= 0 else lo,
          float(eps_high) if eps_high is not None and eps_high >= 0 else hi)


def policy_loss(algo: str, logp_BxT, old_logp_BxT, advantages, mask_BxT, **kw: Any):
  """Dispatches to one of POLICY_LOSSES by name."""
  if algo not in POLICY_LOSSES:
    raise ValueError(f"rl.algo: '{algo}' is not one of {sorted(POLICY_LOSSES)}")
  return POLICY_LOSSES[algo](logp_BxT, old_logp_BxT, advantages, mask_BxT, **kw)


def masked_entropy(logits_BxTxV, mask_BxT) -> jax.Array:
  """Mean token entropy of the policy over masked positions."""
  logits = logits_BxTxV.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  ent_BxT = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
  m = mask_BxT.astype(jnp.float32)
  return jnp.sum(ent_BxT * m) / jnp.maximum(jnp.sum(m), 1.0)
