"""The continuous-batching engine: interleaved requests in reused slots get exactly what each gets
alone (the static engine, itself checked against a no-cache reference in test_sampling.py), also
on the hybrid model whose slots hold recurrent state; forked prompt prefixes, prefix-cache hits and
prompts prefilled together from different positions give what separate prefills give; the prefix cache stays within its byte bound; a streaming client
that disconnects frees its slot."""
from __future__ import annotations

import os
import threading
import time

import httpx
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.background import BackgroundServer
from lwm_jax.sampling.continuous import ContinuousEngine
from lwm_jax.sampling.engine import Engine
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.prefix_cache import PrefixCache
from lwm_jax.sampling.sampler import Sampler
from lwm_jax.sampling.server import create_app
from tests.test_sampling import _full_logprobs

SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                       "world_model")
# One compiled shape each: prompts of at most 16 tokens, one 64-position window, fixed slot bucket.
SHAPES = dict(min_prompt_bucket=16, prefill_chunk=16, min_cache_len=64, chunk_steps=4)


@pytest.fixture(scope="module")
def tiny():
  return Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))


def _alone(model, prompt, sp, stop_ids=()):
  return Engine(model, **SHAPES, min_batch_bucket=1).generate([prompt], [sp], [list(stop_ids)])[0]


# Slots of 128 positions, attention windows of 64: (3 slots, bucket 4) decodes every slot in each
# chunk; (4 slots, bucket 1) decodes only the first one or two slots while the others are idle.
@pytest.mark.parametrize("num_slots,bucket", [
    (3, 4), pytest.param(4, 1, marks=pytest.mark.slow)], ids=["all_slots", "slot_buckets"])
