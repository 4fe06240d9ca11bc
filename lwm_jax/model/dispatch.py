"""Sorted dispatch for the MoE layer: tokens gathered into an [E, C, D] buffer, experts applied as
one batched matmul per projection, outputs gathered back; both directions are gathers in the
forward AND the backward pass.

Why: on CPU the scatter that packs rows into a buffer (and the scatter-add its gradient turns into)
costs more than the expert matmuls themselves. Each move here is a gather whose inverse is known, so
`take_rows` carries a custom VJP that reads the cotangent through the inverse index instead of
scattering it:

  forward   out[m]  = x[idx[m]]                      (0 where idx[m] is out of range)
  backward  dx[r]   = sum_j dout[inv[r, j]]           (inv lists every m with idx[m] = r)

The buffer's capacity C per expert is static (`capacity_factor * assignments / E`). Assignments past
an expert's capacity are dropped and counted, as in the `capacity` backend; the benchmarks print the
count (docs/benchmark.md).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


@jax.custom_vjp
def take_rows(x_RxD, idx_M, inv_RxJ):
  """x[idx] with rows of out-of-range indices set to 0; `inv_RxJ` is the inverse map (see module)."""
  del inv_RxJ
  return x_RxD.at[idx_M].get(mode="fill", fill_value=0)


def _take_rows_fwd(x_RxD, idx_M, inv_RxJ):
  return take_rows(x_RxD, idx_M, inv_RxJ), (idx_M, inv_RxJ)


def _take_rows_bwd(res, g_MxD):
  _, inv_RxJ = res
  g_RxJxD = g_MxD.at[inv_RxJ].get(mode="fill", fill_value=0)
  return jnp.sum(g_RxJxD, axis=1), None, None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def capacity_for(assignments: int, experts: int, capacity_factor: float) -> int:
  """Static rows per expert: ceil(capacity_factor * assignments / experts), at least 1."""
  return max(1, math.ceil(capacity_factor * assignments / max(experts, 1)))


def _sort(expert_NxK, valid_NxK, num_experts: int):
  """Assignments (a = n*K + k) sorted by expert, invalid ones last: (key_A, order_A, sizes_E,
  starts_E, pos_A) where pos_A is each assignment's place in the sort."""
  a = expert_NxK.size
  key_A = jnp.where(valid_NxK, expert_NxK, num_experts).reshape(a)
  order_A = jnp.argsort(key_A, stable=True)
  sizes_E = jnp.bincount(key_A, length=num_experts + 1)[:num_experts]
  starts_E = jnp.cumsum(sizes_E) - sizes_E
  # An integer scatter of A indices, outside the gradient path.
  pos_A = jnp.zeros((a,), jnp.int32).at[order_A].set(jnp.arange(a, dtype=jnp.int32))
  return key_A, order_A, sizes_E, starts_E, pos_A


