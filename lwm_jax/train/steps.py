"""Train steps as pure functions `step(state, batch) -> (state, metrics)`, jit-compiled once with
explicit shardings and a donated state.

`cpt_step` and `sft_step` are the same masked next-token step (they differ only in their data);
`gspo_step` takes RL batches. Both accumulate gradients over `micro_batches` slices of the batch with
`lax.scan`; the loss is normalised over the WHOLE batch (kept-token weight for cross-entropy, number
of non-empty sequences for the policy losses), so accumulation does not change the result.

Batches are dicts of [B, S] arrays. Next-token batches: `tokens`, `positions`, `segment_ids` (0 =
padding), `loss_weights` (weight of each token as a prediction target). RL batches: `tokens`,
`positions`, `segment_ids`, `response_mask` (1 on response tokens), `old_logprobs` (log-prob of token i
under the sampling policy, aligned with `tokens`; position 0 unused), `advantages` [B] and, with a KL
term, `ref_logprobs` (aligned like `old_logprobs`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lwm_jax import sharding as shd
from lwm_jax.train import losses
from lwm_jax.train.state import TrainState

XENT_KEYS = ("tokens", "positions", "segment_ids", "loss_weights")
RL_KEYS = ("tokens", "positions", "segment_ids", "response_mask", "old_logprobs", "advantages")


@dataclasses.dataclass(frozen=True)
class StepConfig:
  micro_batches: int = 1
  aux_loss_coef: float = 0.001
  router_z_loss_coef: float = 0.0
  z_loss_coef: float = 0.0
  # > 0: cross-entropy taken about this many tokens at a time with its gradients in the same
  # pass, never building the [B*S, V] logits (same loss, metrics and gradients as 0, the plain
  # path); the configs' `train.xent_chunk` sets it (default 512)
  xent_chunk: int = 0
  # RL
  algo: str = "gspo"
  eps_low: float = 3e-4
  eps_high: float = 4e-4
  log_ratio_cap: float | None = 10.0
  kl_coef: float = 0.0


def batch_shardings(batch_shapes: dict[str, tuple[int, ...]], mesh: Mesh) -> dict[str, NamedSharding]:
  return {k: NamedSharding(mesh, shd.batch_spec(s[0], mesh, len(s))) for k, s in batch_shapes.items()}


def _split_micro(batch: dict, n: int) -> dict:
  """[B, ...] -> [n, B/n, ...]; micro-batch m takes rows m, m+n, m+2n, ... so that every device's rows
  spread over all micro-batches."""
  def one(x):
    b = x.shape[0]
    y = jnp.swapaxes(x.reshape(b // n, n, *x.shape[1:]), 0, 1)
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
      spec = shd.batch_spec(b // n, mesh, x.ndim)
      y = jax.lax.with_sharding_constraint(y, P(None, *spec))
    return y
  return jax.tree.map(one, batch)


def _apply(tx, schedule, state: TrainState, grads, metrics: dict, active=None
           ) -> tuple[TrainState, dict]:
  """The optimizer update. With `active` (a boolean scalar) false, the parameters and the
  optimizer's moments stay as they were (its integer counters still advance, so the schedule
  keeps following the step count): Adam would otherwise turn any leftover gradient, however
  small, into a step of the full learning rate."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  if active is not None:
    def keep(new, old):
      if jnp.issubdtype(new.dtype, jnp.integer):
        return new
      return jnp.where(active, new, old)
    params = jax.tree.map(keep, params, state.params)
    opt_state = jax.tree.map(keep, opt_state, state.opt_state)
    metrics = dict(metrics, skipped=1.0 - active.astype(jnp.float32))
  metrics = dict(metrics, grad_norm=optax.tree.norm(grads), lr=schedule(state.step))
  rng, _ = jax.random.split(state.rng)
  return TrainState(params, opt_state, state.step + 1, rng), metrics