def test_interleaved_requests_in_reused_slots_equal_each_alone(tiny, num_slots, bucket):
  rng = np.random.default_rng(0)
  n = 9
  prompts = [rng.integers(0, 512, size=int(k)).tolist() for k in rng.integers(2, 17, size=n)]
  budgets = [int(b) for b in rng.integers(1, 30, size=n)]
  params = [SamplingParams(temperature=0, max_new_tokens=b) for b in budgets]
  params[2] = SamplingParams(temperature=0, max_new_tokens=20, repetition_penalty=1.3,
                             presence_penalty=0.5, frequency_penalty=0.4)
  stops = [[] for _ in range(n)]
  want = [_alone(tiny, p, sp) for p, sp in zip(prompts, params)]
  stops[5] = [want[5].token_ids[3]]  # this row must now stop at its 4th token
  params[5] = SamplingParams(temperature=0, max_new_tokens=budgets[5] + 8, min_tokens=2)
  want[5] = _alone(tiny, prompts[5], params[5], stops[5])
  assert want[5].finish_reason == "stop"

  eng = ContinuousEngine(tiny, **SHAPES, num_slots=num_slots, min_batch_bucket=bucket,
                         cache_len=128)
  assert eng.context == 128
  groups = [eng.submit(prompts[:2], params[:2], stops[:2])]
  eng.step()  # the first two decode while the others have not arrived yet
  groups.append(eng.submit(prompts[2:5], params[2:5], stops[2:5]))
  eng.step()
  eng.step()
  groups += [eng.submit([p], [sp], [st]) for p, sp, st in zip(prompts[5:], params[5:], stops[5:])]
  while not all(g.finished for g in groups):
    eng.step()
  got = [o for g in groups for o in g.wait()]
  assert eng.prefills == n and eng.num_slots == num_slots  # nine requests through few slots
  for w, g in zip(want, got):
    assert g.token_ids == w.token_ids
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-4)
    assert g.finish_reason == w.finish_reason
  assert eng.running() == 0 and not eng.busy()


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_hybrid_slots_carry_recurrent_state():
  """Gated DeltaNet layers: a slot's conv/recurrent state is inserted with its KV; checked against
  the no-cache reference (whole sequence through the model, argmax, append)."""
  model = Transformer(get_preset("tiny_hybrid"), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  prompts = [rng.integers(0, model.cfg.vocab_size, size=k).tolist() for k in (5, 14, 9)]
  budgets = (8, 3, 6)
  eng = ContinuousEngine(model, **SHAPES, num_slots=2, min_batch_bucket=2, cache_len=64,
                         prefix_cache_mb=0)
  got = eng.generate(prompts, [SamplingParams(temperature=0, max_new_tokens=b) for b in budgets],
                     [[]] * 3)  # the third enters a slot a finished row left
  for p, b, g in zip(prompts, budgets, got):
    seq = np.zeros((1, 32), np.int32)
    seq[0, :len(p)] = p
    n = len(p)
    assert len(g.token_ids) == b
    for i in range(b):
      lp = np.asarray(_full_logprobs(model, jnp.asarray(seq))[0, n - 1])
      assert g.token_ids[i] == int(np.argmax(lp))
      assert abs(g.logprobs[i] - lp.max()) < 1e-4
      seq[0, n] = g.token_ids[i]
      n += 1


def test_forked_prefix_and_cache_hits_equal_separate_prefills(tiny):
  rng = np.random.default_rng(2)
  system = rng.integers(0, 512, size=32).tolist()  # two 16-token blocks
  prompt = system + [7, 8, 9]
  sampled = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3, top_logprobs=2)
  # Separate prefills: one slot, no prefix cache, each choice on its own.
  sep = ContinuousEngine(tiny, **SHAPES, num_slots=1, min_batch_bucket=1, cache_len=64,
                         prefix_cache_mb=0)
  want = [sep.generate([prompt], [sampled], [[]], choices=[c])[0] for c in range(4)]
  assert sep.prefills == 4 and len({tuple(w.token_ids) for w in want}) > 1
  # Forked: the four choices of one request share one prefill.
  eng = ContinuousEngine(tiny, **SHAPES, num_slots=4, min_batch_bucket=4, cache_len=64)
  got = eng.generate([prompt] * 4, [sampled] * 4, [[]] * 4, choices=[0, 1, 2, 3])
  assert eng.prefills == 1 and eng.forked_rows == 3 and eng.prefill_tokens == len(prompt)
  for w, g in zip(want, got):
    assert g.token_ids == w.token_ids
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    assert [[i for i, _ in t] for t in g.top_logprobs] == [[i for i, _ in t]
                                                          for t in w.top_logprobs]
  # Another prompt with the same 32-token system prompt: only its own tokens are prefilled.
  other = system + [11, 12, 13, 14, 15]
  greedy = SamplingParams(temperature=0, max_new_tokens=10)
  before = eng.prefill_tokens
  hit = eng.generate([other], [greedy], [[]])[0]
  assert eng.prefill_tokens - before == 5
  assert eng.prefix_cache.stats()["hits"] == 1
  ref = sep.generate([other], [greedy], [[]])[0]
  assert hit.token_ids == ref.token_ids
  np.testing.assert_allclose(hit.logprobs, ref.logprobs, atol=1e-4)


def _batched_prefill_case(model):
  """Seven prompts admitted at once. Wave 1 prefills the fresh ones: three of similar length
  share a call of 32-token chunks, two of them stopping at their 16-token snapshot point while
  the third runs on (their rows idle on padding for the rest of that call). The three that share a
  48-token system prompt with the fourth wait for the snapshot it stores, restore it, and share
  one call from position 48 (one of them passes a snapshot point at 64)."""
  rng = np.random.default_rng(4)
  vocab = model.cfg.vocab_size
  system = rng.integers(0, vocab, size=48).tolist()  # three 16-token blocks
  other = rng.integers(0, vocab, size=20).tolist()
  prompts = [system + rng.integers(0, vocab, size=k).tolist() for k in (3, 12, 20, 14)]
  prompts += [other + [1, 2], rng.integers(0, vocab, size=26).tolist(),
              rng.integers(0, vocab, size=14).tolist()]
  greedy = SamplingParams(temperature=0, max_new_tokens=6)
  want = [_alone(model, p, greedy) for p in prompts]
  eng = ContinuousEngine(model, **dict(SHAPES, prefill_chunk=32), num_slots=8,
                         min_batch_bucket=8, cache_len=128, prefill_batch_tokens=128)
  got = eng.generate(prompts, [greedy] * 7, [[]] * 7)
  for w, g in zip(want, got):
    assert g.token_ids == w.token_ids
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-4)
  assert eng.prefills == 7 and eng.prefill_batches == 3
  assert eng.prefix_cache.stats()["hits"] == 3
  assert eng.prefill_tokens == 51 + 22 + 26 + 14 + 12 + 20 + 14
  # The snapshots stored from inside batched calls serve later prompts correctly.
  for later in (other[:16] + [5, 6, 7, 8], prompts[2][:64] + [9, 9]):
    before = eng.prefill_tokens
    hit = eng.generate([later], [greedy], [[]])[0]
    assert eng.prefill_tokens - before == len(later) - (16 if len(later) < 64 else 64)
    ref = _alone(model, later, greedy)
    assert hit.token_ids == ref.token_ids
    np.testing.assert_allclose(hit.logprobs, ref.logprobs, atol=1e-4)


