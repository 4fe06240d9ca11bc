"""The decoding engine: a preallocated cache, a jit-compiled prefill and a jit-compiled decode loop.

`Engine.generate(prompts, params, stop_ids)` works on token ids:

1. Shapes are bucketed so that compilations stay few: the batch is padded to a power of two (rows
   of padding are finished from the start), prompts are right-padded to a power of two (at least
   16), and the cache length is the smallest power of two or 1.5 x power of two that holds the
   longest prompt plus its budget (capped by the model's context): decode attention reads the
   whole cache every step, and the half-steps cut its padding from up to 50% to up to 33%.
2. Prefill runs the padded prompt through the model in chunks of at most `prefill_chunk` tokens
   (one compiled shape for every chunk of a long prompt; attention memory stays chunk x cache),
   writing the cache (slot j holds position j; padding positions write slots that the row's own
   later tokens overwrite before anything can attend to them), and keeps the logits at each row's
   last real token only (never the [B, S, V] tensor).
3. Decoding runs in chunks: each chunk is a `lax.while_loop` of up to `chunk_steps` steps
   (sample, record, feed the token back) with the cache donated, stopping early once every row is
   finished. Between chunks the host sees the new tokens: the Python layer turns them into text,
   streams them and checks stop strings, and may finish rows (`on_chunk` returns their indices).

Decode steps may run on a copy of the model laid out for decoding (`decode_layout`): "rows" is
`lwm_jax.model.decode_layout.for_decoding` (weights stored [out, in] and all experts as two
matrices, the layout in which XLA streams weights fastest on CPU), optionally in a lower precision
(`decode_dtype`, e.g. "bfloat16": half the bytes per step, logits within bfloat16 rounding of the
model's); "model" decodes with the model itself, its MoE layers switched to `decode_moe_backend`
("auto": the capacity layout on CPU with capacity factor E / k, which cannot drop anything for one
token per row because a token's k experts are distinct). `decode_layout="auto"` is "rows" on CPU
without a mesh and "model" otherwise. Prefill chunks of at most `rows_prefill_max` tokens (batch
x chunk) also run on the "rows" copy; longer ones run the model itself. Both share the cache.

Sampling is per row (penalties, temperature, top-k, top-p, min-p, seed; `sampling.logits`); the
key of step t of a row is `fold_in(fold_in(key(seed), choice), t)`, so a row's tokens do not
depend on its batch neighbours. The decode loop state carries each row's output-token counts and
its prompt's token set ([B, V]) for the penalties. Returned log-probabilities are those of the
model's raw distribution (temperature 1, no filter), with the top 20 alternatives per token when a
row asks for them (a separate compiled variant, used only then).

`warmup` compiles ahead of time the shapes requests will need (see `Engine.shapes`): compiled code
depends on (batch bucket, prefill chunk, cache length), so it runs one dummy step per such triple.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from lwm_jax import sharding
from lwm_jax.model import platform
from lwm_jax.model.decode_layout import for_decoding, resolve_dtype
from lwm_jax.sampling.logits import NEG_INF, sample_tokens  # noqa: F401 - re-exported
from lwm_jax.sampling.params import SamplingParams

TOP_LOGPROBS = 20  # alternatives per token computed when any row of a batch asks for some
FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2
FINISH_NAMES = {FINISH_STOP: "stop", FINISH_LENGTH: "length"}


def _pow2(n: int, lo: int) -> int:
  return max(lo, 1 << max(0, int(n) - 1).bit_length())


def _half_pow2(n: int, lo: int) -> int:
  """The smallest of {2^k, 3 * 2^(k-1)} >= max(n, lo)."""
  p = _pow2(n, lo)
  return 3 * p // 4 if 3 * p // 4 >= max(n, lo) and p % 4 == 0 else p


# ---------------------------------------------------------------------------------- forwards
def forward_last(model, tokens_BxS, positions_BxS, segment_ids_BxS, cache, last_B):
  """The cached forward pass, with logits only at `last_B` ([B, V] fp32) and the new cache."""
  out = model(tokens_BxS, positions_BxS, segment_ids_BxS, cache=cache, logits_at=last_B)
  return out.logits[:, 0].astype(jnp.float32), out.cache


@dataclasses.dataclass
class RowOutput:
  token_ids: list[int]
  logprobs: list[float]
  finish_reason: str
  # Per token: the TOP_LOGPROBS most likely (id, raw logprob), when the row asked for them.
  top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclasses.dataclass
class _Rows:
  """Per-row sampling settings as device arrays [B]."""
  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array
  min_p: jax.Array
  seed: jax.Array
  choice: jax.Array
  max_new: jax.Array
  stop_ids: jax.Array  # [B, K], -1 = unused
  min_new: jax.Array  # [B]: stop ids are banned until this many tokens are generated
  repetition: jax.Array
  presence: jax.Array
  frequency: jax.Array


jax.tree_util.register_dataclass(
    _Rows, data_fields=[f.name for f in dataclasses.fields(_Rows)], meta_fields=[])


class _Graph:
  """A GraphDef made hashable by a key (the model config and decode backend), for static args."""

  def __init__(self, graphdef, key: str):
    self.graphdef, self.key = graphdef, key

  def __hash__(self):
    return hash(self.key)

  def __eq__(self, other):
    return isinstance(other, _Graph) and self.key == other.key


# Module-level jitted functions with the graph definition static: engines of equal models share
# their compilations.
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _init_cache(graphdef, b: int, t: int, state):
  return nnx.merge(graphdef.graphdef, state).init_cache(b, t)


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _prefill(graphdef, state, cache, tokens_BxC, starts_B, stops_B, lengths_B, logits_BxV):
  """One prefill chunk: row i feeds its tokens at positions [starts_B[i], starts_B[i] + C); those at
  or past stops_B[i] are padding (they leave the row's state as it was). Keeps the logits of each
  row whose last prompt token (position lengths_B - 1) is a real token of this chunk (the others
  keep `logits_BxV`). Rows advance independently, so one call can carry prompts at different
  points (the continuous engine's batched prefill) or a right-padded batch (the static engine)."""
  model = nnx.merge(graphdef.graphdef, state)
  c = tokens_BxC.shape[1]
  positions = starts_B[:, None] + jnp.arange(c, dtype=jnp.int32)[None, :]
  segment_ids = (positions < stops_B[:, None]).astype(jnp.int32)
  last = jnp.maximum(lengths_B - 1, 0)
  logits, cache = forward_last(model, tokens_BxC, positions, segment_ids, cache,
                               jnp.clip(last - starts_B, 0, c - 1))
  here = (last >= starts_B) & (last < starts_B + c) & (last < stops_B)
  return cache, jnp.where(here[:, None], logits, logits_BxV)


@functools.partial(jax.jit, static_argnums=(0,))
def _prompt_seen(vocab: int, tokens_BxS, lengths_B):
  """[B, V] bool: which ids occur in each row's prompt (for the repetition penalty)."""
  b, s = tokens_BxS.shape
  real = jnp.arange(s)[None, :] < lengths_B[:, None]
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, s))
  return jnp.zeros((b, vocab), bool).at[rows, tokens_BxS].max(real)


