"""The continuous-batching engine: a fixed set of decode slots that requests enter and leave.

`ContinuousEngine` keeps one cache of `num_slots` rows, each `cache_len` positions long (KV for
attention layers; convolution and recurrent state for the linear-attention layers of the hybrid
model), and the per-slot decode state beside it (last logits, position, tokens generated, the
penalty counts, sampling settings). Work is split as in JetStream:

- insert: the prompts waiting for free slots are prefilled together (the static engine's
  `_prefill`, each row at its own position; prompts of similar length, up to
  `prefill_batch_tokens` padded tokens a call, in chunks) into a batch cache whose rows are then copied, in one call, into every free
  slot their rows take (the `n` choices of a request, and waiting rows of other requests with the
  same prompt, share one prefill row: the prompt's state is forked into their slots);
- generate: one jit call runs up to `chunk_steps` decode steps over the slots (`engine.decode_steps`,
  the static engine's loop); empty and finished slots are idle rows.

`step()` admits waiting rows into free slots, runs one decode chunk, hands each request its new
tokens (`on_chunk`, which may stop rows, e.g. at a stop string) and frees the slots of rows that
finished, so a short reply leaves at once and a late request starts at the next chunk.
Shapes stay static: a decode chunk is compiled per (slot bucket, window) pair, where the slot
bucket is the power of two covering the highest busy slot (free slots are taken lowest first, so
a lone request decodes one row, not `num_slots`) and the window is the smallest power of two
(at least `min_cache_len`, at most `cache_len`; past 1,024 positions also 1.5 x a power of two)
that holds every busy slot's position after the chunk (attention then reads only that much of
the cache); prefill is compiled per (prompt bucket, chunk length, window) triple, the prompt
bucket being the power of two covering the prompts prefilled together and the window (as for
decoding, at least `prefill_chunk`) covering the positions the call's rows reach.

The prompt prefixes of earlier requests are kept in a `PrefixCache` (`prefix_cache.py`) under a
byte bound: a prompt that starts with a stored prefix restores that state and prefills only its
remaining tokens.

A row's tokens do not depend on its slot or its neighbours: the sampling key of step t is
`fold_in(fold_in(key(seed), choice), t)` as in the static engine, so under greedy decoding a
request gets the tokens it gets alone. Thread use: `submit` and `cancel` may be called from any
thread; `step` runs under a lock (the server runs it on one thread; `generate` steps until its own
rows are done).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lwm_jax.model.attention import CACHE_LAYOUT
from lwm_jax.sampling.engine import (FINISH_NAMES, FINISH_STOP, TOP_LOGPROBS,
                                     Engine, RowOutput, _init_cache, _nullcontext,
                                     _half_pow2, _pow2, _prefill, _prompt_seen, _Rows,
                                     decode_steps)
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.prefix_cache import PrefixCache


class Cancelled(RuntimeError):
  """A request's rows were cancelled (e.g. its streaming client went away)."""


# ------------------------------------------------------------------------------ device helpers
# Attention windows of more than 1,024 positions also come in 1.5 x powers of two (1,536, 3,072,
# ...): for a small model on CPU a long window's attention costs more than the weights (the
# shipped model: 4x as long over 2,048 positions as over 512), and the half steps cut a window's
# padding from up to 50% to up to 33% for one more compiled shape per doubling.
HALF_STEPS_ABOVE = 1024


def _window(n: int, lo: int, cap: int) -> int:
  """The attention window holding `n` positions: a power of two >= lo (or 1.5 x one above
  HALF_STEPS_ABOVE), at most `cap`."""
  p = _pow2(n, lo)
  return min(_half_pow2(n, lo) if p > 2 * HALF_STEPS_ABOVE - 1 else p, cap)


def _time_axis(name: str) -> int | None:
  return CACHE_LAYOUT[name].index("t") if name in CACHE_LAYOUT else None


def _window_view(cache, window: int, rows: int | None = None):
  """The first `rows` rows (all when None) and first `window` positions of a cache (a view for a
  jitted call; `_write_back` puts it in place)."""
  def view_of(name, a):
    a = a if rows is None else a[:rows]
    ax = _time_axis(name)
    return a if ax is None else jax.lax.slice_in_dim(a, 0, window, axis=ax)
  return _map_cache(view_of, cache)


def _write_back(cache, view):
  return _map_cache(lambda _, a, v: jax.lax.dynamic_update_slice(a, v, (0,) * a.ndim),
                    cache, view)


def _spec(a, sharded: bool = False):
  """The shape and dtype of an array (and its sharding when `sharded`: on one device the live
  arrays carry none, and a lowering must see what the later call sees to share its executable)."""
  return jax.ShapeDtypeStruct(a.shape, a.dtype,
                              sharding=getattr(a, "sharding", None) if sharded else None)


def _map_cache(fn, *caches):
  """Applies fn(name, *arrays) to each array of per-layer cache dicts."""
  return [{n: fn(n, *(c[i][n] for c in caches)) for n in caches[0][i]}
          for i in range(len(caches[0]))]


