"""Mixture-of-experts layer: fp32 softmax router, top-k, and its dispatch backends.

Backends (all compute `sum_k w_k * expert_{i_k}(x)` for every token):
  ragged_dot  dropless: sort assignments by expert, `jax.lax.ragged_dot` grouped matmul (GPU).
  gmm         the same with the Pallas grouped matmul of TPU (megablox); XLA's ragged_dot on TPU
              computes every local expert on every row (docs/pods.md).
  blocked     dropless: sort by expert, pad each expert's rows to whole blocks, one batched einsum
              over blocks with each block's expert weights gathered (fast on CPU, where ragged_dot is
              ~20x slower than a batched einsum). Rows move by gathers only, forward and backward
              (`lwm_jax.model.dispatch`).
  tiled       dropless: sort by expert, then one loop over tiles of sorted rows, each tile
              multiplied by its expert's weights (`dispatch.tiled_matmuls`, backward written out):
              no padded rows, no per-block weight copies.
  capacity    sort into a fixed [E, C, D] buffer, C = ceil(capacity_factor * N * k / E); assignments
              past an expert's capacity are dropped and counted.
  sorted      the same [E, C, D] buffer filled and read back by gathers only, forward and backward
              (`lwm_jax.model.dispatch`); the fastest on CPU. Capacity from `sorted_capacity_factor`,
              drops counted.
  dense       every expert on every token, weighted by the (mostly zero) routing matrix; the
              simple reference.
  rows        the dense computation for decoding: all experts' gate/up weights as one [E*2I, D]
              matrix and down weights as one [D, E*I] matrix, laid out once by
              `lwm_jax.model.decode_layout` (a few rows per step touch nearly every expert anyway,
              and one large matmul in the weight-streaming form beats E small ones); a step with
              at most E/2 assignments (batch 1 or 2) runs only its chosen experts instead.
`auto` picks gmm on TPU, ragged_dot on GPU and tiled on CPU (benchmarks/results/speed.md), by the platform
being compiled for (`lwm_jax.model.platform`), not the host's.

Under a device mesh the layer runs inside `shard_map`: tokens stay on their devices, expert weights
are split over the `expert` mesh axis (and their hidden dim over `tensor`). When the batch is split
over `expert` too, assignments travel to the devices that own their experts by `all_to_all` and come
back the same way; when it is not (e.g. decoding one sequence), each device runs its own experts on
all its tokens and the partial outputs are summed over `expert`.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from lwm_jax import sharding as shd
from lwm_jax.model.config import ModelConfig
from lwm_jax.model.dispatch import blocked_ffn, capacity_for, sorted_ffn, tiled_ffn
from lwm_jax.model import platform
from lwm_jax.model.layers import DTYPES, param, rows_matmul

# The dropless CPU layouts of `lwm_jax.model.dispatch`, by backend name: (x, expert [N, K],
# valid [N, K], wg, wu, wd) -> [N, K, D].
DROPLESS_FFN = {"blocked": blocked_ffn, "tiled": tiled_ffn}


@dataclasses.dataclass(frozen=True)
class RouterStats:
  """Sums for the load-balancing and z losses, combined over layers by the transformer."""
  counts_E: jax.Array      # top-k assignments per expert
  prob_sum_E: jax.Array    # summed router probabilities per expert
  rows: jax.Array          # tokens counted
  z_sum: jax.Array         # summed logsumexp(logits)**2
  dropped: jax.Array       # assignments dropped (capacity backends)


def _expert_ffn_blocks(x_BxRxD, wg_BxDxI, wu_BxDxI, wd_BxIxD):
  h = jax.nn.silu(jnp.einsum("brd,bdi->bri", x_BxRxD, wg_BxDxI)) * jnp.einsum(
      "brd,bdi->bri", x_BxRxD, wu_BxDxI)
  return jnp.einsum("bri,bid->brd", h, wd_BxIxD)


def grouped_ffn(x_NxD, expert_N, valid_N, wg_ExDxI, wu_ExDxI, wd_ExIxD, backend: str):
  """Applies expert `expert_N[n]` to row n (rows with valid_N False give 0); dropless. `blocked`
  and `tiled` go through `DROPLESS_FFN`; `ragged_dot` is XLA's grouped matmul (GPU/TPU)."""
  if backend in DROPLESS_FFN:
    return DROPLESS_FFN[backend](x_NxD, expert_N[:, None], valid_N[:, None], wg_ExDxI, wu_ExDxI,
                                 wd_ExIxD)[:, 0]
  if backend not in ("ragged_dot", "gmm"):
    raise ValueError(f"grouped_ffn: unknown backend '{backend}'")
  e = wg_ExDxI.shape[0]
  key = jnp.where(valid_N, expert_N, e)  # invalid rows sort last
  order = jnp.argsort(key, stable=True)
  xs = x_NxD[order]
  ks = key[order]
  group_sizes = jnp.bincount(key, length=e + 1)[:e].astype(jnp.int32)
  d, f = wg_ExDxI.shape[1:]
  # the kernel's tiles need both dims of the weights in multiples of 128
  mm = gmm_matmul if backend == "gmm" and d % 128 == 0 and f % 128 == 0 else jax.lax.ragged_dot
  h = jax.nn.silu(mm(xs, wg_ExDxI, group_sizes)) * mm(xs, wu_ExDxI, group_sizes)
  ys = mm(h, wd_ExIxD, group_sizes)
  ys = jnp.where((ks < e)[:, None], ys, 0)
  return jnp.zeros_like(ys).at[order].set(ys)


