"""Finding and loading a model plus tokenizer for sampling.

`load(path)` accepts three layouts and tells them apart by the files it finds:

  Hugging Face folder   `<path>/config.json` holding `model_type` (or a `text_config` that does)
                        and at least one `*.safetensors` file; the tokenizer is
                        `<path>/tokenizer.json`. Loaded by `lwm_jax.hf.load_pretrained`.
  training step folder  `<path>/state/` (Orbax PyTree with a `params` entry mirroring
                        `nnx.state(Transformer)`) and `<path>/meta/metadata` (JSON with `model` =
                        `ModelConfig.to_dict()` and `tokenizer` = the tokenizer file path).
  training workdir      `<path>/checkpoints/<step>/` step folders as above (the highest step is
                        served) and `<path>/config.json` (the resolved training config; its
                        `data.tokenizer` is the fallback tokenizer path).

A `tokenizer` argument (object or path) overrides what the checkpoint names.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any


def _is_hf_folder(path: str) -> bool:
  cfg = os.path.join(path, "config.json")
  if not os.path.isfile(cfg) or not glob.glob(os.path.join(path, "*.safetensors")):
    return False
  try:
    with open(cfg) as f:
      d = json.load(f)
  except (OSError, ValueError):
    return False
  return "model_type" in d or "model_type" in (d.get("text_config") or {})


def restore_training_params(path: str):
  """(ModelConfig, params nnx.State, info) from a workdir or step folder (the Orbax part)."""
  from lwm_jax.train.checkpoint import restore_params  # pylint: disable=import-outside-toplevel
  return restore_params(path)


def _workdir_tokenizer(path: str) -> str | None:
  """`data.tokenizer` of the nearest training config.json at or above a step folder."""
  p = os.path.abspath(path)
  for _ in range(4):
    cfg = os.path.join(p, "config.json")
    if os.path.isfile(cfg):
      try:
        with open(cfg) as f:
          d = json.load(f)
        return (d.get("data") or {}).get("tokenizer") or None
      except (OSError, ValueError):
        return None
    p = os.path.dirname(p)
  return None


def load(path: str, tokenizer: Any = None, mesh=None, dtype: str | None = None):
  """(model, tokenizer) for a Hugging Face folder, a training workdir or a step folder."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from lwm_jax.data.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint: {path} does not exist")
  if _is_hf_folder(path):
    from lwm_jax import hf  # pylint: disable=import-outside-toplevel
    model = hf.load_pretrained(path, dtype=dtype, mesh=mesh)
    tok_path = path
  else:
    from lwm_jax.model.transformer import Transformer  # pylint: disable=import-outside-toplevel
    cfg, params, info = restore_training_params(path)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    model = nnx.merge(graphdef, params)
    tok_path = info.get("tokenizer") or _workdir_tokenizer(path)
  if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
    tok_path = tokenizer or tok_path
    if not tok_path:
      raise ValueError(f"checkpoint {path}: names no tokenizer (meta 'tokenizer' or config "
                       "data.tokenizer); pass one explicitly")
    tokenizer = load_tokenizer(tok_path)
  return model, tokenizer
