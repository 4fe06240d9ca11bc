"""Damaged model folders are refused with an error naming the file (issue 68, points 9-10).

The campaign's case: 4 KB of 0xff written into the middle of `model.safetensors`; the folder then
loaded and generated ''. Now every HF export carries checksums.json, loading verifies it (a
changed file is named), and a tensor holding NaN or inf is refused even where no checksums exist
(a folder made elsewhere, or checking switched off). The same holds for training step folders.
"""
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from lwm_jax import checkpoints, hf
from lwm_jax.checkpoints import CheckpointError
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.train.checkpoint import Checkpointer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = get_preset("tiny", num_hidden_layers=1, num_experts=4, num_experts_per_tok=2)


@pytest.fixture
def folder(tmp_path):
  path = str(tmp_path / "hf")
  hf.save_pretrained(Transformer(CFG, rngs=nnx.Rngs(0)), path)
  return path


def _ff(path, n=4096):
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.seek(size // 2)
    f.write(b"\xff" * n)


def test_every_export_writes_checksums_that_cover_its_files(folder):
  with open(os.path.join(folder, hf.CHECKSUMS)) as f:
    listed = set(json.load(f)["files"])
  assert listed == set(os.listdir(folder)) - {hf.CHECKSUMS}
  assert hf.verify_checksums(folder) is True
  hf.load_pretrained(folder)  # a clean folder loads


def test_overwritten_weights_are_named_and_refused(folder, monkeypatch):
  weights = os.path.join(folder, "model.safetensors")
  _ff(weights)
  with pytest.raises(CheckpointError, match=f"{weights}: contents changed.*LWM_SKIP_CHECKSUMS=1"):
    hf.load_pretrained(folder)
  with pytest.raises(CheckpointError, match="model.safetensors: contents changed"):
    checkpoints.load(folder, tokenizer=object())
  # Checking switched off (a folder the user changed on purpose): the NaNs are still caught.
  monkeypatch.setenv(hf.SKIP_CHECKSUMS_ENV, "1")
  with pytest.raises(CheckpointError, match=f"{weights}: tensor .* non-finite"):
    hf.load_pretrained(folder)


def test_a_foreign_folder_without_checksums_loads_with_a_warning_but_not_with_nans(folder, caplog):
  os.remove(os.path.join(folder, hf.CHECKSUMS))
  hf.load_pretrained(folder)
  assert any("unverified" in r.getMessage() for r in caplog.records)
  _ff(os.path.join(folder, "model.safetensors"))
  with pytest.raises(CheckpointError, match="non-finite"):
    hf.load_pretrained(folder)


def test_a_changed_config_is_named(folder):
  cfg = os.path.join(folder, "config.json")
  with open(cfg) as f:
    d = json.load(f)
  d["rms_norm_eps"] = 0.5
  with open(cfg, "w") as f:
    json.dump(d, f)
  with pytest.raises(CheckpointError, match="config.json: .*(bytes|contents changed)"):
    hf.load_pretrained(folder)
  hf.load_pretrained(folder, verify_checksums=False)  # the documented way past it
  hf.write_checksums(folder)
  hf.load_pretrained(folder)


def test_the_shipped_models_verify():
  assert hf.verify_checksums(os.path.join(REPO, "data", "world_model")) is True
  assert hf.verify_checksums(os.path.join(REPO, "data", "world_model_long")) is True


def test_the_long_model_carries_the_default_models_tokenizer_files():
  """data/world_model_long was trained from data/world_model with its tokenizer: the same
  tokenizer files byte for byte, so the AutoTokenizer checks of the default folder
  (test_hf_tokenizer_files.py) hold for it; its context is the one its rows had."""
  for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
    with open(os.path.join(REPO, "data", "world_model", name), "rb") as a, \
         open(os.path.join(REPO, "data", "world_model_long", name), "rb") as b:
      assert a.read() == b.read(), name
  cfg = hf.read_config(os.path.join(REPO, "data", "world_model_long"))
  assert cfg.max_position_embeddings == 4608


def test_a_config_that_is_a_json_list_is_named(folder):
  with open(os.path.join(folder, "config.json"), "w") as f:
    f.write("[1, 2]")
  with pytest.raises(CheckpointError, match="config.json: .*JSON list"):
    checkpoints.load(folder, tokenizer=object())


def test_a_step_with_nan_parameters_is_refused_and_never_called_good(tmp_path):
  """Damaged data without checksums.json (issue 68, point 10): refused on load, skipped by
  resume, and never named as the last good checkpoint."""
  wd = str(tmp_path / "wd")
  ck = Checkpointer(wd, every=1, keep=3, use_async=False)
  good = {"params": nnx.split(Transformer(CFG, rngs=nnx.Rngs(1)))[1], "step": np.asarray(1)}
  ck.save(1, good, {"index": 1}, {"model": CFG.to_dict(), "step": 1})
  bad_params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(2)))[1]
  leaves, treedef = jax.tree.flatten(bad_params)
  leaves[0] = leaves[0].at[(1,) * leaves[0].ndim].set(np.nan)
  bad_params = jax.tree.unflatten(treedef, leaves)
  ck.save(2, {"params": bad_params, "step": np.asarray(2)}, {"index": 2},
          {"model": CFG.to_dict(), "step": 2})
  step2 = os.path.join(wd, "checkpoints", "2")
  os.remove(os.path.join(step2, checkpoints.CHECKSUMS))
  ck.close()
  with pytest.raises(CheckpointError, match=f"{step2}/state: .* holds 1 non-finite"):
    checkpoints.restore_params(step2)
  assert checkpoints.restore_params(wd)[2]["step"] == 1   # serving falls back
  ck = Checkpointer(wd, every=1, keep=3, use_async=False)
  assert ck.last_good_step() == 1
  ck.close()