def _accumulate(loss_fn, params, micro: dict, n: int):
  """Sums grads and auxiliary sums of `loss_fn(params, mb) -> (loss, sums)` over micro-batches."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if n == 1:
    (_, sums), grads = grad_fn(params, jax.tree.map(lambda x: x[0], micro))
    return grads, sums

  def body(carry, mb):
    g_acc, s_acc = carry
    (_, sums), g = grad_fn(params, mb)
    return (jax.tree.map(jnp.add, g_acc, g), _merge_sums(s_acc, sums)), None

  first = jax.tree.map(lambda x: x[0], micro)
  (_, s0), g0 = grad_fn(params, first)
  rest = jax.tree.map(lambda x: x[1:], micro)
  (grads, sums), _ = jax.lax.scan(body, (g0, s0), rest)
  return grads, sums


def _merge_sums(a: dict, b: dict) -> dict:
  out = {}
  for k in a:
    if k.endswith("_min"):
      out[k] = jnp.minimum(a[k], b[k])
    elif k.endswith("_max"):
      out[k] = jnp.maximum(a[k], b[k])
    else:
      out[k] = a[k] + b[k]
  return out


# ----------------------------------------------------------------------- next-token (CPT / SFT)
def xent_step(graphdef, tx, schedule, cfg: StepConfig, state: TrainState, batch: dict):
  """One optimizer step of weighted next-token cross-entropy (+ MoE aux / router z losses)."""
  n = cfg.micro_batches
  _, w_all = losses.shifted_targets(batch["tokens"], batch["segment_ids"], batch["loss_weights"])
  total_w = jnp.maximum(jnp.sum(w_all), 1e-8)

  def loss_fn(params, mb):
    model = nnx.merge(graphdef, params)
    if cfg.xent_chunk > 0:
      out = model(mb["tokens"], mb["positions"], mb["segment_ids"], return_hidden=True)
      s = losses.chunked_cross_entropy_sums(out.logits, model.head_DxV(), mb["tokens"],
                                            mb["segment_ids"], mb["loss_weights"],
                                            cfg.z_loss_coef, chunk=cfg.xent_chunk)
      loss = s.pop("loss") / total_w
    else:
      out = model(mb["tokens"], mb["positions"], mb["segment_ids"])
      s = losses.cross_entropy_sums(out.logits, mb["tokens"], mb["segment_ids"], mb["loss_weights"],
                                    cfg.z_loss_coef)
      loss = (s["nll"] + cfg.z_loss_coef * s["z"]) / total_w
    loss = loss + (cfg.aux_loss_coef * out.aux_loss + cfg.router_z_loss_coef * out.router_z_loss) / n
    sums = dict(s, aux_loss=out.aux_loss / n, router_z_loss=out.router_z_loss / n,
                expert_load=out.expert_load / n, dropped_tokens=out.dropped_tokens)
    return loss, sums

  grads, sums = _accumulate(loss_fn, state.params, _split_micro(batch, n), n)
  metrics = {"loss": sums["nll"] / total_w, "accuracy": sums["correct"] / total_w,
             "kept_tokens": sums["tokens"], "loss_weight": sums["weight"],
             "aux_loss": sums["aux_loss"], "router_z_loss": sums["router_z_loss"],
             "expert_load": sums["expert_load"], "dropped_tokens": sums["dropped_tokens"]}
  if cfg.z_loss_coef:
    metrics["z_loss"] = sums["z"] / total_w
  return _apply(tx, schedule, state, grads, metrics)


cpt_step = xent_step
sft_step = xent_step


def eval_sums(graphdef, state: TrainState, batch: dict) -> dict:
  """Summed weighted NLL / hits / weight of a batch (forward only), for validation."""
  out = nnx.merge(graphdef, state.params)(batch["tokens"], batch["positions"], batch["segment_ids"])
  return losses.cross_entropy_sums(out.logits, batch["tokens"], batch["segment_ids"],
                                   batch["loss_weights"])


# ----------------------------------------------------------------------- RL (GSPO / GRPO)
def _response_logp(graphdef, params, batch):
  out = nnx.merge(graphdef, params)(batch["tokens"], batch["positions"], batch["segment_ids"])
  logits = out.logits[:, :-1]
  logp, _ = losses.token_logprobs(logits, batch["tokens"][:, 1:])
  return logp, logits, out


LOGPROB_SLICE = 256   # positions of every row whose logits `sequence_logprobs` holds at a time


def sequence_logprobs(graphdef, params, batch: dict) -> jax.Array:
  """log p(token i | tokens < i) aligned with tokens, [B, S] (column 0 is 0): what the RL loop
  stores as `old_logprobs` / `ref_logprobs`. Read from the final hidden states LOGPROB_SLICE
  positions at a time, so the [B, S, V] logits never exist: at the hybrid preset's RL shape they
  were 92 GiB of a v5p chip's 95 (benchmarks/results/pods.md)."""
  model = nnx.merge(graphdef, params)
  hidden = model(batch["tokens"], batch["positions"], batch["segment_ids"],
                 return_hidden=True).logits[:, :-1]
  logp = losses.sliced_token_logprobs(hidden, model.head_DxV(), batch["tokens"][:, 1:],
                                      LOGPROB_SLICE)
  return jnp.pad(logp, ((0, 0), (1, 0)))


