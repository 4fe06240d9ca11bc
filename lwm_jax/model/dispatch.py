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
count (docs/benchmark.md). Two dropless layouts use the same gathers: `blocked_ffn` (each expert's
rows padded to whole blocks, one batched product with per-block gathered weights) and `tiled_ffn`
(rows sorted by expert, one loop of 2-D products over tiles; see the section further down).
"""
from __future__ import annotations

import functools
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


# ------------------------------------------------------------------ tiled grouped matmul (dropless)
#
# Rows sorted by expert are multiplied tile by tile (`tile` rows at a time: by default a quarter
# of an expert's average share, 128 at `small` 8 x 256, 512 at the `demo` CPT shape) by their
# expert's weights inside one loop whose trip count is the number of tiles actually needed,
# sum_e ceil(rows_e / tile). Nothing is padded or copied per expert: a tile that runs past its
# expert's last row computes a few rows with the wrong weights, and the next expert's first tile
# (processed later, the loop runs in row order) overwrites them. The backward pass is written out
# (a loop cannot be differentiated with a dynamic trip count): one loop makes dx with transposed
# weights and dw by summing x_tile^T @ dy_tile per tile, the rows of other experts masked out.
# The gate and up projections share one loop (and its tiles of x).
# At `small` on CPU the tiles' products run near the matmul peak, where the batched einsum of
# `blocked_ffn` (per-block gathered weights, padded rows) ran at about a third of it
# (benchmarks/results/speed.md).


def _tiles(group_sizes_E, tile: int):
  """(first row of each expert, tiles per expert, first tile of each expert, number of tiles)."""
  starts_E = jnp.cumsum(group_sizes_E) - group_sizes_E
  ntiles_E = (group_sizes_E + tile - 1) // tile
  first_E = jnp.cumsum(ntiles_E) - ntiles_E
  return starts_E, ntiles_E, first_E, jnp.sum(ntiles_E)


def _tile_at(t, starts_E, ntiles_E, first_E, tile: int):
  """The expert of tile t and the tile's first row."""
  e = jnp.clip(jnp.searchsorted(first_E + ntiles_E, t, side="right"), 0, starts_E.shape[0] - 1)
  return e, starts_E[e] + (t - first_E[e]) * tile


def _pad_rows(x, tile: int):
  return jnp.concatenate([x, jnp.zeros((tile,) + x.shape[1:], x.dtype)])