@pytest.mark.slow  # heavy (over 10 s): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_batched_prefill_at_different_points_equals_each_alone(tiny):
  _batched_prefill_case(tiny)


@pytest.mark.slow  # the hybrid model compiles slowly: `make test-slow`
def test_batched_prefill_on_the_hybrid_model_equals_each_alone():
  """The same on Gated DeltaNet layers, where a row's recurrent state must stand still on the
  padding of a shared call and restore from a snapshot."""
  _batched_prefill_case(Transformer(get_preset("tiny_hybrid"), rngs=nnx.Rngs(0)))


def test_shapes_compiled_ahead_of_time_are_not_compiled_again(caplog):
  """The server's background warm-up compiles shapes without running them (`compile_plan`, no
  engine lock held while XLA works); the requests that later use those shapes find them
  compiled. A model of its own (vocabulary 640) keeps other tests' compilations out."""
  import dataclasses
  import logging
  import jax
  model = Transformer(dataclasses.replace(get_preset("tiny"), vocab_size=640), rngs=nnx.Rngs(0))
  eng = ContinuousEngine(model, **SHAPES, num_slots=2, min_batch_bucket=2, cache_len=64,
                         prefix_cache_mb=0)
  for plan in [(2, "prefill", 16, 64), (2, "decode", 64)]:
    assert plan in eng.warmup_plans(16, [8])
    eng.compile_plan(plan)
  assert eng.running() == 0 and not eng.busy()  # nothing ran
  rng = np.random.default_rng(5)
  prompts = [rng.integers(0, 640, size=k).tolist() for k in (9, 14)]
  greedy = SamplingParams(temperature=0, max_new_tokens=8)
  jax.config.update("jax_log_compiles", True)
  try:
    with caplog.at_level(logging.WARNING):
      got = eng.generate(prompts, [greedy] * 2, [[]] * 2)
  finally:
    jax.config.update("jax_log_compiles", False)
  compiled = [r.getMessage() for r in caplog.records if "compil" in r.getMessage()]
  assert any("_insert_rows" in m for m in compiled), compiled  # the log does name what compiles
  assert not [m for m in compiled if "_prefill" in m or "_decode_slots" in m], compiled
  for p, g in zip(prompts, got):
    assert g.token_ids == _alone(model, p, greedy).token_ids


