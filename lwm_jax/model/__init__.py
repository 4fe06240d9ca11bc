"""lwm_jax.model: the Qwen3-MoE / Qwen3.5-MoE transformer in Flax NNX, its config and sizes.

Imports only jax/flax and `lwm_jax.sharding` (never data, train, sampling or eval).
`abstract_model(cfg)` is the one place that builds a shape-only model (no memory is allocated);
checkpoint readers, the train state and the size counters all start from it.
"""
from __future__ import annotations

from typing import Any


def abstract_model(cfg: Any) -> tuple[Any, Any]:
  """(nnx.GraphDef, shape-only nnx.State) of `Transformer(cfg)`, built with `nnx.eval_shape`.

  Every leaf of the state is a `jax.ShapeDtypeStruct` wrapped in its variable (parameters keep
  their logical `axes` metadata), so it can serve as a restore target or to derive shardings.
  """
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from lwm_jax.model.transformer import Transformer  # pylint: disable=import-outside-toplevel
  return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