def gmm_matmul(x_AxD, w_ExDxF, group_sizes_E):
  """`jax.lax.ragged_dot` through the Pallas grouped matmul of TPU (megablox `gmm`, with its
  written backward pass: `tgmm` for the weights). XLA's own ragged_dot on TPU (jax 0.10) becomes
  a masked product over every local expert, forward and backward: E_local times the FLOPs
  (docs/pods.md). Rows are padded to the kernel's tile; on another platform the kernel runs in
  interpret mode (tests)."""
  from jax.experimental.pallas.ops.tpu.megablox import ops as megablox  # pylint: disable=import-outside-toplevel
  a, d = x_AxD.shape
  f = w_ExDxF.shape[2]
  tm = 128 if a >= 128 else -(-a // 8) * 8
  pad = -a % tm
  xp = jnp.pad(x_AxD, ((0, pad), (0, 0))) if pad else x_AxD
  tile = next(t for t in (512, 256, 128) if d % t == 0 and f % t == 0)
  tiling = (tm, tile, tile)
  # rows past the last group are left unwritten by the kernel (forward and backward): selects
  # on both sides keep them out of the values and the gradients
  inside = (jnp.arange(a + pad) < jnp.sum(group_sizes_E))[:, None]
  xp = jnp.where(inside, xp, 0)
  y = megablox.gmm(xp, w_ExDxF.astype(x_AxD.dtype), group_sizes_E, x_AxD.dtype, tiling,
                   None, None, False, not platform.is_tpu())
  return jnp.where(inside, y, 0)[:a]


def capacity_ffn(x_NxD, expert_N, valid_N, wg, wu, wd, capacity: int):
  """Expert FFN through a fixed [E, C, D] buffer; returns (y, number of dropped rows)."""
  n, d = x_NxD.shape
  e = wg.shape[0]
  onehot = jax.nn.one_hot(jnp.where(valid_N, expert_N, e), e + 1, dtype=jnp.int32)[:, :e]
  rank = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)  # position within expert
  keep = valid_N & (rank < capacity)
  slot = jnp.where(keep, expert_N * capacity + rank, e * capacity)
  buf = jnp.zeros((e * capacity, d), x_NxD.dtype).at[slot].set(x_NxD, mode="drop")
  y = _expert_ffn_blocks(buf.reshape(e, capacity, d), wg, wu, wd).reshape(e * capacity, d)
  y = y.at[slot].get(mode="fill", fill_value=0)
  return jnp.where(keep[:, None], y, 0), jnp.sum(valid_N & ~keep)


