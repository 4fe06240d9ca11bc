"""RoPE scaling (linear, YaRN) against fixtures written by `transformers` (tools/make_hf_fixtures.py
--only=rope): the logits of tiny random Qwen3-MoE models whose sequences run past the original
context, the config spellings, the export, and plain RoPE left as it was."""
from __future__ import annotations

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lwm_jax import hf
from lwm_jax.model.config import ModelConfig, from_hf_dict, to_hf_dict
from lwm_jax.model.layers import rope_cos_sin

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
ROPE_CASES = ["q3_rope_yarn", "q3_rope_yarn_fields", "q3_rope_linear"]


@nnx.jit
def _forward(model, tokens):
  return model(tokens)


def _logits(folder: str, **overrides) -> tuple[np.ndarray, np.ndarray, float]:
  ref = np.load(os.path.join(folder, "ref.npz"))
  out = _forward(hf.load_pretrained(folder, **overrides), jnp.asarray(ref["input_ids"]))
  return np.asarray(out.logits), ref, float(out.aux_loss)


@pytest.mark.parametrize("case", [  # the fields case covers every YaRN field; the rest: slow
    pytest.param(c, marks=() if c == "q3_rope_yarn_fields" else pytest.mark.slow)
    for c in ROPE_CASES])
def test_scaled_rope_logits_match_transformers(case):
  got, ref, aux = _logits(os.path.join(FIX, case))
  err = float(np.abs(got - ref["logits"]).max())
  assert err < 1e-4, f"{case}: max |logits - transformers| = {err}"
  assert abs(aux - float(ref["aux_loss"])) < 1e-5
  # the scaling is not a no-op on these sequences: plain RoPE on the same weights is far off
  plain, _, _ = _logits(os.path.join(FIX, case), rope_scaling=None)
  assert float(np.abs(plain - ref["logits"]).max()) > 1e-2, case


def test_config_spellings_of_the_scaling():
  y = hf.read_config(os.path.join(FIX, "q3_rope_yarn"))   # rope_parameters + rope_scaling copy
  assert y.rope_scaling == {"rope_type": "yarn", "factor": 2.0,
                            "original_max_position_embeddings": 128}
  f = hf.read_config(os.path.join(FIX, "q3_rope_yarn_fields"))
  assert f.rope_scaling == {"rope_type": "yarn", "factor": 2.0,
                            "original_max_position_embeddings": 96, "attention_factor": 1.25,
                            "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}
  lin = hf.read_config(os.path.join(FIX, "q3_rope_linear"))  # older `rope_scaling: {type: ...}`
  assert lin.rope_scaling == {"rope_type": "linear", "factor": 2.0} and lin.rope_theta == 1e4
  plain = hf.read_config(os.path.join(FIX, "q3_topk_norm"))
  assert plain.rope_scaling is None


@pytest.mark.parametrize("case", ROPE_CASES)
def test_export_writes_the_scaling_back(case, tmp_path):
  cfg = hf.read_config(os.path.join(FIX, case))
  d = to_hf_dict(cfg)
  assert from_hf_dict(d) == cfg
  want = {"rope_theta": cfg.rope_theta, **cfg.rope_scaling}
  assert d["rope_parameters"] == want and d["rope_scaling"] == want
  if case == "q3_rope_yarn":
    # the fixture's config.json is in the form the export writes, and transformers reloaded it to
    # the same logits when the fixture was made
    with open(os.path.join(FIX, case, "config.json")) as fh:
      written = json.load(fh)
    for k in ("rope_theta", "rope_parameters", "rope_scaling"):
      assert d[k] == written[k], k
  # save -> load keeps the scaling and the logits
  model = hf.load_pretrained(os.path.join(FIX, case))
  out = str(tmp_path / case)
  hf.save_pretrained(model, out)
  assert hf.read_config(out).rope_scaling == cfg.rope_scaling
  shutil.copy(os.path.join(FIX, case, "ref.npz"), out)
  again, ref, _ = _logits(out)
  assert float(np.abs(again - ref["logits"]).max()) < 1e-4


def test_plain_rope_tables_are_unchanged():
  pos = jnp.arange(3000, dtype=jnp.int32).reshape(2, 1500)
  for rd, theta in ((32, 1e4), (64, 1e6), (16, 1e7)):
    # the tables as they were computed before scaling existed
    inv = 1.0 / (theta ** (jnp.arange(0, rd, 2, dtype=jnp.float32) / rd))
    emb = jnp.concatenate([pos.astype(jnp.float32)[..., None] * inv] * 2, axis=-1)
    cos, sin = rope_cos_sin(pos, rd, theta)
    assert np.array_equal(np.asarray(cos), np.asarray(jnp.cos(emb)))
    assert np.array_equal(np.asarray(sin), np.asarray(jnp.sin(emb)))
    cos2, sin2 = rope_cos_sin(pos, rd, theta, (("rope_type", "default"),), 2048)
    assert np.array_equal(np.asarray(cos2), np.asarray(cos))
    assert np.array_equal(np.asarray(sin2), np.asarray(sin))
  # a config without scaling keeps None, and exports the default type as before
  cfg = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16, num_experts=2, num_experts_per_tok=1,
                    rope_theta=1e4)
  d = to_hf_dict(cfg)
  assert cfg.rope_scaling is None and cfg.rope_scaling_items is None and "rope_scaling" not in d
  assert d["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e4}


def test_yarn_without_factor_takes_the_ratio_of_the_contexts():
  # transformers: factor missing -> max_position_embeddings / original_max_position_embeddings
  base = dict(rope_type="yarn", original_max_position_embeddings=1024)
  pos = jnp.arange(64)[None]
  a = rope_cos_sin(pos, 32, 1e4, tuple(sorted(base.items())), 4096)
  b = rope_cos_sin(pos, 32, 1e4, tuple(sorted({**base, "factor": 4.0}.items())), 4096)
  assert np.array_equal(np.asarray(a[0]), np.asarray(b[0]))


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_unknown_rope_type_names_the_field_and_the_type(tmp_path, key):
  folder = str(tmp_path / "m")
  shutil.copytree(os.path.join(FIX, "q3_topk_norm"), folder)
  path = os.path.join(folder, "config.json")
  with open(path) as fh:
    cfg = json.load(fh)
  cfg.pop("rope_parameters", None)
  cfg["rope_theta"] = 10000.0
  cfg[key] = {"rope_type": "dynamic", "factor": 2.0}
  with open(path, "w") as fh:
    json.dump(cfg, fh)
  with pytest.raises(ValueError, match=f"{key}.rope_type 'dynamic' is not supported"):
    hf.read_config(folder)
  with pytest.raises(ValueError, match="model.rope_scaling.rope_type: 'longrope'"):
    ModelConfig(rope_scaling={"rope_type": "longrope", "factor": 2.0}).validate()
  with pytest.raises(ValueError, match="model.rope_scaling.factor"):
    ModelConfig(rope_scaling={"rope_type": "linear"}).validate()