def decode_steps(graphdef, steps: int, cache_len: int, top_n: int, state, cache, carry,
                 rows: _Rows):
  """Up to `steps` decode steps; a row also finishes when its position reaches `cache_len` - 1.
  With `top_n` > 0 each step also records the `top_n` most likely ids and their raw logprobs.
  Traced inside `_decode` here and inside the continuous engine's windowed decode."""
  model = nnx.merge(graphdef.graphdef, state)
  b = carry["pos"].shape[0]
  rows_b = jnp.arange(b)
  base = jax.vmap(lambda s, c: jax.random.fold_in(jax.random.key(s), c))(rows.seed, rows.choice)
  vocab = carry["logits"].shape[-1]
  stop_BxV = jnp.zeros((b, vocab), bool).at[
      rows_b[:, None], jnp.clip(rows.stop_ids, 0, vocab - 1)].max(rows.stop_ids >= 0)

  def cond(c):
    return (c["i"] < steps) & ~jnp.all(c["done"])

  def body(c):
    keys = jax.vmap(jax.random.fold_in)(base, c["n_gen"])
    tok, lp = sample_tokens(c["logits"], keys, rows.temperature, rows.top_k, rows.top_p,
                            rows.min_p, (c["counts"], c["seen"], rows.repetition, rows.presence,
                                         rows.frequency),
                            stop_BxV & (c["n_gen"] < rows.min_new)[:, None])
    active = ~c["done"]
    i = c["i"]
    out_tok = c["out_tok"].at[:, i].set(jnp.where(active, tok, -1))
    out_lp = c["out_lp"].at[:, i].set(lp)
    extra = {}
    if top_n:
      top_lp, top_id = jax.lax.top_k(jax.nn.log_softmax(c["logits"], axis=-1), top_n)
      extra = dict(out_top_id=c["out_top_id"].at[:, i].set(top_id),
                   out_top_lp=c["out_top_lp"].at[:, i].set(top_lp))
    counts = c["counts"].at[rows_b, tok].add(active.astype(jnp.int32))
    n_gen = c["n_gen"] + active.astype(jnp.int32)
    is_stop = jnp.any(tok[:, None] == rows.stop_ids, axis=-1)
    full = (n_gen >= rows.max_new) | (c["pos"] >= cache_len - 1)
    finish = jnp.where(active & is_stop, FINISH_STOP,
                       jnp.where(active & full, FINISH_LENGTH, c["finish"]))
    done = c["done"] | (active & (is_stop | full))
    out = model(jnp.where(done, 0, tok)[:, None], c["pos"][:, None], cache=c["cache"])
    logits, new_cache = out.logits[:, 0].astype(jnp.float32), out.cache
    pos = jnp.where(done, c["pos"], c["pos"] + 1)
    return dict(c, i=i + 1, cache=new_cache, logits=logits, pos=pos, n_gen=n_gen, done=done,
                finish=finish, out_tok=out_tok, out_lp=out_lp, counts=counts, **extra)

  init = dict(carry, i=jnp.zeros((), jnp.int32), cache=cache,
              out_tok=jnp.full((b, steps), -1, jnp.int32),
              out_lp=jnp.zeros((b, steps), jnp.float32))
  if top_n:
    init.update(out_top_id=jnp.zeros((b, steps, top_n), jnp.int32),
                out_top_lp=jnp.zeros((b, steps, top_n), jnp.float32))
  c = jax.lax.while_loop(cond, body, init)
  new_carry = {k: c[k] for k in carry}
  top = (c["out_top_id"], c["out_top_lp"]) if top_n else None
  return c["cache"], new_carry, c["out_tok"], c["out_lp"], top