def _route(x_NxD, router_DxE, top_k: int, norm_topk: bool, mask_N):
  logits = jnp.dot(x_NxD.astype(jnp.float32), router_DxE.astype(jnp.float32))
  probs = jax.nn.softmax(logits, axis=-1)
  top_w, top_i = jax.lax.top_k(probs, top_k)
  if norm_topk:
    top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
  m = mask_N.astype(jnp.float32)
  e = router_DxE.shape[1]
  counts = jnp.sum(jax.nn.one_hot(top_i, e, dtype=jnp.float32) * m[:, None, None], axis=(0, 1))
  z = jax.nn.logsumexp(logits, axis=-1)
  stats = RouterStats(counts_E=counts, prob_sum_E=jnp.sum(probs * m[:, None], axis=0),
                      rows=jnp.sum(m), z_sum=jnp.sum(z * z * m), dropped=jnp.zeros((), jnp.int32))
  return top_w, top_i, stats


def rows_moe(x_NxD, mask_N, router_DxE, gate_up_2EIxD, down_DxEI, *, top_k: int,
             norm_topk: bool):
  """The `rows` backend: every expert on every row through two weight-streaming matmuls; the
  routing matrix (zero for unchosen experts) weights the activations before the down matmul."""
  n, _ = x_NxD.shape
  e = router_DxE.shape[1]
  inter = down_DxEI.shape[1] // e
  top_w, top_i, stats = _route(x_NxD, router_DxE, top_k, norm_topk, mask_N)
  if 2 * n * top_k <= e:
    return chosen_rows_moe(x_NxD, top_w, top_i, gate_up_2EIxD, down_DxEI, e), stats
  w_NxE = jnp.zeros((n, e), jnp.float32).at[jnp.arange(n)[:, None], top_i].add(top_w)
  gu = rows_matmul(x_NxD, gate_up_2EIxD, jnp.float32).reshape(n, e, 2, inter)
  act = jax.nn.silu(gu[:, :, 0]) * gu[:, :, 1] * w_NxE[:, :, None]
  return rows_matmul(act.reshape(n, e * inter), down_DxEI, x_NxD.dtype), stats


def chosen_rows_moe(x_NxD, top_w_NxK, top_i_NxK, gate_up_2EIxD, down_DxEI,
                    num_experts: int):
  """The `rows` backend when a step has few assignments (at most half the experts: up to 8 rows
  with Qwen3's 8 of 128 experts, 1 or 2 with `small`'s 4 of 16): each (row, choice) runs through
  its own expert only, so a step reads k experts' weights instead of all E. The expert's rows of
  gate/up and its column block of down are dynamic slices that XLA feeds to the products without
  a `lax.switch` over E branches (the earlier form): 8 chained MoE layers of `small` at batch 1,
  timed alone, take 1.0 ms instead of the switch's 2.5 ms; a whole decode step moved less than
  the run-to-run noise (benchmarks/results/speed.md, 2026-12-04)."""
  n, k = top_i_NxK.shape
  inter = down_DxEI.shape[1] // num_experts
  gate_up_Ex2IxD = gate_up_2EIxD.reshape(num_experts, 2 * inter, -1)

  def expert(x_1xD, j, w):
    gu = rows_matmul(x_1xD, jax.lax.dynamic_index_in_dim(gate_up_Ex2IxD, j, 0, keepdims=False),
                     jnp.float32)
    act = jax.nn.silu(gu[:, :inter]) * gu[:, inter:] * w
    return rows_matmul(act, jax.lax.dynamic_slice_in_dim(down_DxEI, j * inter, inter, axis=1),
                       jnp.float32)

  rows = []
  for r in range(n):
    outs = [expert(x_NxD[r:r + 1], top_i_NxK[r, c], top_w_NxK[r, c]) for c in range(k)]
    rows.append(sum(outs[1:], outs[0]))
  return jnp.concatenate(rows, axis=0).astype(x_NxD.dtype)