@functools.partial(jax.jit, static_argnums=(2,))
def _trim_row(cache, row, length: int):
  """Row `row` of a batch cache as a one-row cache, attention keys/values cut to the first
  `length` positions (a prefix-cache snapshot)."""
  def cut(name, a):
    a = jax.lax.dynamic_slice_in_dim(a, row, 1, axis=0)
    ax = _time_axis(name)
    return a if ax is None else jax.lax.slice_in_dim(a, 0, length, axis=ax)
  return _map_cache(cut, cache)


@functools.partial(jax.jit, donate_argnums=(0,))
def _restore_into(cache, trimmed, row):
  """A snapshot written into row `row` of a batch cache; its attention keys/values fill the first
  positions (the positions past them are never read before the row writes them)."""
  return _map_cache(lambda _, big, small: jax.lax.dynamic_update_slice(
      big, small.astype(big.dtype), (row,) + (0,) * (big.ndim - 1)), cache, trimmed)


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def _prefill_window(graphdef, window: int, state, cache, tokens_BxC, starts_B, stops_B, lengths_B,
                    logits_BxV):
  """The static engine's `_prefill` on the first `window` positions of a batch cache: attention
  reads only those (on CPU a chunk's attention costs about as much per cached position as its
  weights do per token: measured on the shipped model, a 512-token chunk takes 4x as long over
  2048 positions as over 512). Every real token of the call lies inside the window; padding
  past it is dropped, as past the cache's end."""
  view, logits = _prefill(graphdef, state, _window_view(cache, window), tokens_BxC, starts_B,
                          stops_B, lengths_B, logits_BxV)
  return _write_back(cache, view), logits


@functools.partial(jax.jit, donate_argnums=(0, 1, 2))
def _insert_rows(cache, carry, rows, slots_R, src_R, pcache, logits_UxV, seen_UxV, pos_R,
                 new_rows):
  """Copies row src_R[r] of a prefilled batch cache into slot slots_R[r] for each r (forked rows
  share a source row) and resets those slots' decode state. Slots past the last (padding) are
  dropped."""
  def put(big, small):
    return big.at[slots_R].set(small.astype(big.dtype), mode="drop")

  cache = _map_cache(lambda _, big, small: put(big, small[src_R]), cache, pcache)
  zeros = jnp.zeros_like(slots_R)
  carry = dict(carry, logits=put(carry["logits"], logits_UxV[src_R]), pos=put(carry["pos"], pos_R),
               n_gen=put(carry["n_gen"], zeros), done=put(carry["done"], zeros.astype(bool)),
               finish=put(carry["finish"], zeros),
               counts=put(carry["counts"], jnp.zeros((len(src_R),) + carry["counts"].shape[1:],
                                                     carry["counts"].dtype)),
               seen=put(carry["seen"], seen_UxV[src_R]))
  rows = jax.tree_util.tree_map(put, rows, new_rows)
  return cache, carry, rows


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5), donate_argnums=(7, 8))
def _decode_slots(graphdef, steps: int, cache_len: int, nb: int, window: int, top_n: int, state,
                  cache, carry, rows: _Rows):
  """A decode chunk over the first `nb` slots, attention reading the first `window` positions."""
  view = _window_view(cache, window, nb)
  sub = {k: v[:nb] for k, v in carry.items()}
  sub_rows = jax.tree_util.tree_map(lambda a: a[:nb], rows)
  view, sub, out_tok, out_lp, top = decode_steps(graphdef, steps, cache_len, top_n, state, view,
                                                 sub, sub_rows)
  cache = _write_back(cache, view)
  carry = {k: jax.lax.dynamic_update_slice(v, sub[k], (0,) * v.ndim) for k, v in carry.items()}
  return cache, carry, out_tok, out_lp, top


# ------------------------------------------------------------------------------ host records
@dataclasses.dataclass(eq=False)
class _Row:
  group: "Group"
  index: int  # within its group
  prompt: list[int]
  params: SamplingParams
  stop_ids: list[int]
  choice: int
  max_new: int
  slot: int | None = None
  finish: str | None = None
  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  tops: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class _Unit:
  """A distinct prompt being admitted: its rows (forked from one prefill), where its prefill
  starts (the restored prefix-cache entry's length) and where it stores snapshots."""
  ids: list[int]
  rows: list[_Row]
  start: int = 0
  entry: Any = None
  points: list = dataclasses.field(default_factory=list)


class Group:
  """The rows of one submission (a request's prompts x choices); `wait()` returns their outputs."""

  def __init__(self, on_chunk, on_done):
    self.rows: list[_Row] = []
    self.on_chunk, self.on_done = on_chunk, on_done
    self.outputs: list[RowOutput] | None = None
    self.error: BaseException | None = None
    self.submitted = time.monotonic()
    self._event = threading.Event()

  @property
  def finished(self) -> bool:
    return self._event.is_set()

  def _complete(self, error: BaseException | None = None) -> None:
    if self._event.is_set():
      return
    self.error = error
    if error is None:
      self.outputs = [RowOutput(r.tokens, r.logprobs, r.finish or "length",
                                r.tops if r.params.top_logprobs else None) for r in self.rows]
    self._event.set()
    if self.on_done is not None:
      self.on_done(self.outputs, error)

  def wait(self, timeout: float | None = None) -> list[RowOutput]:
    if not self._event.wait(timeout):
      raise TimeoutError("the request's rows did not finish in time")
    if self.error is not None:
      raise self.error
    return self.outputs


