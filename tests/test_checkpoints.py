"""lwm_jax.checkpoints: checksums written after each save, damaged steps named and skipped.

A workdir holds two steps of a tiny model saved by the training Checkpointer; each test damages
the newer one the way a disk or a user would (overwritten bytes, truncation, a missing file, bad
metadata) and checks what serving (`restore_params`, `load`) and training resume
(`Checkpointer.restore`) do: name the bad file, and fall back to the older step, whose parameters
must equal the ones saved.
"""
import json
import logging
import os

import jax
import numpy as np
import pytest
from flax import nnx

from lwm_jax import checkpoints, sharding
from lwm_jax.checkpoints import CheckpointError
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.train.checkpoint import Checkpointer

CFG = get_preset("tiny", num_hidden_layers=1, num_experts=4, num_experts_per_tok=2)


def _state(seed):
  return {"params": nnx.split(Transformer(CFG, rngs=nnx.Rngs(seed)))[1],
          "step": np.asarray(seed, np.int32)}


@pytest.fixture
def workdir(tmp_path):
  """<tmp>/wd with steps 1 and 2 (parameters from seeds 1 and 2), asynchronous saves."""
  wd = str(tmp_path / "wd")
  ck = Checkpointer(wd, every=1, keep=3, use_async=True)
  for step in (1, 2):
    ck.save(step, _state(step), {"index": step}, {"model": CFG.to_dict(), "step": step})
  ck.close()
  return wd


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _same(a, b):
  la, lb = _leaves(a), _leaves(b)
  return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def _data_file(step_dir):
  """The largest file under state/ (an OCDBT data file holding the arrays)."""
  files = [os.path.join(r, n) for r, _, ns in os.walk(os.path.join(step_dir, "state")) for n in ns]
  return max(files, key=os.path.getsize)