def _local_moe(x_NxD, mask_N, router, wg, wu, wd, *, top_k, norm_topk, backend, capacity_factor,
               expert_offset=0):
  """Routes and applies the experts held locally ([E_local] weights starting at expert_offset)."""
  n, d = x_NxD.shape
  e_local = wg.shape[0]
  top_w, top_i, stats = _route(x_NxD, router, top_k, norm_topk, mask_N)
  rows = jnp.repeat(x_NxD, top_k, axis=0)  # assignment a = n * k + j
  expert = top_i.reshape(-1) - expert_offset
  valid = (expert >= 0) & (expert < e_local)
  expert = jnp.clip(expert, 0, e_local - 1)
  dropped = jnp.zeros((), jnp.int32)
  if backend == "dense":
    h = jax.nn.silu(jnp.einsum("nd,edi->eni", x_NxD, wg)) * jnp.einsum("nd,edi->eni", x_NxD, wu)
    y_ExNxD = jnp.einsum("eni,eid->end", h, wd)
    w_NxE = jnp.zeros((n, e_local), jnp.float32)
    local_i = top_i - expert_offset
    ok = (local_i >= 0) & (local_i < e_local)
    w_NxE = w_NxE.at[jnp.arange(n)[:, None], jnp.clip(local_i, 0, e_local - 1)].add(
        jnp.where(ok, top_w, 0.0))
    out = jnp.einsum("end,ne->nd", y_ExNxD.astype(jnp.float32), w_NxE)
    return out.astype(x_NxD.dtype), stats
  if backend == "sorted":
    cap = capacity_for(n * top_k, e_local, capacity_factor)
    y, dropped = sorted_ffn(x_NxD, expert.reshape(n, top_k), valid.reshape(n, top_k), wg, wu, wd,
                            cap)
    y = y.reshape(n * top_k, d)
  elif backend in DROPLESS_FFN:
    y = DROPLESS_FFN[backend](x_NxD, expert.reshape(n, top_k), valid.reshape(n, top_k), wg, wu,
                              wd)
    y = y.reshape(n * top_k, d)
  elif backend == "capacity":
    cap = max(1, math.ceil(capacity_factor * n * top_k / max(e_local, 1)))
    y, dropped = capacity_ffn(rows, expert, valid, wg, wu, wd, cap)
  else:
    y = grouped_ffn(rows, expert, valid, wg, wu, wd, backend)
  y = y.reshape(n, top_k, d).astype(jnp.float32)
  out = jnp.einsum("nkd,nk->nd", y, top_w)
  return out.astype(x_NxD.dtype), dataclasses.replace(stats, dropped=dropped.astype(jnp.int32))


def _a2a_moe(x_NxD, mask_N, router, wg, wu, wd, *, top_k, norm_topk, backend, capacity_factor,
             ep: int, ep_capacity_factor: float):
  """Expert parallelism with tokens split over the `expert` axis: exchange by all_to_all."""
  n, d = x_NxD.shape
  e_local = wg.shape[0]
  top_w, top_i, stats = _route(x_NxD, router, top_k, norm_topk, mask_N)
  a = n * top_k
  expert = top_i.reshape(-1)
  dest = expert // e_local
  # Per-destination send buffers. Dropless by default: room for every local assignment.
  cap = a if ep_capacity_factor <= 0 else max(1, math.ceil(ep_capacity_factor * a / ep))
  onehot = jax.nn.one_hot(dest, ep, dtype=jnp.int32)
  rank = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)
  keep = rank < cap
  slot = jnp.where(keep, dest * cap + rank, ep * cap)
  rows = jnp.repeat(x_NxD, top_k, axis=0)
  send_x = jnp.zeros((ep * cap, d), x_NxD.dtype).at[slot].set(rows, mode="drop")
  send_e = jnp.full((ep * cap,), -1, jnp.int32).at[slot].set(expert % e_local, mode="drop")
  recv_x = jax.lax.all_to_all(send_x.reshape(ep, cap, d), "expert", 0, 0, tiled=False)
  recv_e = jax.lax.all_to_all(send_e.reshape(ep, cap), "expert", 0, 0, tiled=False)
  rx, re_ = recv_x.reshape(ep * cap, d), recv_e.reshape(ep * cap)
  valid = re_ >= 0
  if backend == "sorted":
    c2 = capacity_for(a, e_local, capacity_factor)
    ry, dropped_here = sorted_ffn(rx, jnp.maximum(re_, 0)[:, None], valid[:, None], wg, wu, wd, c2)
    ry = ry[:, 0]
  elif backend == "capacity":
    c2 = max(1, math.ceil(capacity_factor * a / e_local))  # global rows per expert, as locally
    ry, dropped_here = capacity_ffn(rx, jnp.maximum(re_, 0), valid, wg, wu, wd, c2)
  elif backend == "dense":
    ry = grouped_ffn(rx, jnp.maximum(re_, 0), valid, wg, wu, wd, "blocked")
    dropped_here = jnp.zeros((), jnp.int32)
  else:
    ry = grouped_ffn(rx, jnp.maximum(re_, 0), valid, wg, wu, wd, backend)
    dropped_here = jnp.zeros((), jnp.int32)
  ry = jax.lax.psum(ry, "tensor")
  back = jax.lax.all_to_all(ry.reshape(ep, cap, d), "expert", 0, 0, tiled=False)
  y = back.reshape(ep * cap, d).at[slot].get(mode="fill", fill_value=0)
  y = jnp.where(keep[:, None], y, 0).reshape(n, top_k, d).astype(jnp.float32)
  out = jnp.einsum("nkd,nk->nd", y, top_w).astype(x_NxD.dtype)
  dropped = jnp.sum(~keep).astype(jnp.int32) + dropped_here.astype(jnp.int32)
  return out, dataclasses.replace(stats, dropped=dropped)


