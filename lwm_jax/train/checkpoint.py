"""Orbax checkpoints of the train state and the data iterators, and `restore_params` for samplers.

On-disk layout of a training workdir:

  <workdir>/config.json                 the resolved training config (`model` = ModelConfig.to_dict())
  <workdir>/checkpoints/<step>/state/   TrainState as an Orbax PyTree: {params, opt_state, step, rng};
                                        params mirror `nnx.state(Transformer)` (e.g.
                                        params/layers/0/self_attn/q_proj/kernel)
  <workdir>/checkpoints/<step>/data/    JSON: {"process_<i>": iterator state of process i, ...}
  <workdir>/checkpoints/<step>/meta/    JSON: {"step", "model": ModelConfig.to_dict(), "tokenizer",
                                        "stage", "loss"}

Grain iterator states are JSON dicts (DatasetIterator) or bytes (DataLoader iterator, stored as
{"__bytes_b64__": ...}); every process's state is gathered and written by the primary process.
"""
from __future__ import annotations

import base64
import json
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from lwm_jax.model.config import ModelConfig

ITEMS = ("state", "data", "meta")


def encode_iter_state(s: Any) -> Any:
  if isinstance(s, (bytes, bytearray)):
    return {"__bytes_b64__": base64.b64encode(bytes(s)).decode()}
  json.dumps(s)  # raises on a state JSON cannot hold
  return s


def decode_iter_state(s: Any) -> Any:
  if isinstance(s, dict) and "__bytes_b64__" in s:
    return base64.b64decode(s["__bytes_b64__"])
  return s


def _gather_json(obj: Any) -> list[Any]:
  """Every process's JSON-able object, on every process."""
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  lens = multihost_utils.process_allgather(np.asarray([raw.size], np.int32))
  buf = np.zeros(int(np.max(lens)), np.uint8)
  buf[:raw.size] = raw
  allb = multihost_utils.process_allgather(buf)
  return [json.loads(bytes(allb[i][:int(lens[i][0])]).decode()) for i in range(len(lens))]


class Checkpointer:
  """Async Orbax CheckpointManager: saves every `every` steps (or when forced), keeps the last `keep`."""

  def __init__(self, workdir: str, every: int, keep: int, use_async: bool = True):
    self.dir = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.every = every
    opts = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=use_async,
                                        create=True)
    self.mgr = ocp.CheckpointManager(self.dir, options=opts, item_names=ITEMS)

  def latest_step(self) -> int | None:
    return self.mgr.latest_step()

  def save(self, step: int, state: Any, iter_state: Any, meta: dict, force: bool = False) -> bool:
    if not force and (self.every <= 0 or step % self.every):
      return False
    if step in self.mgr.all_steps():
      return False
    states = _gather_json(encode_iter_state(iter_state))
    data = {f"process_{i}": s for i, s in enumerate(states)}
    self.mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                data=ocp.args.JsonSave(data),
                                                meta=ocp.args.JsonSave(meta)), force=True)
    return True

  def restore(self, abstract_state: Any, step: int | None = None):
    """(state, this process's iterator state, meta) at `step` (default latest), or None."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    r = self.mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                       data=ocp.args.JsonRestore(),
                                                       meta=ocp.args.JsonRestore()))
    it = r["data"].get(f"process_{jax.process_index()}")
    if it is None:
      raise ValueError(f"{self.dir}/{step}/data: no iterator state for process "
                       f"{jax.process_index()} (saved by {len(r['data'])} processes)")
    return r["state"], decode_iter_state(it), r["meta"]

  def wait(self) -> None:
    self.mgr.wait_until_finished()

  def close(self) -> None:
    self.mgr.wait_until_finished()
    self.mgr.close()


def _find_step_dir(path: str) -> str:
  path = os.path.abspath(path)
  if os.path.isdir(os.path.join(path, "state")) and os.path.isdir(os.path.join(path, "meta")):
    return path
  root = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) \
      else path
  steps = sorted(int(d) for d in os.listdir(root) if d.isdigit()) if os.path.isdir(root) else []
  if not steps:
    raise FileNotFoundError(f"{path}: no checkpoint (expected <workdir>/checkpoints/<step>/ or a "
                            "step folder holding state/ and meta/)")
  return os.path.join(root, str(steps[-1]))


def restore_params(path: str) -> tuple[ModelConfig, nnx.State, dict[str, Any]]:
  """Model config, parameter nnx.State and info (step, tokenizer, stage, step_dir) from a workdir
  (latest step) or a step folder. Merge with `nnx.merge(graphdef, params)` where graphdef comes
  from `nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))`."""
  from lwm_jax.train.state import abstract_model  # pylint: disable=import-outside-toplevel
  step_dir = _find_step_dir(path)
  with open(os.path.join(step_dir, "meta", "metadata")) as f:
    meta = json.load(f)
  cfg = ModelConfig.from_dict(meta["model"])
  _, abstract = abstract_model(cfg)
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract)
  one_device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  ckptr = ocp.PyTreeCheckpointer()
  restored = ckptr.restore(os.path.join(step_dir, "state"),
                           args=ocp.args.PyTreeRestore(
                               item={"params": target},
                               # Onto this process's first device; callers shard afterwards.
                               restore_args={"params": jax.tree.map(
                                   lambda _: ocp.ArrayRestoreArgs(sharding=one_device), target)},
                               partial_restore=True))
  info = dict(meta, step_dir=step_dir)
  return cfg, restored["params"], info