def _overwrite(path, n=100):
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.seek(size // 2)
    f.write(bytes((i * 37 + 11) % 256 for i in range(n)))


def test_checksums_cover_every_file_and_a_clean_step_restores(workdir):
  step2 = os.path.join(workdir, "checkpoints", "2")
  manifest = json.load(open(os.path.join(step2, checkpoints.CHECKSUMS)))
  on_disk = sorted(os.path.relpath(os.path.join(r, n), step2) for r, _, ns in os.walk(step2)
                   for n in ns if n != checkpoints.CHECKSUMS)
  assert sorted(manifest["files"]) == on_disk
  rel = os.path.relpath(_data_file(step2), step2)
  import hashlib  # an independent digest of one file
  assert manifest["files"][rel]["sha256"] == hashlib.sha256(open(_data_file(step2), "rb").read()
                                                            ).hexdigest()
  assert checkpoints.verify_step(step2) is True
  cfg, params, info = checkpoints.restore_params(workdir)
  assert info["step"] == 2 and cfg == CFG
  assert _same(params, _state(2)["params"])
  one = jax.local_devices()[0]
  assert all(x.sharding.device_set == {one} for x in jax.tree.leaves(params))
  mesh = sharding.make_mesh()
  _, on_mesh, _ = checkpoints.restore_params(workdir, mesh=mesh)
  assert _same(on_mesh, params)
  want = sharding.state_shardings(on_mesh, mesh)
  for x, s in zip(jax.tree.leaves(on_mesh), jax.tree.leaves(want)):
    assert isinstance(x.sharding, jax.sharding.NamedSharding) and x.sharding.mesh == mesh
    assert x.sharding.spec == s.spec


def test_overwritten_bytes_are_named_and_serving_falls_back(workdir, caplog):
  step2 = os.path.join(workdir, "checkpoints", "2")
  bad = _data_file(step2)
  _overwrite(bad)
  with pytest.raises(CheckpointError, match=f"{bad}: contents changed since the save"):
    checkpoints.restore_params(step2)  # a step named explicitly is never swapped for another
  with caplog.at_level(logging.WARNING):
    _, params, info = checkpoints.restore_params(workdir)
  assert info["step"] == 1 and _same(params, _state(1)["params"])
  assert any(bad in r.getMessage() and "previous step" in r.getMessage() for r in caplog.records)
  model, tok = checkpoints.load(workdir, tokenizer=object())  # what the server calls
  assert _same(nnx.state(model), _state(1)["params"]) and tok is not None


def test_training_resume_falls_back_and_moves_the_bad_step_aside(workdir, caplog):
  bad = _data_file(os.path.join(workdir, "checkpoints", "2"))
  _overwrite(bad)
  ck = Checkpointer(workdir, every=1, keep=3, use_async=False)
  assert ck.last_good_step() == 1  # what the trainer names after a NaN
  with pytest.raises(CheckpointError, match="contents changed"):
    ck.restore(_state(0), step=2)
  with caplog.at_level(logging.WARNING):
    state, it_state, meta = ck.restore(_state(0))
  assert meta["step"] == 1 and it_state == {"index": 1} and _same(state, _state(1))
  assert any(bad in r.getMessage() for r in caplog.records)
  moved = os.path.join(workdir, "rejected_checkpoints", "2")
  assert os.path.isdir(moved) and ck.latest_step() == 1  # kept for inspection, not deleted
  assert ck.save(2, _state(22), {"index": 2}, {"model": CFG.to_dict(), "step": 2})  # saved anew
  assert checkpoints.verify_step(os.path.join(workdir, "checkpoints", "2"))
  ck.close()


def _truncate(step_dir):
  p = _data_file(step_dir)
  with open(p, "r+b") as f:
    f.truncate(os.path.getsize(p) // 3)
  return p


def _remove(step_dir):
  p = _data_file(step_dir)
  os.remove(p)
  return p


def _bad_meta(step_dir):
  p = os.path.join(step_dir, "meta", "metadata")
  with open(p, "w") as f:
    f.write('{"model": {"hidden_size": ')
  return p


def _bad_manifest(step_dir):
  p = os.path.join(step_dir, checkpoints.CHECKSUMS)
  with open(p, "w") as f:
    f.write("[1, 2")
  return p


@pytest.mark.parametrize("damage,message", [
    (_truncate, "truncated or overwritten"), (_remove, "file missing"),
    (_bad_meta, "truncated or overwritten"), (_bad_manifest, "unreadable checksum file")])
def test_other_damage_is_one_error_naming_the_file(workdir, damage, message):
  step2 = os.path.join(workdir, "checkpoints", "2")
  path = damage(step2)
  with pytest.raises(CheckpointError, match=f"{path}: .*{message}"):
    checkpoints.restore_params(step2)
  assert checkpoints.restore_params(workdir)[2]["step"] == 1


@pytest.mark.parametrize("damage,named", [(_truncate, "state"), (_bad_meta, "meta/metadata")])
def test_unverified_steps_still_fail_cleanly(workdir, damage, named, caplog):
  """Steps saved before checksums existed: Orbax's or our own reading names the folder or file."""
  step2 = os.path.join(workdir, "checkpoints", "2")
  os.remove(os.path.join(step2, checkpoints.CHECKSUMS))
  damage(step2)
  with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError) as err:
    checkpoints.restore_params(step2)
  assert os.path.join(step2, named) in str(err.value) and "\n" not in str(err.value)
  assert any("unverified" in r.getMessage() for r in caplog.records)


def test_every_step_bad_is_one_error_listing_them(workdir):
  for step in (1, 2):
    _overwrite(_data_file(os.path.join(workdir, "checkpoints", str(step))))
  with pytest.raises(CheckpointError, match="no step could be restored.*/2/.*/1/"):
    checkpoints.restore_params(workdir)
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    checkpoints.restore_params(os.path.join(workdir, "nothing_here"))


def test_recorded_thinking_reads_the_shipped_provenance(tmp_path):
  assert checkpoints.recorded_thinking(str(tmp_path)) is True          # no record: the default
  assert checkpoints.recorded_thinking(str(tmp_path), default=False) is False
  prov = tmp_path / "provenance.json"
  for recorded, want in (("off", False), ("on", True)):
    prov.write_text(json.dumps({"settings": {"thinking": recorded}}))
    assert checkpoints.recorded_thinking(str(tmp_path)) is want
  prov.write_text(json.dumps({"settings": {"thinking": "maybe"}}))
  with pytest.raises(CheckpointError, match="provenance.json: settings.thinking is 'maybe'"):
    checkpoints.recorded_thinking(str(tmp_path))
  prov.write_text("{not json")
  with pytest.raises(CheckpointError, match="provenance.json: not valid JSON"):
    checkpoints.recorded_thinking(str(tmp_path))
  # the shipped world model was trained without thinking
  assert checkpoints.recorded_thinking(os.path.join(os.path.dirname(__file__), "..", "data",
                                                    "world_model")) is False
