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


def sorted_slots(expert_NxK, valid_NxK, num_experts: int, capacity: int):
  """Buffer slots for each assignment and the inverse maps.

  Returns (slot_A, src_token_M, src_assign_M, dropped) with A = N*K assignments (a = n*K + k) and
  M = E*C slots (m = e*C + c): `slot_A[a]` is a's slot or M when a is dropped or invalid,
  `src_token_M[m]` the token whose row fills slot m (N when empty), `src_assign_M[m]` the
  assignment in slot m (A when empty). Within an expert, assignments keep token order."""
  n, k = expert_NxK.shape
  a, e, c = n * k, num_experts, capacity
  key_A = jnp.where(valid_NxK, expert_NxK, e).reshape(a)  # invalid assignments sort last
  order_A = jnp.argsort(key_A, stable=True)
  sizes_E = jnp.bincount(key_A, length=e + 1)[:e]
  starts_E = jnp.cumsum(sizes_E) - sizes_E
  # Slot (e, c) holds the c-th assignment of expert e in sorted order, when there is one.
  col_C = jnp.arange(c)
  pos_ExC = starts_E[:, None] + col_C[None, :]
  filled_ExC = col_C[None, :] < jnp.minimum(sizes_E, c)[:, None]
  assign_ExC = order_A[jnp.clip(pos_ExC, 0, a - 1)]
  src_assign_M = jnp.where(filled_ExC, assign_ExC, a).reshape(e * c)
  src_token_M = jnp.where(filled_ExC, assign_ExC // k, n).reshape(e * c)
  # Each assignment's rank within its expert, from its place in the sort (an integer scatter of
  # A indices, outside the gradient path).
  pos_A = jnp.zeros((a,), jnp.int32).at[order_A].set(jnp.arange(a, dtype=jnp.int32))
  key_c = jnp.minimum(key_A, e - 1)
  rank_A = pos_A - starts_E[key_c]
  valid_A = key_A < e
  keep_A = valid_A & (rank_A < c)
  slot_A = jnp.where(keep_A, key_c * c + rank_A, e * c)
  dropped = jnp.sum(valid_A & ~keep_A).astype(jnp.int32)
  return slot_A, src_token_M, src_assign_M, dropped


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
