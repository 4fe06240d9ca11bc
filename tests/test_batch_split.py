"""How a batch splits over the mesh's batch axes, and what is said when it cannot."""
from __future__ import annotations

import types

import logging

import ml_collections

from lwm_jax import sharding as shd
from lwm_jax.train import trainer


def _mesh(**sizes):
  """Only the axis sizes matter here (no devices): 64 chips as fsdp 8 x expert 8, etc."""
  return types.SimpleNamespace(shape={a: sizes.get(a, 1) for a in shd.MESH_AXES})


def test_rows_that_do_not_divide_leave_the_expert_axis_replicated():
  mesh = _mesh(fsdp=8, expert=8)
  assert shd.replicated_batch_axes(64, mesh) == ()  # one row a chip
  assert shd.replicated_batch_axes(128, mesh) == ()
  # the hybrid preset's old micro-batches: 256 rows in 8 (32 rows) or 16 (16 rows)
  assert shd.replicated_batch_axes(32, mesh) == ("expert",)
  assert shd.replicated_batch_axes(16, mesh) == ("expert",)
  assert shd.replicated_batch_axes(4, mesh) == ("fsdp", "expert")
  assert shd.replicated_batch_axes(3, _mesh(data=2)) == ("data",)
  assert shd.replicated_batch_axes(3, _mesh()) == ()  # one device: nothing to split
  assert shd.batch_spec(32, mesh)[0] == "fsdp"


def test_trainer_names_the_replicated_axis_and_the_fields(caplog):
  c = ml_collections.ConfigDict(dict(train=dict(batch_size=256, micro_batches=8)))
  with caplog.at_level(logging.WARNING):
    trainer._warn_if_replicated(c, _mesh(fsdp=8, expert=8))  # pylint: disable=protected-access
  said = [r.getMessage() for r in caplog.records]
  assert len(said) == 1
  assert "32 rows a micro-batch" in said[0] and "replicated over expert (8x" in said[0]
  assert "all-to-all" in said[0] and "divisible by 64" in said[0]
  c.train.micro_batches = 4
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    trainer._warn_if_replicated(c, _mesh(fsdp=8, expert=8))  # pylint: disable=protected-access
  assert not caplog.records  # 64 rows: split evenly, nothing said
