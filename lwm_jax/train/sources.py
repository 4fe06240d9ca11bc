"""Batch sources: where the trainer loop's batches come from.

A source gives this process's rows of each global batch and can be checkpointed:

  next_batch(state) -> dict of [rows, ...] arrays   `state` is the current TrainState: a rollout
                                                     source samples with its parameters, a data
                                                     iterator ignores it
  get_state() / set_state(s)                         JSON-able state for exact resume
  bind(run)                                          (optional) the run's model, mesh and shardings,
                                                     given once before the first batch
  describe()                                         (optional) names the data, for errors

CPT and SFT read the Grain pipeline (`pipeline_source`) or a drill (`drill_source`: listing,
copy and departure rows, lwm_jax/data/drill_sources.py); any iterator with get_state/set_state
(the pipeline's DataIterator, `synthetic.SyntheticIterator`) becomes a source through
`as_source`. Rollout sources for RL live with RL (lwm_jax/rl/); `synthetic.SyntheticRollouts` is
a toy one for tests and smoke runs.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterator, Protocol

import ml_collections
from flax import nnx
from jax.sharding import Mesh

from lwm_jax.model.config import ModelConfig
from lwm_jax.stages import get_stage


@dataclasses.dataclass(frozen=True)
class Run:
  """What a source may need from the run it feeds."""
  model_cfg: ModelConfig
  graphdef: nnx.GraphDef | None
  mesh: Mesh | None
  shardings: Any               # TrainState of NamedShardings
  batch_size: int              # global rows per step
  seq_len: int
  seed: int
  process_index: int = 0
  process_count: int = 1


class BatchSource(Protocol):
  def next_batch(self, state: Any) -> dict[str, Any]: ...
  def get_state(self) -> Any: ...
  def set_state(self, state: Any) -> None: ...


class IteratorSource:
  """Any iterator of batches with get_state/set_state, as a source."""

  def __init__(self, it: Iterator[dict[str, Any]], name: str = ""):
    self.it = it
    self.name = name or type(it).__name__

  def next_batch(self, state: Any) -> dict[str, Any]:
    del state
    return next(self.it)

  def get_state(self) -> Any:
    return self.it.get_state()

  def set_state(self, state: Any) -> None:
    self.it.set_state(state)

  def bind(self, run: Run) -> None:
    del run

  def describe(self) -> str:
    return self.name


def as_source(obj: Any, name: str = "") -> BatchSource:
  """`obj` itself when it is a source (has next_batch), else the iterator wrapped as one."""
  if hasattr(obj, "next_batch"):
    return obj
  for method in ("get_state", "set_state"):
    if not hasattr(obj, method):
      raise TypeError(f"a batch source needs get_state/set_state for exact resume; "
                      f"{type(obj).__name__} has no {method}")
  return IteratorSource(obj, name)


def describe(source: Any) -> str:
  return source.describe() if hasattr(source, "describe") else type(source).__name__


def data_description(data: ml_collections.ConfigDict) -> str:
  """'data.pipeline.jsonl=a.jsonl,b.jsonl' (or the TFDS folder): the data a run reads."""
  p = data.pipeline
  if p.tfds_dir:
    return f"data.pipeline.tfds_dir={p.tfds_dir} (split {p.split})"
  return f"data.pipeline.jsonl={p.jsonl}"


def _agent_iterator(cfg, tok, _stage: str, process_index: int, process_count: int):
  from lwm_jax.data import agent_targets  # pylint: disable=import-outside-toplevel
  return agent_targets.make_agent_iterator(cfg, tok, process_index, process_count)


def data_config(c: ml_collections.ConfigDict, process_count: int = 1
                ) -> ml_collections.ConfigDict:
  """The Grain pipeline's config of a run: `c.data.pipeline` with the run's row length, this
  process's share of the batch, the run's seed (unless the pipeline sets its own) and thinking
  target."""
  dcfg = ml_collections.ConfigDict(c.data.pipeline.to_dict())
  dcfg.seq_len, dcfg.batch_size = c.train.seq_len, c.train.batch_size // process_count
  dcfg.seed = c.seed if not dcfg.seed else dcfg.seed
  dcfg.thinking_target = c.data.thinking_target
  return dcfg


def pipeline_source(c: ml_collections.ConfigDict, model_cfg: ModelConfig, stage: str,
                    process_index: int = 0, process_count: int = 1
                    ) -> tuple[BatchSource, Callable[[], Iterator] | None, str]:
  """(train source, eval-batch factory or None, tokenizer path) from the Grain pipeline."""
  from lwm_jax.data import pipeline, tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  t = c.train
  tok = tok_lib.load_tokenizer(c.data.tokenizer)
  if tok.vocab_size > model_cfg.vocab_size:
    raise ValueError(f"config.model.vocab_size: {model_cfg.vocab_size} is smaller than the "
                     f"tokenizer's {tok.vocab_size} ({c.data.tokenizer})")
  if t.batch_size % process_count:
    raise ValueError(f"config.train.batch_size: {t.batch_size} is not divisible by "
                     f"{process_count} processes")
  dcfg = data_config(c, process_count)
  rows = get_stage(stage).rows  # the pipeline's rows for the stage (lwm_jax/stages.py)
  if not rows:
    raise ValueError(f"config.data.source: stage {stage!r} makes no pipeline rows; its batches "
                     "come from its own source")
  # agent rows: the agent's view of the trajectories, loss on its actions only
  make = _agent_iterator if rows == "agent" else pipeline.make_train_iterator
  it = make(dcfg, tok, rows, process_index, process_count)
  evals = None
  if c.data.eval_jsonl:
    ecfg = ml_collections.ConfigDict(dcfg.to_dict())
    ecfg.jsonl, ecfg.tfds_dir, ecfg.shuffle, ecfg.num_epochs = c.data.eval_jsonl, "", False, -1
    if "drill_share" in ecfg:
      ecfg.drill_share = 0.0  # the copy drill's random ids are not held-out data: not in the loss
    def evals():
      return make(ecfg, tok, rows, process_index, process_count)
  return (IteratorSource(it, data_description(c.data)), evals,
          os.path.abspath(c.data.tokenizer))


def drill_source(c: ml_collections.ConfigDict, model_cfg: ModelConfig, process_index: int = 0,
                 process_count: int = 1) -> tuple[BatchSource, None, str]:
  """(train source, None, tokenizer path) of `data.source = "drills"`: the drill mixture of
  `c.data.drills` (lwm_jax/data/drill_sources.py), its SFT rows rendered with the run's pipeline
  config in the start model's reply mode (`drills.thinking` auto: `init_from_hf`'s recorded one)."""
  from lwm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  from lwm_jax.data import drill_sources, tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  drill = c.data.drills
  if drill.kind in drill_sources.RANDOM_ID_KINDS:  # random ids: no tokenizer, no rendering
    return drill_sources.make_source(
        drill, data_config(c, 1), None, "", batch=c.train.batch_size, seed=c.seed,
        process_index=process_index, process_count=process_count,
        vocab_size=model_cfg.vocab_size), None, ""
  tok = tok_lib.load_tokenizer(c.data.tokenizer)
  if tok.vocab_size > model_cfg.vocab_size:
    raise ValueError(f"config.model.vocab_size: {model_cfg.vocab_size} is smaller than the "
                     f"tokenizer's {tok.vocab_size} ({c.data.tokenizer})")
  dcfg = data_config(c, 1)
  if drill.thinking == "auto":
    dcfg.thinking = checkpoints.recorded_thinking(c.init_from_hf) if c.init_from_hf else True
  elif drill.thinking in ("on", "off"):
    dcfg.thinking = drill.thinking == "on"
  else:
    raise ValueError(f"config.data.drills.thinking: {drill.thinking!r} is not auto, on or off")
  source = drill_sources.make_source(drill, dcfg, tok, c.data.tokenizer,
                                     batch=c.train.batch_size, seed=c.seed,
                                     process_index=process_index, process_count=process_count)
  return source, None, os.path.abspath(c.data.tokenizer)
