"""The decode-layout copy of a model (`lwm_jax.model.decode_layout`): in fp32 it equals the model,
in bfloat16 it stays within rounding of it (and a copy with a wrong layout does not), and the
engine decodes with it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lwm_jax.model.config import get_preset
from lwm_jax.model.decode_layout import for_decoding
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.engine import Engine
from lwm_jax.sampling.params import SamplingParams

PRESETS = [("tiny", {}), ("tiny", {"tie_word_embeddings": True}),
           pytest.param("tiny_hybrid", {}, marks=pytest.mark.slow)]  # hybrid twins: test-slow


@nnx.jit
def _forward(model, tokens, positions, cache):
  out = model(tokens, positions, cache=cache)
  return out.logits, out.cache


def _cached_logits(model, copy, tokens, prompt: int):
  """Logits at every position: the first `prompt` tokens prefilled by `model`, the rest decoded one
  at a time by `copy`, through one cache."""
  b, s = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(prompt), (b, prompt))
  logits, cache = _forward(model, tokens[:, :prompt], pos, model.init_cache(b, 32))
  out = [logits]
  for t in range(prompt, s):
    logits, cache = _forward(copy, tokens[:, t:t + 1], jnp.full((b, 1), t, jnp.int32), cache)
    out.append(logits)
  return jnp.concatenate(out, axis=1)


@nnx.jit
def _logits(model, tokens):
  """No-cache reference logits; one compiled function for the whole file (a jit made inside each
  call would compile the same model again every time)."""
  return model(tokens).logits


def _relative_error(model, copy, seed=1, batch=3):
  """Largest logit difference from the model's no-cache forward, relative to the largest logit."""
  tokens = jax.random.randint(jax.random.key(seed), (batch, 12), 0, model.cfg.vocab_size)
  ref = _logits(model, tokens)
  got = _cached_logits(model, copy, tokens, prompt=4)
  return float(jnp.abs(got - ref).max() / jnp.abs(ref).max())


@pytest.mark.parametrize("preset,overrides", PRESETS)
def test_fp32_copy_equals_model(preset, overrides):
  model = Transformer(get_preset(preset, **overrides), rngs=nnx.Rngs(0))
  copy = for_decoding(model)
  assert _relative_error(model, copy) < 2e-6
  # A layout mistake is visible at this tolerance (here 1e4 times above it).
  assert _relative_error(model, _swap_gate_up(for_decoding(model))) > 1e-3
  # The copy is separate: the model keeps its training layout.
  attn = next(layer.self_attn for layer in model.layers if layer.kind != "linear_attention")
  assert not attn.q_proj.transposed and attn.q_proj.kernel.shape[0] == model.cfg.hidden_size
  assert hasattr(next(layer.mlp.experts for layer in model.layers if layer.is_moe), "gate_proj")
  assert not model.decode_layout and copy.decode_layout


def test_fp32_copy_with_few_rows_runs_only_the_chosen_experts(monkeypatch):
  """Batch 1 of `tiny` (2 of 8 experts a row) takes the per-assignment path of the `rows`
  backend (any step of at most E/2 assignments does); it equals the model as the all-experts
  path does, and a layout mistake shows."""
  from lwm_jax.model import moe
  calls = []
  chosen = moe.chosen_rows_moe
  monkeypatch.setattr(moe, "chosen_rows_moe", lambda *a: calls.append(a[0].shape) or chosen(*a))
  model = Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))
  assert _relative_error(model, for_decoding(model), batch=1) < 2e-6
  assert calls and all(shape[0] == 1 for shape in calls)
  assert _relative_error(model, _swap_gate_up(for_decoding(model)), batch=1) > 1e-3


def _swap_gate_up(copy):
  """A deliberately wrong layout: gate and up rows exchanged in every MoE layer."""
  e = copy.cfg.num_experts
  for layer in copy.layers:
    if layer.is_moe:
      w = layer.mlp.experts.gate_up_rows[...]
      layer.mlp.experts.gate_up_rows = nnx.Param(
          w.reshape(e, 2, -1, w.shape[-1])[:, ::-1].reshape(w.shape))
  return copy


@pytest.mark.parametrize("preset,overrides", PRESETS)
def test_bfloat16_copy_within_rounding(preset, overrides):
  """Measured: 0.2-0.35% of the largest logit for Qwen3-MoE, 2.9% for the hybrid, whose DeltaNet
  input projection is the most sensitive to rounding (0.5% with it in fp32)."""
  model = Transformer(get_preset(preset, **overrides), rngs=nnx.Rngs(0))
  copy = for_decoding(model, "bfloat16")
  assert copy.layers[-1].mlp.experts.gate_up_rows.dtype == jnp.bfloat16
  err = _relative_error(model, copy)
  assert 0 < err < (0.05 if model.cfg.is_hybrid else 0.01), err


def test_engine_bfloat16_logprobs_follow_the_model():
  """Greedy decoding with bfloat16 decode weights: each returned log-probability is within
  bfloat16 rounding of the fp32 model's (no cache) for the same sequence."""
  model = Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))
  eng = Engine(model, decode_dtype="bfloat16", min_batch_bucket=4, min_prompt_bucket=16)
  assert eng.decode_layout == "rows" and eng.decode_dtype == "bfloat16"
  rng = np.random.default_rng(2)
  prompts = [rng.integers(0, 512, size=n).tolist() for n in (3, 11, 6)]
  outs = eng.generate(prompts, [SamplingParams(temperature=0, max_new_tokens=16)] * 3, [[]] * 3)
  full = nnx.jit(lambda m, t: jax.nn.log_softmax(m(t).logits[0].astype(jnp.float32), axis=-1))
  for p, out in zip(prompts, outs):
    assert len(out.token_ids) == 16 and out.finish_reason == "length"
    seq = np.zeros((1, 32), np.int32)  # one shape for all rows; causal, so the tail is ignored
    seq[0, :len(p) + 16] = p + out.token_ids
    lp = full(model, jnp.asarray(seq))
    want = [float(lp[len(p) - 1 + i, t]) for i, t in enumerate(out.token_ids)]
    np.testing.assert_allclose(out.logprobs, want, atol=0.05)


def test_engine_rejects_bad_decode_options():
  model = Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="decode_layout: 'sideways'"):
    Engine(model, decode_layout="sideways")
  with pytest.raises(ValueError, match="decode_dtype needs decode_layout 'rows'"):
    Engine(model, decode_layout="model", decode_dtype="bfloat16")
  with pytest.raises(ValueError, match="decode dtype 'int3'"):
    Engine(model, decode_dtype="int3")


def test_auto_layout_falls_back_without_memory_for_the_copy(monkeypatch, caplog):
  from lwm_jax.sampling import engine as engine_mod
  model = Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))
  assert Engine(model).decode_layout == "rows"  # CPU, one device, room for the copy
  monkeypatch.setattr(engine_mod, "_available_memory", lambda: 1000)
  eng = Engine(model)
  assert eng.decode_layout == "model" and eng.decode_state is eng.state
  assert "does not fit twice" in caplog.text