def gspo_step(graphdef, tx, schedule, cfg: StepConfig, state: TrainState, batch: dict):
  """One optimizer step of the configured policy loss (gspo | gspo_token | grpo)."""
  n = cfg.micro_batches
  mask_all = batch["response_mask"][:, 1:].astype(jnp.float32)
  n_valid = jnp.maximum(jnp.sum((jnp.sum(mask_all, axis=1) > 0).astype(jnp.float32)), 1.0)
  kw: dict[str, Any] = {"eps_low": cfg.eps_low, "eps_high": cfg.eps_high, "kl_coef": cfg.kl_coef}
  if cfg.algo != "grpo":
    kw["log_ratio_cap"] = cfg.log_ratio_cap

  def loss_fn(params, mb):
    logp, logits, out = _response_logp(graphdef, params, mb)
    mask = mb["response_mask"][:, 1:].astype(jnp.float32)
    ref = mb["ref_logprobs"][:, 1:] if "ref_logprobs" in mb else None
    adv = mb["advantages"]
    if adv.ndim == 2:  # per token ([B, S], aligned with tokens: agent RL's per-turn credit)
      adv = adv[:, 1:]
    pl, m = losses.policy_loss(cfg.algo, logp, mb["old_logprobs"][:, 1:], adv, mask,
                               ref_logp_BxT=ref, **kw)
    share = jnp.sum((jnp.sum(mask, axis=1) > 0).astype(jnp.float32)) / n_valid
    loss = pl * share + cfg.aux_loss_coef * out.aux_loss / n
    ent = losses.masked_entropy(jax.lax.stop_gradient(logits), mask)
    sums = {"pg_loss": pl * share, "clip_frac": m["clip_frac"] * share,
            "ratio_mean": m["ratio_mean"] * share, "ratio_min": m["ratio_min"],
            "ratio_max": m["ratio_max"], "entropy": ent * jnp.sum(mask),
            "response_tokens": jnp.sum(mask), "aux_loss": out.aux_loss / n,
            "expert_load": out.expert_load / n}
    if "kl" in m:
      sums["kl"] = m["kl"] * share
    return loss, sums

  grads, sums = _accumulate(loss_fn, state.params, _split_micro(batch, n), n)
  metrics = dict(sums, loss=sums["pg_loss"],
                 entropy=sums["entropy"] / jnp.maximum(sums["response_tokens"], 1.0))
  # A batch whose rows were all filtered (every group had equal rewards) carries no policy
  # signal; only the MoE balance loss would move the weights. Such a step changes nothing.
  return _apply(tx, schedule, state, grads, metrics, active=jnp.sum(mask_all) > 0)


# ----------------------------------------------------------------------- compilation
class CompiledStep:
  """A jit-compiled step with explicit shardings, called under the mesh (so the model's MoE sees it).
  `batch_keys` fixes the batch dict's entries; the batch may be numpy (placed here) or jax arrays."""

  def __init__(self, fn: Callable, mesh: Mesh, state_shardings: TrainState,
               batch_shapes: dict[str, tuple[int, ...]], donate: bool = True,
               out_state: bool = True):
    self.mesh = mesh
    self.batch_shardings = batch_shardings(batch_shapes, mesh)
    rep = NamedSharding(mesh, P())
    out = (state_shardings, rep) if out_state else rep
    self._fn = jax.jit(fn, in_shardings=(state_shardings, self.batch_shardings),
                       out_shardings=out, donate_argnums=(0,) if donate else ())

  def place(self, batch: dict) -> dict:
    """Global arrays from this process's rows (the whole batch on one process)."""
    out = {}
    for k, s in self.batch_shardings.items():
      x = batch[k]
      if isinstance(x, jax.Array):
        out[k] = x
      elif isinstance(x, jax.ShapeDtypeStruct):  # ahead-of-time lowering (lwm_jax.compile)
        out[k] = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
      else:
        out[k] = jax.make_array_from_process_local_data(s, np.asarray(x))
    return out

  def __call__(self, state, batch):
    with jax.set_mesh(self.mesh):
      return self._fn(state, self.place(batch))

  def lower(self, state, batch):
    with jax.set_mesh(self.mesh):
      return self._fn.lower(state, self.place(batch))


def compile_xent_step(graphdef, tx, schedule, cfg: StepConfig, mesh: Mesh, state_shardings,
                      batch_shapes: dict) -> CompiledStep:
  fn = functools.partial(xent_step, graphdef, tx, schedule, cfg)
  return CompiledStep(fn, mesh, state_shardings, batch_shapes)


def compile_gspo_step(graphdef, tx, schedule, cfg: StepConfig, mesh: Mesh, state_shardings,
                      batch_shapes: dict) -> CompiledStep:
  fn = functools.partial(gspo_step, graphdef, tx, schedule, cfg)
  return CompiledStep(fn, mesh, state_shardings, batch_shapes)


def compile_eval(graphdef, mesh: Mesh, state_shardings, batch_shapes: dict) -> CompiledStep:
  fn = functools.partial(eval_sums, graphdef)
  return CompiledStep(fn, mesh, state_shardings, batch_shapes, donate=False, out_state=False)


def compile_logprobs(graphdef, mesh: Mesh, state_shardings, batch_shapes: dict) -> CompiledStep:
  def fn(state, batch):
    return sequence_logprobs(graphdef, state.params, batch)
  step = CompiledStep(fn, mesh, state_shardings, batch_shapes, donate=False, out_state=False)
  # log-probs stay split like the batch
  step._fn = jax.jit(fn, in_shardings=(state_shardings, step.batch_shardings),
                     out_shardings=step.batch_shardings["tokens"])
  return step