# ------------------------------------------------------------------------------ engine
class ContinuousEngine(Engine):
  """Slots, insert/generate and a prefix cache over the static engine's model set-up (decode
  layout, MoE backend, mesh); see the module docstring. Extra options:

  num_slots: rows decoded together (default `max_batch`); cache_len: positions per slot (default
  the model's context; a prompt plus its budget must fit, and the engine's `context` becomes this);
  prefix_cache_mb: the prefix cache's bound in MiB (0 turns it off); prefix_block: tokens per
  prefix-cache block; share_prefixes: False prefills every row on its own and turns the prefix
  cache off (the benchmark's baseline); prefill_batch_tokens: the most padded prompt tokens one
  batched prefill call takes (prompts with more left to prefill go alone, in chunks).
  """

  def __init__(self, model, *, num_slots: int | None = None, cache_len: int | None = None,
               prefix_cache_mb: float = 256.0, prefix_block: int = 16,
               share_prefixes: bool = True, prefill_batch_tokens: int = 512, **engine_kw: Any):
    super().__init__(model, **engine_kw)
    self.num_slots = int(num_slots or self.max_batch)
    if self.num_slots < 1:
      raise ValueError(f"num_slots: must be at least 1, got {num_slots}")
    context = self.cfg.max_position_embeddings
    t = int(cache_len or context)
    if not 2 <= t <= context:
      raise ValueError(f"cache_len: {cache_len} must lie in [2, {context}] (the model's "
                       f"max_position_embeddings)")
    if prefix_cache_mb < 0:
      raise ValueError(f"prefix_cache_mb: must be >= 0, got {prefix_cache_mb}")
    self.cache_len = self.context = t
    self.share_prefixes = bool(share_prefixes)
    if prefill_batch_tokens < 1:
      raise ValueError(f"prefill_batch_tokens: must be at least 1, got {prefill_batch_tokens}")
    self.prefill_batch_tokens = int(prefill_batch_tokens)
    self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2 ** 20) if share_prefixes else 0,
                                    prefix_block)
    self._lock = threading.RLock()  # held by step(): one scheduler at a time
    self._inbox_lock = threading.Lock()
    self._inbox: list[Group] = []
    self._cancels: list[Group] = []
    self._waiting: collections.deque[_Row] = collections.deque()
    self._slots: list[_Row | None] = [None] * self.num_slots
    self._k = 4  # stop ids per slot (grows in powers of two)
    self._cache = self._carry = self._rows = None
    self.wakeup = threading.Condition()  # notified when work arrives (the server's loop waits)
    # Shapes known to be compiled (warm-up plans, and the shapes of calls made). With
    # `reuse_larger_shapes` a call whose own shape is not among them runs in the smallest one
    # that holds it (more padding, no wait for XLA): the server sets it while its background
    # warm-up is still compiling, so the first requests never wait for a compilation.
    self.compiled_shapes: set[tuple] = set()
    self.reuse_larger_shapes = False
    # counters
    self.chunks = self.decode_steps_run = 0
    self.prefills = self.prefill_batches = self.prefill_tokens = self.forked_rows = 0
    self.prefill_seconds = 0.0
    self.reused_shapes = 0  # calls that ran in a larger compiled shape than their own

  # ------------------------------------------------------------------------ public
  def submit(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
             stop_ids: Sequence[Sequence[int]], choices: Sequence[int] | None = None,
             on_chunk: Callable[[list[list[int]], list[list[float]]], Sequence[int]] | None
             = None, on_done: Callable[[list[RowOutput] | None, BaseException | None], None]
             | None = None) -> Group:
    """Queues rows (one per prompt) and returns their `Group`. `on_chunk(new_tokens,
    new_logprobs)` is called (on the stepping thread) after each decode chunk with the group's
    rows' new tokens and returns indices of rows to finish now ("stop"); `on_done(outputs,
    error)` once every row has finished (or the group failed or was cancelled)."""
    if not (len(prompts) == len(params) == len(stop_ids)):
      raise ValueError(f"submit: {len(prompts)} prompts, {len(params)} params and "
                       f"{len(stop_ids)} stop-id lists must be as many")
    if choices is not None and len(choices) != len(prompts):
      raise ValueError(f"submit: {len(choices)} choices for {len(prompts)} prompts")
    group = Group(on_chunk, on_done)
    for i, (p, sp, st) in enumerate(zip(prompts, params, stop_ids)):
      self.check_prompt(len(p))
      group.rows.append(_Row(group, i, [int(t) for t in p], sp, [int(t) for t in st],
                             0 if choices is None else int(choices[i]),
                             max(1, min(sp.max_new_tokens, self.cache_len - len(p)))))
    if not group.rows:
      group._complete()  # pylint: disable=protected-access
      return group
    with self._inbox_lock:
      self._inbox.append(group)
    with self.wakeup:
      self.wakeup.notify_all()
    return group

  def cancel(self, group: Group) -> None:
    """Finishes a group's rows at the next step and frees their slots (any thread)."""
    with self._inbox_lock:
      self._cancels.append(group)
    with self.wakeup:
      self.wakeup.notify_all()

  def generate(self, prompts, params, stop_ids, choices=None, on_chunk=None) -> list[RowOutput]:
    """The static engine's call: generates one sequence per prompt, stepping until done."""
    group = self.submit(prompts, params, stop_ids, choices, on_chunk)
    while not group.finished:
      self.step()
    return group.wait()

  def set_params(self, params) -> None:
    """As `Engine.set_params`; the prefix cache is emptied too, since its snapshots hold keys
    and values the old parameters computed (a hit would mix two policies)."""
    with self._lock:
      super().set_params(params)
      self.prefix_cache.clear()

  def busy(self) -> bool:
    """Whether a step has anything to do."""
    with self._inbox_lock:
      if self._inbox or self._cancels:
        return True
    return bool(self._waiting) or any(s is not None for s in self._slots)

  def running(self) -> int:
    return sum(s is not None for s in self._slots)

  def waiting(self) -> int:
    with self._inbox_lock:
      inbox = sum(len(g.rows) for g in self._inbox)
    return inbox + len(self._waiting)

  def stats(self) -> dict[str, Any]:
    return {"slots": self.num_slots, "running": self.running(), "waiting": self.waiting(),
            "chunks": self.chunks, "decode_steps": self.decode_steps_run,
            "prefills": self.prefills, "prefill_batches": self.prefill_batches,
            "prefill_tokens": self.prefill_tokens,
            "prefill_seconds": self.prefill_seconds, "forked_rows": self.forked_rows,
            "reused_shapes": self.reused_shapes, "prefix_cache": self.prefix_cache.stats()}

  def step(self) -> bool:
    """Admits waiting rows into free slots and runs one decode chunk; False when idle."""
    with self._lock:
      self._take_inbox()
      self._admit()
      if all(s is None for s in self._slots):
        return False
      self._decode_chunk()
      return True

  # ------------------------------------------------------------------------ state
  def _ctx(self):
    return jax.set_mesh(self.mesh) if self.mesh is not None else _nullcontext()

  def _ensure_state(self) -> None:
    if self._cache is not None:
      return
    s, v = self.num_slots, self.cfg.vocab_size
    with self._ctx():
      cache = _init_cache(self.graphdef, s, self.cache_len, self.state)
      if self.mesh is not None:
        cache = jax.tree_util.tree_map(self._put_like_batch, cache)
      self._cache = cache
      self._carry = dict(logits=self._put(np.zeros((s, v), np.float32)),
                         pos=self._put(np.zeros(s, np.int32)),
                         n_gen=self._put(np.zeros(s, np.int32)),
                         done=self._put(np.ones(s, bool)), finish=self._put(np.zeros(s, np.int32)),
                         counts=self._put(np.zeros((s, v), np.int32)),
                         seen=self._put(np.zeros((s, v), bool)))
      self._rows = self._put_rows(self._row_arrays([None] * s))

  def _row_arrays(self, rows: Sequence[_Row | None]) -> dict[str, np.ndarray]:
    """Host arrays of the sampling settings of `rows` (None: an idle slot)."""
    vocab, base = self.cfg.vocab_size, SamplingParams()
    ps = [r.params if r is not None else base for r in rows]
    stop = np.full((len(rows), self._k), -1, np.int32)
    for i, r in enumerate(rows):
      if r is not None:
        stop[i, :len(r.stop_ids)] = r.stop_ids

    def f32(field):
      return np.array([getattr(p, field) for p in ps], np.float32)

    return dict(temperature=f32("temperature"),
                top_k=np.array([min(p.top_k, vocab) for p in ps], np.int32),
                top_p=f32("top_p"), min_p=f32("min_p"),
                seed=np.array([p.seed % (2 ** 31) for p in ps], np.int32),
                choice=np.array([r.choice if r else 0 for r in rows], np.int32),
                max_new=np.array([r.max_new if r else 1 for r in rows], np.int32),
                stop_ids=stop, min_new=np.array([p.min_tokens for p in ps], np.int32),
                repetition=f32("repetition_penalty"), presence=f32("presence_penalty"),
                frequency=f32("frequency_penalty"))

  def _put_rows(self, arrays: dict[str, np.ndarray]) -> _Rows:
    return _Rows(**{k: self._put(v) for k, v in arrays.items()})

  def _grow_stop_ids(self, need: int) -> None:
    if need <= self._k:
      return
    k = _pow2(need, 4)
    old = self._rows.stop_ids
    pad = jnp.full((old.shape[0], k - old.shape[1]), -1, old.dtype)
    self._rows = dataclasses.replace(self._rows, stop_ids=jnp.concatenate([old, pad], axis=1))
    self._k = k

  # ------------------------------------------------------------------------ scheduling
  def _take_inbox(self) -> None:
    with self._inbox_lock:
      inbox, self._inbox = self._inbox, []
      cancels, self._cancels = self._cancels, []
    for g in inbox:
      self._waiting.extend(g.rows)
    for g in cancels:
      self._drop_group(g, Cancelled("the request was cancelled"))

  def _drop_group(self, group: Group, error: BaseException) -> None:
    """Removes a group's waiting rows and frees its slots, then completes it with `error`."""
    if group.finished:
      return
    self._waiting = collections.deque(r for r in self._waiting if r.group is not group)
    freed = [r.slot for r in group.rows if r.slot is not None]
    for r in group.rows:
      if r.slot is not None:
        self._slots[r.slot] = None
        r.slot = None
      r.finish = r.finish or "abort"
    self._mark_done(freed)
    group._complete(error)  # pylint: disable=protected-access

  def _mark_done(self, slots: list[int]) -> None:
    if slots and self._carry is not None:
      with self._ctx():
        self._carry["done"] = self._carry["done"].at[np.array(slots)].set(True)

  def _admit(self) -> None:
    """Moves waiting rows into free slots: rows with the same prompt share one prefill (forked),
    and the distinct prompts are prefilled together in batches of similar lengths. A prompt
    that shares a prefix with one whose snapshot this admission stores waits for the next wave
    and restores that snapshot instead of prefilling the prefix again."""
    free = [i for i, s in enumerate(self._slots) if s is None]
    units: list[_Unit] = []
    taken = 0
    while taken < len(free) and self._waiting:
      first = self._waiting.popleft()
      same = [first]
      rest = collections.deque()
      for r in self._waiting:  # rows with the same prompt share its prefill
        if self.share_prefixes and taken + len(same) < len(free) and r.prompt == first.prompt:
          same.append(r)
        else:
          rest.append(r)
      self._waiting = rest
      units.append(_Unit(first.prompt, same))
      taken += len(same)
    if not units:
      return
    try:
      self._ensure_state()
      self._grow_stop_ids(max(len(r.stop_ids) for u in units for r in u.rows))
    except Exception as e:  # noqa: BLE001 - nothing can be admitted: fail these requests
      for g in {id(r.group): r.group for u in units for r in u.rows}.values():
        self._drop_group(g, e)
      return
    pending = units
    while pending:
      wave, later, storing = [], [], set()
      for u in pending:
        u.rows = [r for r in u.rows if not r.group.finished]
        if not u.rows:
          continue
        keys = self.prefix_cache.keys(u.ids[:len(u.ids) - 1]) if self.prefix_cache.max_bytes \
            else []
        if wave and any(k in storing for k in keys):
          later.append(u)  # a snapshot of its prefix is about to be stored: restore it next
          continue
        if self.prefix_cache.max_bytes:
          u.start, u.entry = self.prefix_cache.lookup(u.ids, len(u.ids) - 1)
          u.points = self.prefix_cache.snapshot_points(u.ids, u.start)
          storing.update(k for _, k in u.points)
        wave.append(u)
      for batch in self._prefill_batches(wave):
        self._prefill_and_insert(batch, free)
      pending = later

  def _prefill_batches(self, units: list["_Unit"]) -> list[list["_Unit"]]:
    """Units grouped for batched prefill: sorted by the tokens they have left to prefill; a batch
    is at most `prefill_batch_tokens` padded tokens (its power-of-two row count times its
    longest remainder's power of two) and its longest at most twice its shortest (or both
    short), so padding costs little and long prompts, whose prefill is compute-bound, go alone."""
    def left(u):
      return len(u.ids) - u.start

    batches: list[list[_Unit]] = []
    for u in sorted(units, key=left):
      if batches:
        b = batches[-1]
        width = _pow2(left(u), self.min_prompt_bucket)
        if _pow2(len(b) + 1, 1) * width <= self.prefill_batch_tokens and \
            left(u) <= max(2 * left(b[0]), self.min_prompt_bucket):
          b.append(u)
          continue
      batches.append([u])
    return batches

  def _prefill_and_insert(self, batch: list["_Unit"], free: list[int]) -> None:
    """Prefills a batch of prompts and inserts their rows into free slots. When a batch fails,
    its prompts are retried one at a time, so only a prompt that fails alone fails its
    request."""
    for u in batch:  # a request failed by an earlier batch of this admission leaves
      u.rows = [r for r in u.rows if not r.group.finished]
    batch = [u for u in batch if u.rows]
    if not batch:
      return
    try:
      pcache, logits, seen = self._prefill_prompts(batch)
    except Exception as e:  # noqa: BLE001
      if len(batch) > 1:
        for u in batch:
          self._prefill_and_insert([u], free)
        return
      for g in {id(r.group): r.group for r in batch[0].rows}.values():
        self._drop_group(g, e)
      return
    placed = [(r, free.pop(0), j) for j, u in enumerate(batch) for r in u.rows]
    try:
      self._insert_rows(placed, pcache, logits, seen)
    except Exception as e:  # noqa: BLE001 - the slots were not written: fail these requests
      free.extend(slot for _, slot, _ in placed)
      free.sort()
      for g in {id(r.group): r.group for r, _, _ in placed}.values():
        self._drop_group(g, e)
      return
    self.forked_rows += sum(len(u.rows) - 1 for u in batch)

  def _prefill_prompts(self, batch: list["_Unit"]):
    """(batch cache with one row per unit, last logits [U, V], prompt token sets [U, V]). Each
    row starts from its restored prefix (or empty) and advances by up to one chunk per call
    towards its next stop (a snapshot point or its end), so rows at different positions share a
    call; a row's state is stored in the prefix cache as it
    passes each of its snapshot points. The batch is padded to a power of two with empty rows."""
    t0 = time.perf_counter()
    u = len(batch)
    ub = _pow2(u, 1)
    n = np.ones(ub, np.int64)
    n[:u] = [len(x.ids) for x in batch]
    pos = np.zeros(ub, np.int64)
    pos[:u] = [x.start for x in batch]
    stops = [[p for p, _ in x.points] + [len(x.ids)] for x in batch] + [[0]] * (ub - u)
    keys = [[k for _, k in x.points] for x in batch] + [[]] * (ub - u)
    with self._ctx():
      pcache = _init_cache(self.graphdef, ub, self.cache_len, self.state)
      if self.mesh is not None:
        pcache = jax.tree_util.tree_map(self._put_like_batch, pcache)
      for j, x in enumerate(batch):
        if x.entry is not None:
          pcache = _restore_into(pcache, x.entry.state, np.int32(j))
      logits = self._put(np.zeros((ub, self.cfg.vocab_size), np.float32))
      lengths = self._put(n.astype(np.int32))
      seg = [0] * ub  # index of each row's next stop
      while True:
        nxt = np.array([stops[j][seg[j]] if seg[j] < len(stops[j]) else pos[j]
                        for j in range(ub)])
        need = np.maximum(nxt - pos, 0)
        if not need.any():
          break
        # each call's chunk covers the longest stretch to a row's next stop (a power of two)
        chunk = min(_pow2(int(need.max()), self.min_prompt_bucket), self.prefill_chunk)
        adv = np.minimum(chunk, need)
        # a larger chunk (only when this one is below prefill_chunk, so it takes all of `need`)
        # or window changes nothing but padding
        _, _, chunk, span = self._shape(
            (ub, "prefill", chunk, self._prefill_window_for(int((pos + adv).max()))))
        tokens = np.zeros((ub, chunk), np.int32)
        for j in range(u):
          tokens[j, :adv[j]] = batch[j].ids[pos[j]:pos[j] + adv[j]]
        graph, state = self._prefill_model(ub * chunk)
        pcache, logits = _prefill_window(
            graph, span, state, pcache, self._put(tokens), self._put(pos.astype(np.int32)),
            self._put((pos + adv).astype(np.int32)), lengths, logits)
        pos = pos + adv
        for j in range(u):
          if seg[j] < len(stops[j]) and pos[j] == stops[j][seg[j]]:
            if seg[j] < len(keys[j]):
              p = int(pos[j])
              self.prefix_cache.store(keys[j][seg[j]], batch[j].ids[:p], _trim_row(
                  pcache, np.int32(j), min(self.cache_len, _pow2(p, 16))))
            seg[j] += 1
      width = _pow2(int(n.max()), self.min_prompt_bucket)  # one shape per bucket
      tokens = np.zeros((ub, width), np.int32)
      for j, x in enumerate(batch):
        tokens[j, :len(x.ids)] = x.ids
      seen = _prompt_seen(self.cfg.vocab_size, self._put(tokens), lengths)
      jax.block_until_ready(logits)  # prefill_seconds counts the computation, not its dispatch
    self.prefills += u
    self.prefill_batches += 1
    self.prefill_tokens += int(sum(len(x.ids) - x.start for x in batch))
    self.prefill_seconds += time.perf_counter() - t0
    return pcache, logits, seen

  def _insert_rows(self, placed: list[tuple[_Row, int, int]], pcache, logits, seen) -> None:
    """Writes (row, slot, source row of the batch cache) triples into the slots in one call (the
    count padded to a power of two with dropped entries)."""
    rb = _pow2(len(placed), 1)
    slots = np.full(rb, self.num_slots, np.int32)  # out of range: dropped
    src = np.zeros(rb, np.int32)
    pos = np.zeros(rb, np.int32)
    for i, (row, slot, j) in enumerate(placed):
      slots[i], src[i], pos[i] = slot, j, len(row.prompt)
    arrays = self._row_arrays([r for r, _, _ in placed] + [None] * (rb - len(placed)))
    with self._ctx():
      self._cache, self._carry, self._rows = _insert_rows(
          self._cache, self._carry, self._rows, jnp.asarray(slots), jnp.asarray(src), pcache,
          logits, seen, jnp.asarray(pos), _Rows(**{k: jnp.asarray(v) for k, v in arrays.items()}))
    for row, slot, _ in placed:
      row.slot = slot
      self._slots[slot] = row

  def _prefill_window_for(self, end: int) -> int:
    """The cache positions a prefill call attends over when its rows end by position `end`: a
    `_window` of at least `prefill_chunk` and `min_cache_len` positions (so that few shapes are
    compiled: 512, 1024, 1536 and 2048 for a 2048-token model by default), at most the cache."""
    return _window(end, max(self.prefill_chunk, self.min_cache_len), self.cache_len)

  def _buckets(self) -> tuple[int, int]:
    """(slot bucket, window) for the next chunk."""
    busy = [i for i, s in enumerate(self._slots) if s is not None]
    nb = min(_pow2(max(busy) + 1, self.min_batch_bucket), self.num_slots)
    need = max(len(s.prompt) + len(s.tokens) for s in self._slots if s is not None)
    window = _window(need + self.chunk_steps + 1, self.min_cache_len, self.cache_len)
    return nb, window

  def _shape(self, plan: tuple) -> tuple:
    """The plan a call runs in: its own, or with `reuse_larger_shapes` and its own not compiled
    yet, the compiled plan of the same kind (and, for prefill, the same prompt bucket) whose
    sizes all hold it at the least cost (product of the sizes); recorded as compiled."""
    if self.reuse_larger_shapes and plan not in self.compiled_shapes:
      # decode may take more slots (idle rows); a prefill's prompt bucket is its batch cache's
      more_rows = plan[1] == "decode"
      fits = [q for q in tuple(self.compiled_shapes)  # a copy: the warm-up thread adds to it
              if q[1] == plan[1] and len(q) == len(plan)
              and (q[0] >= plan[0] if more_rows else q[0] == plan[0])
              and all(a >= b for a, b in zip(q[2:], plan[2:]))]
      if fits:
        self.reused_shapes += 1
        return min(fits, key=lambda q: (q[0] * int(np.prod(q[2:])), q))
    self.compiled_shapes.add(plan)
    return plan

  def _decode_chunk(self) -> None:
    active = [(i, s) for i, s in enumerate(self._slots) if s is not None]
    top_n = TOP_LOGPROBS if any(s.params.top_logprobs for _, s in active) else 0
    nb, window = self._buckets()
    if not top_n:  # the warm-up compiles no variant with top logprobs
      nb, _, window = self._shape((nb, "decode", window))
    try:
      with self._ctx():
        self._cache, self._carry, out_tok, out_lp, top = _decode_slots(
            self.decode_graphdef, self.chunk_steps, self.cache_len, nb, window, top_n,
            self.decode_state, self._cache, self._carry, self._rows)
        out_tok, out_lp = np.asarray(out_tok), np.asarray(out_lp)
        done, finish = np.asarray(self._carry["done"]), np.asarray(self._carry["finish"])
        if top is not None:
          top_id, top_lp = np.asarray(top[0]), np.asarray(top[1])
    except Exception as e:  # noqa: BLE001 - the slots' state is lost: fail their requests
      self._cache = self._carry = self._rows = None
      for g in {id(s.group): s.group for _, s in active}.values():
        self._drop_group(g, e)
      return
    self.chunks += 1
    self.decode_steps_run += int((out_tok >= 0).any(axis=0).sum())
    groups: dict[int, tuple[Group, list]] = {}
    for i, row in active:
      m = out_tok[i] >= 0
      new_t, new_l = out_tok[i][m].tolist(), out_lp[i][m].tolist()
      row.tokens += new_t
      row.logprobs += new_l
      if top is not None and row.params.top_logprobs:
        row.tops += [list(zip(ids.tolist(), lp.tolist()))
                     for ids, lp in zip(top_id[i][m], top_lp[i][m])]
      if done[i]:
        row.finish = FINISH_NAMES.get(int(finish[i]), "length")
      groups.setdefault(id(row.group), (row.group, []))[1].append((row, new_t, new_l))
    freed = []
    for group, items in groups.values():
      if group.on_chunk is not None:
        new_t = [[] for _ in group.rows]
        new_l = [[] for _ in group.rows]
        for row, t, lp in items:
          new_t[row.index], new_l[row.index] = t, lp
        try:
          stopped = group.on_chunk(new_t, new_l)
        except Exception as e:  # noqa: BLE001 - a failing callback fails its own request only
          self._drop_group(group, e)
          continue
        for k in stopped:
          row = group.rows[k]
          if row.finish is None and row.slot is not None:
            row.finish = FINISH_NAMES[FINISH_STOP]
            freed.append(row.slot)
      for row in group.rows:
        if row.finish is not None and row.slot is not None:
          self._slots[row.slot] = None
          row.slot = None
      if all(r.finish is not None for r in group.rows):
        group._complete()  # pylint: disable=protected-access
    self._mark_done(freed)

  # ------------------------------------------------------------------------ warm-up
  def warmup_plans(self, max_prompt_len: int, max_new_tokens: Sequence[int],
                   batch_sizes: Sequence[int] | None = None) -> list[tuple]:
    """The shapes requests of up to `max_prompt_len` tokens with these budgets can need,
    smallest bucket first: (prompts, "prefill", chunk, window), the prompts prefilled together
    (powers of two, at most `prefill_batch_tokens` tokens a call), and (slots, "decode",
    window)."""
    top = _pow2(self.num_slots, self.min_batch_bucket)
    sizes = sorted({min(_pow2(b, self.min_batch_bucket), self.num_slots)
                    for b in (batch_sizes or [])} or
                   {min(1 << i, self.num_slots) for i in range(top.bit_length())
                    if (1 << i) >= self.min_batch_bucket} or {self.num_slots})
    max_prompt_len = max(1, min(max_prompt_len, self.cache_len - 1))
    chunks = sorted({min(_pow2(n, self.min_prompt_bucket), self.prefill_chunk)
                     for n in range(1, max_prompt_len + 1)})
    longest = max_prompt_len + max(min(int(m), self.cache_len) for m in max_new_tokens)
    windows = sorted({_window(n + self.chunk_steps + 1, self.min_cache_len, self.cache_len)
                      for n in range(1, longest + 1)})
    spans = sorted({self._prefill_window_for(n) for n in range(1, max_prompt_len + 1)})
    most = min(self.num_slots, max(sizes))
    plans = [(u, "prefill", c, w) for c in chunks for w in spans
             for u in sorted({min(_pow2(k, 1), most) for k in range(1, most + 1)})
             if u == 1 or u * c <= self.prefill_batch_tokens]
    plans += [(b, "decode", w) for b in sizes for w in windows]
    return sorted(plans, key=lambda p: (p[0], p[1] != "prefill", p[2]))

  def warmup_plan(self, plan) -> None:
    """Compiles one warm-up shape: a prefill chunk on throw-away rows, or a decode chunk over
    the live slots with every slot marked finished (the loop runs no step; nothing changes)."""
    nb, kind, size = plan[:3]
    with self._lock, self._ctx():
      self._ensure_state()
      if kind == "prefill":
        graph, state = self._prefill_model(nb * size)
        _prefill_window(graph, plan[3], state, *self._dummy_prefill(nb, size))
      else:
        idle = dict(self._carry, done=jnp.ones_like(self._carry["done"]))
        keep_done = self._carry["done"]
        self._cache, carry, *_ = _decode_slots(
            self.decode_graphdef, self.chunk_steps, self.cache_len, nb, size, 0,
            self.decode_state, self._cache, idle, self._rows)
        self._carry = dict(carry, done=keep_done)
      self.compiled_shapes.add(tuple(plan))

  def _dummy_prefill(self, nb: int, size: int, abstract: bool = False) -> tuple:
    """The arguments after the model of a prefill call of `nb` throw-away rows x `size` tokens
    (each row one real token); with `abstract` the cache is only its shapes (nothing allocated)."""
    if abstract:
      cache = jax.tree_util.tree_map(_spec, jax.eval_shape(
          lambda: _init_cache(self.graphdef, nb, self.cache_len, self.state)))
      if self.mesh is not None:
        cache = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=self._batch_sharding(a)), cache)
    else:
      cache = _init_cache(self.graphdef, nb, self.cache_len, self.state)
      if self.mesh is not None:
        cache = jax.tree_util.tree_map(self._put_like_batch, cache)
    zeros, ones = self._put(np.zeros(nb, np.int32)), self._put(np.ones(nb, np.int32))
    return (cache, self._put(np.zeros((nb, size), np.int32)), zeros, ones, ones,
            self._put(np.zeros((nb, self.cfg.vocab_size), np.float32)))

  def compile_plan(self, plan) -> None:
    """Compiles one warm-up shape ahead of time without running it, holding the engine's lock
    only to read the live state's shapes: requests keep being served while XLA compiles (the
    server's background warm-up). The later call with that shape traces and lowers again but
    finds the executable compiled."""
    nb, kind, size = plan[:3]
    with self._lock, self._ctx():
      self._ensure_state()
      live = jax.tree_util.tree_map(lambda a: _spec(a, self.mesh is not None),
                                    (self._cache, self._carry, self._rows))
    with self._ctx():
      if kind == "prefill":
        graph, state = self._prefill_model(nb * size)
        _prefill_window.lower(graph, plan[3], state,
                              *self._dummy_prefill(nb, size, abstract=True)).compile()
      else:
        cache, carry, rows = live
        _decode_slots.lower(self.decode_graphdef, self.chunk_steps, self.cache_len, nb, size, 0,
                            self.decode_state, cache, carry, rows).compile()
    self.compiled_shapes.add(tuple(plan))  # from now on the scheduler may pick it

  def warmup(self, max_prompt_len: int, max_new_tokens: Sequence[int],
             batch_sizes: Sequence[int] | None = None) -> dict:
    t0 = time.perf_counter()
    plans = self.warmup_plans(max_prompt_len, max_new_tokens, batch_sizes)
    for plan in plans:
      self.warmup_plan(plan)
    return {"shapes": len(plans), "seconds": time.perf_counter() - t0}