def _rows_in_groups(a: int, group_sizes_E):
  return (jnp.arange(a) < jnp.sum(group_sizes_E))[:, None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def tiled_matmuls(x_AxD, ws, group_sizes_E, tile: int = 128):
  """Grouped matmuls: rows sorted by group (group e owns the next group_sizes_E[e] rows) times
  their group's weights, for each [E, D, F] array of the tuple `ws` (one loop for all: the gate
  and up projections share their tiles); rows past the last group give 0. Returns a tuple; each
  entry equals `jax.lax.ragged_dot(x, w, group_sizes)` on the grouped rows."""
  a = x_AxD.shape[0]
  starts_E, ntiles_E, first_E, total = _tiles(group_sizes_E, tile)
  xp = _pad_rows(x_AxD, tile)

  def body(t, outs):
    e, r0 = _tile_at(t, starts_E, ntiles_E, first_E, tile)
    x_t = jax.lax.dynamic_slice_in_dim(xp, r0, tile)
    return tuple(jax.lax.dynamic_update_slice_in_dim(
        out, jnp.dot(x_t, w[e]).astype(out.dtype), r0, axis=0) for out, w in zip(outs, ws))

  outs = jax.lax.fori_loop(0, total, body, tuple(
      jnp.zeros((a + tile, w.shape[2]), x_AxD.dtype) for w in ws))
  keep = _rows_in_groups(a, group_sizes_E)
  return tuple(jnp.where(keep, out[:a], 0) for out in outs)


def _tiled_matmuls_fwd(x_AxD, ws, group_sizes_E, tile):
  return tiled_matmuls(x_AxD, ws, group_sizes_E, tile), (x_AxD, ws, group_sizes_E)


def _tiled_matmuls_bwd(tile, res, gs_AxF):
  """One loop over the tiles makes every gradient: dx = sum_i g_i @ w_i^T (written in row order,
  so a tile's rows of the next expert are overwritten as in the forward pass) and
  dw_i[e] += x^T @ g_i with the rows of other experts masked out of x."""
  x_AxD, ws, group_sizes_E = res
  a = x_AxD.shape[0]
  starts_E, ntiles_E, first_E, total = _tiles(group_sizes_E, tile)
  xp = _pad_rows(x_AxD, tile)
  gps = tuple(_pad_rows(g, tile) for g in gs_AxF)

  def body(t, carry):
    dx, dws = carry
    e, r0 = _tile_at(t, starts_E, ntiles_E, first_E, tile)
    g_ts = [jax.lax.dynamic_slice_in_dim(gp, r0, tile) for gp in gps]
    dx_t = sum(jax.lax.dot_general(g_t, w[e], (((1,), (1,)), ((), ())),
                                   preferred_element_type=jnp.float32)
               for g_t, w in zip(g_ts, ws))
    own = (r0 + jnp.arange(tile)) < starts_E[e] + group_sizes_E[e]
    x_t = jnp.where(own[:, None], jax.lax.dynamic_slice_in_dim(xp, r0, tile), 0)
    dws = tuple(dw.at[e].add(jax.lax.dot_general(x_t, g_t, (((0,), (0,)), ((), ())),
                                                  preferred_element_type=jnp.float32))
                for dw, g_t in zip(dws, g_ts))
    return jax.lax.dynamic_update_slice_in_dim(dx, dx_t.astype(dx.dtype), r0, axis=0), dws

  dx, dws = jax.lax.fori_loop(0, total, body, (
      jnp.zeros(xp.shape, x_AxD.dtype), tuple(jnp.zeros(w.shape, jnp.float32) for w in ws)))
  dx = jnp.where(_rows_in_groups(a, group_sizes_E), dx[:a], 0)
  return dx, tuple(dw.astype(w.dtype) for dw, w in zip(dws, ws)), None


tiled_matmuls.defvjp(_tiled_matmuls_fwd, _tiled_matmuls_bwd)


def tiled_matmul(x_AxD, w_ExDxF, group_sizes_E, tile: int = 128):
  """`tiled_matmuls` with one weight array."""
  return tiled_matmuls(x_AxD, (w_ExDxF,), group_sizes_E, tile)[0]


def tiled_ffn(x_NxD, expert_NxK, valid_NxK, wg_ExDxI, wu_ExDxI, wd_ExIxD, tile: int = 0):
  """Dropless: assignments gathered in expert order, the SwiGLU experts applied by
  `tiled_matmul`, outputs gathered back to assignment order. Returns [N, K, D]. `tile` (0: a
  quarter of an expert's average share, as `block_rows_for`) bounds the rows computed with the
  wrong weights at each expert's end; larger tiles mean fewer, larger products."""
  n, k = expert_NxK.shape
  e = wg_ExDxI.shape[0]
  tile = tile or block_rows_for(n * k, e)
  key_A, order_A, sizes_E, _, pos_A = _sort(expert_NxK, valid_NxK, e)
  a = n * k
  valid_A = key_A < e
  valid_M = key_A[order_A] < e
  # sorted place m holds assignment order_A[m] (token order_A[m] // k); invalid places read nothing
  src_token_M = jnp.where(valid_M, order_A // k, n)
  slot_A = jnp.where(valid_A, pos_A, a)
  xs_MxD = take_rows(x_NxD, src_token_M, slot_A.reshape(n, k))
  gs = sizes_E.astype(jnp.int32)
  g, u = tiled_matmuls(xs_MxD, (wg_ExDxI, wu_ExDxI), gs, tile)
  h = jax.nn.silu(g) * u
  ys_MxD = tiled_matmul(h, wd_ExIxD, gs, tile)
  y_AxD = take_rows(ys_MxD, slot_A, jnp.where(valid_M, order_A, a)[:, None])
  return y_AxD.reshape(n, k, -1)
