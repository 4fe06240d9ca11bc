"""Orbax checkpoints of a training run: the train state and the data iterators, keeping the last K.

Reading parameters for samplers, and the checksums that guard every step, live in
`lwm_jax.checkpoints`.

On-disk layout of a training workdir:

  <workdir>/config.json                 the resolved training config (`model` = ModelConfig.to_dict())
  <workdir>/checkpoints/<step>/state/   TrainState as an Orbax PyTree: {params, opt_state, step, rng};
                                        params mirror `nnx.state(Transformer)` (e.g.
                                        params/layers/0/self_attn/q_proj/kernel)
  <workdir>/checkpoints/<step>/data/    JSON: {"process_<i>": iterator state of process i, ...}
  <workdir>/checkpoints/<step>/meta/    JSON: {"step", "model": ModelConfig.to_dict(), "tokenizer",
                                        "stage", "loss"}
  <workdir>/checkpoints/<step>/checksums.json   size and SHA-256 of every file of the step, written
                                        once Orbax has finished it (`checkpoints.write_checksums`)
  <workdir>/rejected_checkpoints/<step>[.n]/  steps that failed verification at resume, moved
                                        aside (never deleted) so the run can save that step again

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

from lwm_jax import checkpoints
from lwm_jax.checkpoints import CheckpointError

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
  """Async Orbax CheckpointManager: saves every `every` steps (or when forced), keeps the last `keep`.

  After Orbax finishes a step (at the next save, `wait` or `close` when asynchronous), the primary
  process writes its checksums. `restore` verifies a step before reading it and, for the default
  (newest) step, falls back to older ones with a warning, moving aside each step whose files no
  longer match their checksums.
  """

  def __init__(self, workdir: str, every: int, keep: int, use_async: bool = True):
    self.workdir = os.path.abspath(workdir)
    self.dir = os.path.join(self.workdir, checkpoints.STEPS_DIR)
    self.every = every
    opts = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=use_async,
                                        create=True)
    self.mgr = ocp.CheckpointManager(self.dir, options=opts, item_names=ITEMS)
    self.use_async = use_async
    self._pending: list[int] = []          # saved steps still without checksums
    self._verified: dict[int, str] = {}    # step -> "" (good) or the verification error

  def latest_step(self) -> int | None:
    return self.mgr.latest_step()

  def step_dir(self, step: int) -> str:
    return os.path.join(self.dir, str(step))

  def _finish_pending(self) -> None:
    if not self._pending:
      return
    self.mgr.wait_until_finished()
    if jax.process_index() == 0:
      for step in self._pending:
        if os.path.isdir(self.step_dir(step)):  # keep-K may have removed it already
          checkpoints.write_checksums(self.step_dir(step))
    self._pending = []

  def save(self, step: int, state: Any, iter_state: Any, meta: dict, force: bool = False) -> bool:
    if not force and (self.every <= 0 or step % self.every):
      return False
    if step in self.mgr.all_steps():
      return False
    self._finish_pending()
    states = _gather_json(encode_iter_state(iter_state))
    data = {f"process_{i}": s for i, s in enumerate(states)}
    self.mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                data=ocp.args.JsonSave(data),
                                                meta=ocp.args.JsonSave(meta)), force=True)
    self._pending.append(step)
    self._verified.pop(step, None)
    if not self.use_async:
      self._finish_pending()
    return True

  def verify(self, step: int) -> str:
    """"" when the step's files match its checksums (or it has none), else the error (cached)."""
    if step not in self._verified:
      try:
        checkpoints.check_step(self.step_dir(step))
        self._verified[step] = ""
      except CheckpointError as e:
        self._verified[step] = str(e)
    return self._verified[step]

  def last_good_step(self) -> int | None:
    """The newest saved step whose files still match their checksums (reads them: error paths);
    a step without checksums.json cannot be vouched for and is passed over."""
    self._finish_pending()
    for step in sorted(self.mgr.all_steps(), reverse=True):
      if not self.verify(step) and os.path.exists(os.path.join(self.step_dir(step),
                                                               checkpoints.CHECKSUMS)):
        return step
    return None

  def restore(self, abstract_state: Any, step: int | None = None):
    """(state, this process's iterator state, meta) at `step`, or at the newest step that
    verifies and restores; None when there is no checkpoint. A bad explicit step raises
    CheckpointError; bad newer steps are skipped with a warning and moved aside."""
    self._finish_pending()
    if step is not None:
      return self._restore(abstract_state, step)
    errors = []
    for s in sorted(self.mgr.all_steps(), reverse=True):
      try:
        return self._restore(abstract_state, s)
      except CheckpointError as e:
        errors.append(str(e))
        # Only a step whose files changed since the save is moved aside; one Orbax cannot read
        # into this run's state (e.g. another model config) stays where it is.
        where = f"moved to {self._reject(s)}" if self._verified.get(s) else "left in place"
        logging.warning("checkpoint step %d is unusable: %s; %s, trying the previous step", s, e,
                        where)
    if errors:
      raise CheckpointError(f"{self.dir}: no step could be restored: " + "; ".join(errors))
    return None

  def _restore(self, abstract_state: Any, step: int):
    bad = self.verify(step)
    if bad:
      raise CheckpointError(bad)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    try:
      r = self.mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                         data=ocp.args.JsonRestore(),
                                                         meta=ocp.args.JsonRestore()))
    except Exception as e:  # Orbax and TensorStore raise many types for a damaged folder
      raise checkpoints.orbax_error(self.step_dir(step), e) from None
    checkpoints.check_finite(r["state"], self.step_dir(step))
    it = (r["data"] or {}).get(f"process_{jax.process_index()}")
    if it is None:
      raise CheckpointError(f"{self.step_dir(step)}/data: no iterator state for process "
                            f"{jax.process_index()} (saved by {len(r['data'] or {})} processes)")
    return r["state"], decode_iter_state(it), r["meta"]

  def _reject(self, step: int) -> str:
    """Moves a bad step out of the manager's folder (kept for inspection); returns where to."""
    dest = os.path.join(self.workdir, "rejected_checkpoints", str(step))
    n = 0
    while os.path.exists(dest + (f".{n}" if n else "")):
      n += 1
    dest += f".{n}" if n else ""
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      os.replace(self.step_dir(step), dest)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      multihost_utils.sync_global_devices(f"lwm_jax_reject_checkpoint_{step}")
    self.mgr.reload()
    self._verified.pop(step, None)
    return dest

  def wait(self) -> None:
    self.mgr.wait_until_finished()
    self._finish_pending()

  def close(self) -> None:
    self.wait()
    self.mgr.close()
