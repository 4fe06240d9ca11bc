"""A run of the one trainer, scored at each of its checkpoints.

Drills and the experiments built on them ask how a skill grows with training ("after how many
steps does the second copy get cheap?"). They train through `trainer.train` like every run (its
shardings, optimizer, checkpoints, resume and metrics) with a checkpoint every `checkpoint.every`
steps, then score each saved step with their own measure; nothing here steps an optimizer.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import ml_collections

from lwm_jax import checkpoints
from lwm_jax.train import trainer


def train_and_score(config: ml_collections.ConfigDict, workdir: str,
                    score: Callable[[Any], dict[str, Any]],
                    log: Callable[[dict[str, Any]], None] = print,
                    extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """Trains `config` in `workdir`, then logs one record per checkpoint, oldest first: `extra`,
  the step, that step's training loss, `score(model)` and the seconds since the start. Returns
  the trainer's summary with the records under "scores". The run keeps every checkpoint it
  saves (`checkpoint.keep` is raised to fit them), so each is scored."""
  t0 = time.time()
  every, steps = config.checkpoint.every, config.train.num_steps
  if every <= 0:
    raise ValueError("config.checkpoint.every: a scored run needs checkpoints to score (> 0)")
  config = config.copy_and_resolve_references()
  config.checkpoint.keep = max(config.checkpoint.keep, steps // every + 2)
  summary = trainer.train(config, workdir)
  losses, records = summary["losses"], []
  for step, model in checkpoints.models_by_step(workdir):
    rec = {**(extra or {}), "step": step}
    if 0 < step <= len(losses):
      rec["train_loss"] = round(losses[step - 1], 4)
    rec.update(score(model))
    rec["s"] = round(time.time() - t0)
    log(rec)
    records.append(rec)
  summary["scores"] = records
  return summary