def _slot_maps(expert_NxK, valid_NxK, num_experts, first_slot_E, limit_E, slot_expert_M):
  """Slot maps for a buffer where expert e owns slots first_slot_E[e] ... + limit_E[e] - 1 and
  slot m belongs to expert slot_expert_M[m] (see `sorted_slots` for the returned maps)."""
  n, k = expert_NxK.shape
  a, e, m = n * k, num_experts, slot_expert_M.shape[0]
  key_A, order_A, sizes_E, starts_E, pos_A = _sort(expert_NxK, valid_NxK, e)
  # Slot m holds the c-th assignment of its expert in sorted order, when there is one.
  col_M = jnp.arange(m) - first_slot_E[slot_expert_M]
  filled_M = (col_M >= 0) & (col_M < jnp.minimum(sizes_E, limit_E)[slot_expert_M])
  assign_M = order_A[jnp.clip(starts_E[slot_expert_M] + col_M, 0, a - 1)]
  src_assign_M = jnp.where(filled_M, assign_M, a)
  src_token_M = jnp.where(filled_M, assign_M // k, n)
  key_c = jnp.minimum(key_A, e - 1)
  rank_A = pos_A - starts_E[key_c]
  valid_A = key_A < e
  keep_A = valid_A & (rank_A < limit_E[key_c])
  slot_A = jnp.where(keep_A, first_slot_E[key_c] + rank_A, m)
  dropped = jnp.sum(valid_A & ~keep_A).astype(jnp.int32)
  return slot_A, src_token_M, src_assign_M, dropped


def sorted_slots(expert_NxK, valid_NxK, num_experts: int, capacity: int):
  """Slots of the [E, C] capacity buffer for each assignment, and the inverse maps.

  Returns (slot_A, src_token_M, src_assign_M, dropped) with A = N*K assignments (a = n*K + k) and
  M = E*C slots (m = e*C + c): `slot_A[a]` is a's slot or M when a is dropped or invalid,
  `src_token_M[m]` the token whose row fills slot m (N when empty), `src_assign_M[m]` the
  assignment in slot m (A when empty). Within an expert, assignments keep token order."""
  e, c = num_experts, capacity
  first_E = jnp.arange(e) * c
  return _slot_maps(expert_NxK, valid_NxK, e, first_E, jnp.full((e,), c),
                    jnp.arange(e * c) // c)


def block_rows_for(assignments: int, experts: int) -> int:
  """Default rows per block of the blocked layout: about a quarter of an expert's average share
  (smaller blocks waste fewer padded rows, larger ones copy fewer expert weights)."""
  return max(8, -(-assignments // (4 * experts)) // 8 * 8)


def blocked_slots(expert_NxK, valid_NxK, num_experts: int, block_rows: int):
  """Dropless layout: each expert's assignments padded to whole blocks of `block_rows`; returns
  (slot_A, src_token_M, src_assign_M, block_expert_B) with M = B * block_rows slots, B a static
  bound on the number of blocks (unused trailing blocks are empty)."""
  a, e, br = expert_NxK.size, num_experts, block_rows
  nb = (a + e * (br - 1)) // br + 1
  key_A = jnp.where(valid_NxK, expert_NxK, e).reshape(a)
  sizes_E = jnp.bincount(key_A, length=e + 1)[:e]
  padded_E = -(-sizes_E // br) * br
  first_E = jnp.cumsum(padded_E) - padded_E
  block_expert_B = jnp.clip(jnp.searchsorted(first_E + padded_E, jnp.arange(nb) * br,
                                             side="right"), 0, e - 1)
  slot_expert_M = jnp.repeat(block_expert_B, br, total_repeat_length=nb * br)
  slot_A, src_token_M, src_assign_M, _ = _slot_maps(expert_NxK, valid_NxK, e, first_E, padded_E,
                                                    slot_expert_M)
  return slot_A, src_token_M, src_assign_M, block_expert_B


def _swiglu_experts(x_ExCxD, wg_ExDxI, wu_ExDxI, wd_ExIxD):
  h = jax.nn.silu(jnp.einsum("ecd,edi->eci", x_ExCxD, wg_ExDxI)) * jnp.einsum(
      "ecd,edi->eci", x_ExCxD, wu_ExDxI)
  return jnp.einsum("eci,eid->ecd", h, wd_ExIxD)


def sorted_ffn(x_NxD, expert_NxK, valid_NxK, wg_ExDxI, wu_ExDxI, wd_ExIxD, capacity: int):
  """Expert `expert_NxK[n, k]` applied to token n for each of its K assignments, [N, K, D] (zero
  where invalid or dropped), and the number of dropped assignments."""
  n, d = x_NxD.shape
  k = expert_NxK.shape[1]
  e = wg_ExDxI.shape[0]
  slot_A, src_token_M, src_assign_M, dropped = sorted_slots(expert_NxK, valid_NxK, e, capacity)
  buf_MxD = take_rows(x_NxD, src_token_M, slot_A.reshape(n, k))
  y_ExCxD = _swiglu_experts(buf_MxD.reshape(e, capacity, d), wg_ExDxI, wu_ExDxI, wd_ExIxD)
  y_AxD = take_rows(y_ExCxD.reshape(e * capacity, d), slot_A, src_assign_M[:, None])
  return y_AxD.reshape(n, k, d), dropped


def blocked_ffn(x_NxD, expert_NxK, valid_NxK, wg_ExDxI, wu_ExDxI, wd_ExIxD, block_rows: int = 0):
  """Dropless: like `sorted_ffn` but each expert gets whole blocks of rows (as many as it needs)
  and each block is multiplied by its expert's gathered weights. Returns [N, K, D]."""
  n, d = x_NxD.shape
  k = expert_NxK.shape[1]
  e = wg_ExDxI.shape[0]
  br = block_rows or block_rows_for(n * k, e)
  slot_A, src_token_M, src_assign_M, be_B = blocked_slots(expert_NxK, valid_NxK, e, br)
  buf_MxD = take_rows(x_NxD, src_token_M, slot_A.reshape(n, k))
  nb = be_B.shape[0]
  y_BxRxD = _swiglu_experts(buf_MxD.reshape(nb, br, d), wg_ExDxI[be_B], wu_ExDxI[be_B],
                            wd_ExIxD[be_B])
  y_AxD = take_rows(y_BxRxD.reshape(nb * br, d), slot_A, src_assign_M[:, None])
  return y_AxD.reshape(n, k, d)