def in_chunks(fn, x_NxD, mask_N, chunk: int):
  """fn(x, mask) -> (y [N, D], RouterStats) run on `chunk` tokens at a time (a scan over
  rematerialised chunks; the last chunk padded with masked rows), stats summed over chunks. Every
  field of RouterStats is a sum, so the totals equal one call on all tokens; only the capacity
  of capacity-bounded buffers, which is sized per call, differs."""
  n, d = x_NxD.shape
  if chunk <= 0 or n <= chunk:
    return fn(x_NxD, mask_N)
  c = -(-n // chunk)
  pad = c * chunk - n
  if pad:
    x_NxD = jnp.concatenate([x_NxD, jnp.zeros((pad, d), x_NxD.dtype)])
    mask_N = jnp.concatenate([mask_N, jnp.zeros((pad,), mask_N.dtype)])
  one = jax.checkpoint(fn)

  def step(_, xm):
    return None, one(*xm)

  _, (y, st) = jax.lax.scan(step, None, (x_NxD.reshape(c, chunk, d), mask_N.reshape(c, chunk)))
  return y.reshape(c * chunk, d)[:n], jax.tree_util.tree_map(lambda v: jnp.sum(v, 0), st)


def resolve_backend(backend: str) -> str:
  """`auto` -> the backend for the platform being compiled for (`lwm_jax.model.platform`: an
  ahead-of-time compile for TPU on a CPU host gets TPU code); other names pass through."""
  if backend != "auto":
    return backend
  if platform.is_cpu():
    return "tiled"
  return "gmm" if platform.is_tpu() else "ragged_dot"


class MoE(nnx.Module):
  """Sparse MoE block of Qwen3-MoE (and the routed part of Qwen3.5-MoE)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    e, d, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    pdt = DTYPES[cfg.param_dtype]
    self.router = param(rngs, (d, e), ("embed", None), dtype=pdt)
    self.gate_proj = param(rngs, (e, d, i), ("expert", "embed", "mlp"), dtype=pdt)
    self.up_proj = param(rngs, (e, d, i), ("expert", "embed", "mlp"), dtype=pdt)
    self.down_proj = param(rngs, (e, i, d), ("expert", "mlp", "embed"), dtype=pdt)
    self.top_k = cfg.num_experts_per_tok
    self.norm_topk = cfg.norm_topk_prob
    self.backend = cfg.moe_backend
    self.capacity_factor = cfg.capacity_factor
    self.sorted_capacity_factor = cfg.sorted_capacity_factor
    self.ep_capacity_factor = cfg.ep_capacity_factor
    self.chunk_tokens = cfg.moe_chunk_tokens
    self.dtype = DTYPES[cfg.dtype]

  def _backend(self) -> str:
    return resolve_backend(self.backend)

  def __call__(self, x_BxSxD: jax.Array, mask_BxS: jax.Array | None = None):
    b, s, d = x_BxSxD.shape
    if mask_BxS is None:
      mask_BxS = jnp.ones((b, s), bool)
    dt = self.dtype
    if self.backend == "rows":
      mesh = jax.sharding.get_abstract_mesh()
      if not mesh.empty and mesh.size > 1:
        raise ValueError("MoE backend 'rows' (the decode layout) runs on one device only")
      y, stats = rows_moe(x_BxSxD.reshape(b * s, d).astype(dt), mask_BxS.reshape(-1),
                          self.router[...], self.gate_up_rows[...], self.down_rows[...],
                          top_k=self.top_k, norm_topk=self.norm_topk)
      return y.reshape(b, s, d), stats
    weights = (self.router[...], self.gate_proj[...].astype(dt), self.up_proj[...].astype(dt),
               self.down_proj[...].astype(dt))
    backend = self._backend()
    cf = self.sorted_capacity_factor if backend == "sorted" else self.capacity_factor
    kw = dict(top_k=self.top_k, norm_topk=self.norm_topk, backend=backend, capacity_factor=cf)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
      y, stats = in_chunks(lambda xf, mf: _local_moe(xf, mf, *weights, **kw),
                           x_BxSxD.reshape(b * s, d).astype(dt), mask_BxS.reshape(-1),
                           self.chunk_tokens)
      return y.reshape(b, s, d), stats
    return self._sharded(x_BxSxD.astype(dt), mask_BxS, weights, kw, mesh)

  def _sharded(self, x, mask, weights, kw, mesh):
    b, s, d = x.shape
    baxes = shd.batch_axes(b, mesh)
    ep = mesh.shape.get("expert", 1)
    tp = "tensor" if mesh.shape.get("tensor", 1) > 1 else None
    a2a = ep > 1 and "expert" in baxes
    bspec = P(baxes or None, None, None)
    # The experts' `embed` dim stays split over `fsdp` into the shard_map and is gathered here:
    # the gather's transpose is a reduce-scatter, so each device receives only its shard of the
    # experts' gradients. (Gathered by XLA before the shard_map, the gradients came back as an
    # all-reduce of the full expert weights over fsdp: 0 reduce-scatters, docs/pods.md.)
    fs = "fsdp" if mesh.shape.get("fsdp", 1) > 1 and d % mesh.shape["fsdp"] == 0 else None
    ex = "expert" if ep > 1 else None
    w_specs = (P(), P(ex, fs, tp), P(ex, fs, tp), P(ex, tp, fs))
    ep_cf = self.ep_capacity_factor
    chunk = self.chunk_tokens

    def body(x_l, m_l, router, wg, wu, wd):
      if fs:
        wg, wu = (jax.lax.all_gather(w, "fsdp", axis=1, tiled=True) for w in (wg, wu))
        wd = jax.lax.all_gather(wd, "fsdp", axis=2, tiled=True)
      bl, sl, _ = x_l.shape
      xf, mf = x_l.reshape(bl * sl, d), m_l.reshape(-1)
      if a2a:
        y, st = in_chunks(lambda xc, mc: _a2a_moe(xc, mc, router, wg, wu, wd, ep=ep,
                                                  ep_capacity_factor=ep_cf, **kw), xf, mf, chunk)
      else:
        offset = jax.lax.axis_index("expert") * wg.shape[0] if ep > 1 else 0
        y, st = in_chunks(lambda xc, mc: _local_moe(xc, mc, router, wg, wu, wd,
                                                    expert_offset=offset, **kw), xf, mf, chunk)
        red = tuple(a for a in ("expert", "tensor") if mesh.shape.get(a, 1) > 1)
        if red:
          y = jax.lax.psum(y, red)
        if ep > 1:
          st = dataclasses.replace(st, dropped=jax.lax.psum(st.dropped, "expert"))
      if baxes:  # router statistics over the whole batch
        st = jax.tree_util.tree_map(lambda v: jax.lax.psum(v, baxes), st)
      return y.reshape(bl, sl, d), st

    stats_spec = RouterStats(P(), P(), P(), P(), P())
    fn = jax.shard_map(body, mesh=mesh, in_specs=(bspec, P(baxes or None, None), *w_specs),
                       out_specs=(bspec, stats_spec), check_vma=False)
    return fn(x, mask, *weights)


jax.tree_util.register_dataclass(
    RouterStats, data_fields=["counts_E", "prob_sum_E", "rows", "z_sum", "dropped"],
    meta_fields=[])