_decode = jax.jit(decode_steps, static_argnums=(0, 1, 2, 3), donate_argnums=(5,))


def _copy_bytes(state, dtype: str | None) -> int:
  """Bytes of the decode copy's weights: every parameter, in `dtype` when given."""
  size = jnp.dtype(dtype).itemsize if dtype else None
  return sum(x.size * (size or x.dtype.itemsize) for x in jax.tree_util.tree_leaves(state))


def _available_memory() -> int | None:
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


class Engine:
  """Batched generation on token ids for one model (optionally sharded over `mesh`)."""

  def __init__(self, model, *, mesh: jax.sharding.Mesh | None = None, chunk_steps: int = 16,
               max_batch: int = 64, min_batch_bucket: int = 1, min_prompt_bucket: int = 16,
               min_cache_len: int = 64, prefill_chunk: int = 512,
               decode_layout: str = "auto", decode_dtype: str | None = None,
               rows_prefill_max: int = 256,
               decode_moe_backend: str | None = "auto"):
    self.cfg = model.cfg
    self.mesh = mesh if mesh is not None and mesh.size > 1 else None
    if self.mesh is not None:
      with jax.set_mesh(self.mesh):
        sharding.shard_model(model, self.mesh)
    self.model = model
    graphdef, self.state = nnx.split(model)
    key = json.dumps(self.cfg.to_dict(), sort_keys=True)
    self.graphdef = _Graph(graphdef, key)
    resolve_dtype(decode_dtype)  # a bad name fails here, before anything is sized
    if decode_layout == "auto":
      decode_layout = self._auto_layout(decode_dtype)
    if decode_layout not in ("rows", "model"):
      raise ValueError(f"decode_layout: '{decode_layout}' is not one of auto, rows, model")
    if decode_layout == "rows" and self.mesh is not None:
      raise ValueError("decode_layout 'rows' runs on one device; use 'model' with a mesh")
    if decode_dtype and decode_layout != "rows":
      raise ValueError("decode_dtype needs decode_layout 'rows' (or 'auto' on CPU)")
    self.decode_layout, self.decode_dtype = decode_layout, decode_dtype or None
    self.rows_prefill_max = rows_prefill_max
    if decode_layout == "rows":
      dgraph, self.decode_state = nnx.split(for_decoding(model, self.decode_dtype))
      self.decode_moe_backend = "rows"
      self.decode_graphdef = _Graph(dgraph, f"{key}/rows/{self.decode_dtype}")
    else:
      if decode_moe_backend == "auto":
        # Measured on CPU (benchmarks/sampling.py): the dropless capacity layout beats sorting
        # into blocks for decode batches up to at least 8.
        decode_moe_backend = "capacity" if platform.is_cpu() else None
      self.decode_moe_backend = decode_moe_backend or self.cfg.moe_backend
      self.decode_state = self.state
      self.decode_graphdef = _Graph(
          self._graphdef_with_backend(model, graphdef, decode_moe_backend),
          f"{key}/{decode_moe_backend}")
    self.context = self.cfg.max_position_embeddings
    self.chunk_steps, self.max_batch = chunk_steps, max_batch
    self.min_batch_bucket = min_batch_bucket
    self.prefill_chunk = max(prefill_chunk, min_prompt_bucket)
    self.min_prompt_bucket, self.min_cache_len = min_prompt_bucket, min_cache_len

  def set_params(self, params) -> None:
    """Decodes with `params` (an `nnx.State` shaped like the model's) from now on, used in place:
    no copy. Only with decode_layout "model", where decoding reads the model's own arrays."""
    if self.decode_layout != "model":
      raise ValueError("set_params: needs decode_layout 'model' (the 'rows' layout decodes with "
                       "a converted copy of the weights)")
    self.state = self.decode_state = params

  def _auto_layout(self, decode_dtype: str | None) -> str:
    """"rows" on CPU without a mesh when two copies of the weights fit in available memory
    (measured on CPU, benchmarks/sampling.py: 1.2-1.3x the capacity backend's tokens/s at batch 8
    in fp32), else "model"."""
    if not platform.is_cpu() or self.mesh is not None:
      return "model"
    need, free = _copy_bytes(self.state, decode_dtype), _available_memory()
    if free is None or 2 * need < free:
      return "rows"
    logging.warning("decode_layout auto: the decode copy (%.1f GB) does not fit twice in the "
                    "%.1f GB of available memory; decoding with the model itself",
                    need / 1e9, free / 1e9)
    return "model"

  def _graphdef_with_backend(self, model, graphdef, backend):
    """The graph definition with the MoE layers switched to `backend` for decode steps.

    "capacity" gets capacity factor E / k: a decode step routes one token per row and a token's
    top-k experts are distinct, so no expert receives more than B rows and nothing is dropped."""
    if not backend:
      return graphdef
    moes = [layer.mlp.experts for layer in model.layers if layer.is_moe]
    old = [(m.backend, m.capacity_factor) for m in moes]
    for m in moes:
      m.backend = backend
      if backend == "capacity":
        m.capacity_factor = self.cfg.num_experts / self.cfg.num_experts_per_tok
    graphdef, _ = nnx.split(model)
    for m, (b, cf) in zip(moes, old):
      m.backend, m.capacity_factor = b, cf
    return graphdef

  def _prefill_model(self, rows: int):
    """(graph, state) for a prefill chunk of `rows` tokens: the decode copy when it is laid out
    by rows and the chunk is small enough for weight streaming to dominate (measured on CPU for
    `small`: 1.6x faster at 8 x 16 tokens in bfloat16, even at 8 x 128), else the model."""
    if self.decode_layout == "rows" and rows <= self.rows_prefill_max:
      return self.decode_graphdef, self.decode_state
    return self.graphdef, self.state

  # ------------------------------------------------------------------------ host side
  def _put(self, x: np.ndarray):
    if self.mesh is None:
      return jnp.asarray(x)
    return jax.device_put(x, NamedSharding(self.mesh, sharding.batch_spec(x.shape[0], self.mesh,
                                                                           x.ndim)))

  def check_prompt(self, n_tokens: int) -> None:
    if n_tokens < 1:
      raise ValueError("prompt: empty (at least one token is needed)")
    if n_tokens >= self.context:
      raise ValueError(f"prompt: {n_tokens} tokens do not fit the model's context of "
                       f"{self.context} (max_position_embeddings) with room to generate")

  def shapes(self, lengths: Sequence[int], max_new: Sequence[int]) -> tuple[int, int, int, int]:
    """(batch, padded prompt, prefill chunk, cache length) buckets for rows of these prompt
    lengths and token budgets (budgets already cut to the context)."""
    b = _pow2(len(lengths), self.min_batch_bucket)
    longest = int(max(lengths))
    s = _pow2(longest, self.min_prompt_bucket)
    if s > self.prefill_chunk:  # long prompts: whole chunks, run one after another
      s = -(-longest // self.prefill_chunk) * self.prefill_chunk
    chunk = min(s, self.prefill_chunk)
    t = min(_half_pow2(max(int(x) + int(y) for x, y in zip(lengths, max_new)),
                       self.min_cache_len), self.context)
    return b, s, chunk, t

  def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
               stop_ids: Sequence[Sequence[int]], choices: Sequence[int] | None = None,
               on_chunk: Callable[[list[list[int]], list[list[float]]], Sequence[int]] | None
               = None) -> list[RowOutput]:
    """Generates one sequence per prompt. `on_chunk(new_tokens, new_logprobs)` is called after
    each decode chunk with each row's new tokens and returns indices of rows to finish now
    ("stop"); those rows keep the tokens seen so far."""
    n = len(prompts)
    if n == 0:
      return []
    if n > self.max_batch:
      out: list[RowOutput] = []
      for s in range(0, n, self.max_batch):
        sl = slice(s, s + self.max_batch)
        ch = None if choices is None else choices[sl]
        sub_cb = None
        if on_chunk is not None:
          sub_cb = functools.partial(_offset_cb, on_chunk, s, n)
        out += self.generate(prompts[sl], params[sl], stop_ids[sl], ch, sub_cb)
      return out
    for p in prompts:
      self.check_prompt(len(p))
    lengths = [len(p) for p in prompts]
    max_new = [min(sp.max_new_tokens, self.context - len(p)) for sp, p in zip(params, prompts)]
    b, s, chunk, t = self.shapes(lengths, max_new)
    top_n = TOP_LOGPROBS if any(p.top_logprobs for p in params) else 0
    return self._run(prompts, params, stop_ids, choices, max_new, (b, s, chunk, t), top_n,
                     on_chunk)

  def warmup(self, max_prompt_len: int, max_new_tokens: Sequence[int],
             batch_sizes: Sequence[int] | None = None) -> dict:
    """Compiles, before any request, the shapes that requests of up to `max_prompt_len` tokens
    with these token budgets can need, for every batch bucket up to `max_batch` (or the given
    batch sizes). Each shape runs once on dummy rows that stop after one step. Returns the
    number of shapes and the seconds it took; a request outside these compiles on first use."""
    import time  # pylint: disable=import-outside-toplevel
    t0 = time.perf_counter()
    plans = self.warmup_plans(max_prompt_len, max_new_tokens, batch_sizes)
    for plan in plans:
      self.warmup_plan(plan)
    return {"shapes": len(plans), "seconds": time.perf_counter() - t0}

  def warmup_plans(self, max_prompt_len: int, max_new_tokens: Sequence[int],
                   batch_sizes: Sequence[int] | None = None) -> list[tuple[int, int, int]]:
    """The (batch, prefill chunk, cache length) shapes `warmup` compiles, smallest batch first
    (a lone request's shapes are the commonest), then by cache length."""
    if batch_sizes is None:
      top, batch_sizes, x = _pow2(self.max_batch, self.min_batch_bucket), [], self.min_batch_bucket
      while x <= top:
        batch_sizes.append(x)
        x *= 2
    plans = set()
    max_prompt_len = max(1, min(max_prompt_len, self.context - 1))
    for n in batch_sizes:
      for length in range(1, max_prompt_len + 1):
        for m in max_new_tokens:
          room = min(int(m), self.context - length)
          b, s, chunk, t = self.shapes([length] * n, [room])
          plans.add((n, chunk, t))  # compiled code depends on (batch, chunk, cache length)
    return sorted(plans, key=lambda p: (p[0], p[2], p[1]))

  def warmup_plan(self, plan: tuple[int, int, int]) -> None:
    """Compiles (and runs once, on dummy rows that stop after one step) one warm-up shape."""
    n, chunk, t = plan
    self._run([[0] * chunk] * n, [SamplingParams(temperature=0, max_new_tokens=1)] * n,
              [[]] * n, None, [1] * n, self.shapes([chunk] * n, [1]), 0, None, cache_len=t)

  def _run(self, prompts, params, stop_ids, choices, max_new, shapes, top_n, on_chunk,
           cache_len: int | None = None) -> list[RowOutput]:
    n = len(prompts)
    b, s, chunk, t = shapes
    t = cache_len or t
    lengths = np.array([len(p) for p in prompts], np.int32)
    tokens = np.zeros((b, s), np.int32)
    for i, p in enumerate(prompts):
      tokens[i, :len(p)] = p
    len_b = np.ones(b, np.int32)
    len_b[:n] = lengths
    k = max([len(x) for x in stop_ids] + [1])
    stop_arr = np.full((b, k), -1, np.int32)
    for i, ids in enumerate(stop_ids):
      stop_arr[i, :len(ids)] = list(ids)
    pad = [SamplingParams()] * (b - n)
    allp = list(params) + pad
    ch = np.zeros(b, np.int32)
    if choices is not None:
      ch[:n] = choices
    vocab = self.cfg.vocab_size

    def f32(field):
      return self._put(np.array([getattr(p, field) for p in allp], np.float32))

    rows = _Rows(
        temperature=f32("temperature"),
        top_k=self._put(np.array([min(p.top_k, vocab) for p in allp], np.int32)),
        top_p=f32("top_p"), min_p=f32("min_p"),
        seed=self._put(np.array([p.seed % (2 ** 31) for p in allp], np.int32)),
        choice=self._put(ch),
        max_new=self._put(np.concatenate([np.array(max_new, np.int32),
                                          np.ones(b - n, np.int32)])),
        stop_ids=self._put(stop_arr),
        min_new=self._put(np.array([p.min_tokens for p in allp], np.int32)),
        repetition=f32("repetition_penalty"),
        presence=f32("presence_penalty"), frequency=f32("frequency_penalty"))
    done = np.zeros(b, bool)
    done[n:] = True
    ctx = jax.set_mesh(self.mesh) if self.mesh is not None else _nullcontext()
    with ctx:
      cache = _init_cache(self.graphdef, b, t, self.state)
      if self.mesh is not None:
        cache = jax.tree_util.tree_map(self._put_like_batch, cache)
      logits = self._put(np.zeros((b, vocab), np.float32))
      for start in range(0, s, chunk):
        cache, logits = _prefill(*self._prefill_model(b * chunk), cache,
                                 self._put(tokens[:, start:start + chunk]),
                                 self._put(np.full(b, start, np.int32)), self._put(len_b),
                                 self._put(len_b), logits)
      carry = dict(logits=logits, pos=self._put(len_b), n_gen=self._put(np.zeros(b, np.int32)),
                   done=self._put(done), finish=self._put(np.zeros(b, np.int32)),
                   counts=self._put(np.zeros((b, vocab), np.int32)),
                   seen=_prompt_seen(vocab, self._put(tokens), self._put(len_b)))
      toks: list[list[int]] = [[] for _ in range(n)]
      lps: list[list[float]] = [[] for _ in range(n)]
      tops: list[list] = [[] for _ in range(n)]
      finish = np.zeros(b, np.int32)
      while True:
        cache, carry, out_tok, out_lp, top = _decode(self.decode_graphdef, self.chunk_steps, t,
                                                     top_n, self.decode_state, cache, carry, rows)
        out_tok, out_lp = np.asarray(out_tok), np.asarray(out_lp)
        if top is not None:
          top_id, top_lp = np.asarray(top[0]), np.asarray(top[1])
        new_t, new_l = [], []
        for i in range(n):
          m = out_tok[i] >= 0
          new_t.append(out_tok[i][m].tolist())
          new_l.append(out_lp[i][m].tolist())
          toks[i] += new_t[-1]
          lps[i] += new_l[-1]
          if top is not None and params[i].top_logprobs:
            tops[i] += [list(zip(ids.tolist(), lp.tolist()))
                        for ids, lp in zip(top_id[i][m], top_lp[i][m])]
        done = np.asarray(carry["done"]).copy()
        finish = np.asarray(carry["finish"]).copy()
        if on_chunk is not None:
          stopped = [i for i in on_chunk(new_t, new_l) if not done[i]]
          if stopped:
            done[stopped] = True
            finish[stopped] = FINISH_STOP
            carry = dict(carry, done=self._put(done), finish=self._put(finish))
        if done.all():
          break
    return [RowOutput(toks[i], lps[i], FINISH_NAMES.get(int(finish[i]), "length"),
                      tops[i] if params[i].top_logprobs else None)
            for i in range(n)]

  def _batch_sharding(self, x) -> NamedSharding:
    """How an array with a leading batch axis (a cache, a row table) lies on the mesh."""
    return NamedSharding(self.mesh, sharding.batch_spec(x.shape[0], self.mesh, len(x.shape)))

  def _put_like_batch(self, x):
    return jax.device_put(x, self._batch_sharding(x))


def _offset_cb(cb, offset, total, new_t, new_l):
  """Adapts a whole-batch `on_chunk` callback to a sub-batch starting at `offset`."""
  pad_t = [[] for _ in range(total)]
  pad_l = [[] for _ in range(total)]
  pad_t[offset:offset + len(new_t)] = new_t
  pad_l[offset:offset + len(new_l)] = new_l
  return [i - offset for i in cb(pad_t, pad_l) if offset <= i < offset + len(new_t)]


class _nullcontext:
  def __enter__(self):
    return self

  def __exit__(self, *a):
    return False