def test_until_the_warm_up_is_done_calls_run_in_larger_compiled_shapes(caplog):
  """While the server's background warm-up compiles (`reuse_larger_shapes`), a call whose own
  shape is not compiled runs in the smallest compiled one that holds it (a larger chunk, window
  or slot bucket: padding only), so a first request never waits for XLA; afterwards calls take
  their own shapes again. A model of its own (vocabulary 576) keeps other tests' compilations
  out."""
  import dataclasses
  import logging
  import jax
  model = Transformer(dataclasses.replace(get_preset("tiny"), vocab_size=576), rngs=nnx.Rngs(0))
  eng = ContinuousEngine(model, **SHAPES, num_slots=2, min_batch_bucket=1, cache_len=128,
                         prefix_cache_mb=0)
  for plan in [(1, "prefill", 16, 128), (2, "decode", 128)]:  # the largest of each kind
    eng.compile_plan(plan)
  rng = np.random.default_rng(6)
  prompt = rng.integers(0, 576, size=9).tolist()  # alone: prefill (1, 16, 64), decode (1, 64)
  greedy = SamplingParams(temperature=0, max_new_tokens=8)

  def run():
    jax.config.update("jax_log_compiles", True)
    caplog.clear()
    try:
      with caplog.at_level(logging.WARNING):
        got = eng.generate([prompt], [greedy], [[]])[0]
    finally:
      jax.config.update("jax_log_compiles", False)
    assert got.token_ids == _alone(model, prompt, greedy).token_ids
    return [r.getMessage() for r in caplog.records if "compil" in r.getMessage()
            and ("_prefill" in r.getMessage() or "_decode_slots" in r.getMessage())]

  eng.reuse_larger_shapes = True
  assert run() == []
  reused = eng.reused_shapes
  assert reused == 1 + eng.chunks == eng.stats()["reused_shapes"]  # the prefill, each chunk
  eng.reuse_larger_shapes = False
  own = run()  # its own shapes now: compiled on the spot
  assert any("_prefill" in m for m in own) and any("_decode_slots" in m for m in own), own
  assert eng.reused_shapes == reused
  assert {(1, "prefill", 16, 64), (1, "decode", 64)} <= eng.compiled_shapes


def test_new_parameters_never_meet_cached_prefixes_of_the_old(tiny):
  # RL hands the engine the live policy after every update: a cached system prompt's keys and
  # values from the old weights must not be restored under the new ones.
  rng = np.random.default_rng(5)
  prompt = rng.integers(0, 512, size=35).tolist()  # two 16-token blocks are cached
  greedy = SamplingParams(temperature=0, max_new_tokens=8)
  eng = ContinuousEngine(tiny, **SHAPES, num_slots=2, min_batch_bucket=2, cache_len=64,
                         decode_layout="model")
  eng.generate([prompt], [greedy], [[]])
  assert len(eng.prefix_cache) > 0
  moved = nnx.state(Transformer(get_preset("tiny"), rngs=nnx.Rngs(9)))
  eng.set_params(moved)
  assert len(eng.prefix_cache) == 0
  got = eng.generate([prompt], [greedy], [[]])[0]
  fresh = ContinuousEngine(Transformer(get_preset("tiny"), rngs=nnx.Rngs(9)), **SHAPES,
                           num_slots=2, min_batch_bucket=2, cache_len=64, prefix_cache_mb=0,
                           decode_layout="model")
  want = fresh.generate([prompt], [greedy], [[]])[0]
  assert got.token_ids == want.token_ids
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


def test_prefix_cache_bound_and_lru_eviction():
  state = lambda v: [{"k": np.full((1, 2, 16, 4), v, np.float32)}]  # noqa: E731 - 512 bytes
  cache = PrefixCache(max_bytes=3 * 512, block=4)
  ids = [[i] * 8 for i in range(6)]
  for i in range(3):
    assert cache.store(cache.keys(ids[i])[-1], ids[i], state(i))
  assert cache.lookup(ids[0] + [99], 8)[0] == 8  # touching 0 makes 1 the oldest
  assert cache.store(cache.keys(ids[3])[-1], ids[3], state(3))
  assert cache.bytes <= cache.max_bytes and len(cache) == 3 and cache.evicted == 1
  assert cache.lookup(ids[1], 8) == (0, None)
  assert cache.lookup(ids[0], 8)[1].state[0]["k"][0, 0, 0, 0] == 0
  big = [{"k": np.zeros((1, 2, 64, 4), np.float32)}]  # 2 KiB: larger than the bound
  assert not cache.store(cache.keys(ids[4])[-1], ids[4], big)
  assert len(cache) == 3 and cache.too_large == 1
  with pytest.raises(ValueError, match="block"):
    PrefixCache(1024, block=0)


def test_engine_prefix_cache_stays_within_its_bound(tiny):
  eng = ContinuousEngine(tiny, **SHAPES, num_slots=2, min_batch_bucket=2, cache_len=64)
  rng = np.random.default_rng(3)
  sp = SamplingParams(temperature=0, max_new_tokens=2)
  eng.generate([rng.integers(0, 512, size=20).tolist()], [sp], [[]])
  one = eng.prefix_cache.bytes  # a 20-token prompt stores its first 16-token block
  assert one > 0 and len(eng.prefix_cache) == 1
  eng.prefix_cache.max_bytes = 3 * one  # room for three snapshots
  for _ in range(5):
    eng.generate([rng.integers(0, 512, size=20).tolist()], [sp], [[]])
    assert eng.prefix_cache.bytes <= eng.prefix_cache.max_bytes
  st = eng.prefix_cache.stats()
  assert st["stored"] == 6 and st["evicted"] == 3 and st["entries"] == 3


def test_bad_engine_options_are_clear_errors(tiny):
  with pytest.raises(ValueError, match="cache_len"):
    ContinuousEngine(tiny, cache_len=10 ** 6)
  with pytest.raises(ValueError, match="engine"):
    Sampler(Transformer(get_preset("tiny", vocab_size=2048), rngs=nnx.Rngs(0)),
            load_tokenizer(SHIPPED), engine="paged")
  eng = ContinuousEngine(tiny, **SHAPES, cache_len=64)
  with pytest.raises(ValueError, match="context"):
    eng.submit([[1] * 64], [SamplingParams()], [[]])


def test_cancelling_a_streaming_client_frees_its_slot():
  tok = load_tokenizer(SHIPPED)
  model = Transformer(get_preset("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
  # Slots of 512 positions: whatever the chat prompt's length, the reply's budget stays far
  # above the two chunks decoded before the hold.
  sampler = Sampler(model, tok, num_slots=2, min_batch_bucket=2, cache_len=512,
                    min_prompt_bucket=64, prefill_chunk=64, min_cache_len=512, chunk_steps=2)
  eng = sampler.engine
  # The engine decodes two chunks, then holds before the third until the test lets it go, so a
  # busy host cannot finish the whole reply before the client has gone (the reply is greedy
  # from fixed weights: its first text always comes within those two chunks).
  release, cancelled = threading.Event(), threading.Event()
  decode_chunk, cancel = eng._decode_chunk, eng.cancel

  def held_decode_chunk():
    if eng.chunks >= 2:
      assert release.wait(120), "the test never released the engine"
    decode_chunk()

  def noted_cancel(group):
    cancel(group)
    cancelled.set()

  eng._decode_chunk, eng.cancel = held_decode_chunk, noted_cancel
  app = create_app(sampler, "m")
  body = {"model": "m", "messages": [{"role": "user", "content": "ls"}], "max_tokens": 200,
          "temperature": 0, "ignore_eos": True, "stream": True}
  with BackgroundServer(app) as server:
    try:
      with httpx.Client(timeout=300) as client:
        with client.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
          assert r.status_code == 200
          chunks = 0
          for line in r.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 2:
              break  # the first text after the role chunk: the row is decoding in a slot
          deadline = time.monotonic() + 10
          while eng.running() != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
          rows = [(r.finish, len(r.tokens), r.max_new, len(r.prompt)) for r in eng._slots if r]
          assert eng.running() == 1, (eng.stats(), rows)
      # The client is gone; the server notices and cancels the group while the engine holds.
      assert cancelled.wait(120), "the server never cancelled the departed client's rows"
    finally:
      release.set()
    deadline = time.monotonic() + 120
    while eng.running() and time.monotonic() < deadline:
      time.sleep(0.05)
    assert eng.running() == 0 and eng.waiting() == 0
    assert eng.decode_steps_run <= 3 * 2  # two chunks, the held one, then the slot was freed
    r = httpx.post(server.url + "/v1/chat/completions", timeout=300,
                   json=dict(body, stream=False, max_tokens=3))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert "lwm:prefix_cache_hit_rate" in httpx.get(server.url + "/metrics").text
