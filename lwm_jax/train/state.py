"""The train state pytree (params, optimizer state, step, rng) and its creation on a mesh.

Parameters are the `nnx.State` of a `Transformer` (`nnx.split`): the graph definition stays static
(outside jit), the state is an ordinary pytree that steps take and return.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lwm_jax import sharding as shd
from lwm_jax.model import abstract_model
from lwm_jax.model.config import ModelConfig
from lwm_jax.model.transformer import Transformer


@dataclasses.dataclass
class TrainState:
  params: Any          # nnx.State of the model's parameters
  opt_state: Any       # optax state
  step: jax.Array      # int32 scalar: optimizer steps taken
  rng: jax.Array       # uint32[2] PRNG key, split every step


jax.tree_util.register_dataclass(TrainState, data_fields=["params", "opt_state", "step", "rng"],
                                 meta_fields=[])


def _path_key(path) -> tuple:
  return tuple(str(p) for p in path)


def opt_state_shardings(abstract_opt: Any, params_shardings: Any, abstract_params: Any,
                        mesh: Mesh) -> Any:
  """Each optimizer leaf whose path ends with a parameter's path (and has its shape) gets that
  parameter's sharding (Adam's mu/nu); everything else (counts) is replicated."""
  table = {}
  p_leaves = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
  s_leaves = jax.tree.leaves(params_shardings)
  for (path, leaf), s in zip(p_leaves, s_leaves):
    table[_path_key(path)] = (leaf.shape, s)
  rep = NamedSharding(mesh, P())

  def one(path, leaf):
    key = _path_key(path)
    for start in range(len(key)):
      hit = table.get(key[start:])
      if hit is not None and hit[0] == leaf.shape:
        return hit[1]
    return rep
  return jax.tree_util.tree_map_with_path(one, abstract_opt)


def params_shardings(params: nnx.State, mesh: Mesh, rules=shd.DEFAULT_RULES) -> nnx.State:
  """A NamedSharding per parameter from its logical `axes` (works on abstract states too)."""
  return shd.state_shardings(params, mesh, rules)


def state_shardings(abstract_state: TrainState, mesh: Mesh, rules=shd.DEFAULT_RULES) -> TrainState:
  """NamedShardings for a whole TrainState (from the parameters' logical axes)."""
  p_sh = params_shardings(abstract_state.params, mesh, rules)
  rep = NamedSharding(mesh, P())
  return TrainState(params=p_sh,
                    opt_state=opt_state_shardings(abstract_state.opt_state, p_sh,
                                                  abstract_state.params, mesh),
                    step=rep, rng=rep)


def _initializer(cfg: ModelConfig, tx: optax.GradientTransformation) -> Callable:
  def init(key, p=None) -> TrainState:
    pkey, skey = jax.random.split(key)
    if p is None:
      _, p = nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=pkey)))
    return TrainState(params=p, opt_state=tx.init(p), step=jnp.zeros((), jnp.int32), rng=skey)
  return init


def abstract_train_state(cfg: ModelConfig, tx: optax.GradientTransformation, mesh: Mesh,
                         rules=shd.DEFAULT_RULES) -> tuple[nnx.GraphDef, TrainState, TrainState]:
  """(graphdef, shape-only state whose leaves are ShapeDtypeStructs carrying their shardings,
  the shardings): what `create_train_state` would place on `mesh`, with nothing allocated (for
  ahead-of-time compilation, `lwm_jax.compile`)."""
  graphdef, _ = abstract_model(cfg)
  abstract = jax.eval_shape(_initializer(cfg, tx), jax.random.PRNGKey(0))
  shardings = state_shardings(abstract, mesh, rules)
  with_sh = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
  return graphdef, with_sh, shardings


def create_train_state(cfg: ModelConfig, tx: optax.GradientTransformation, mesh: Mesh, seed: int,
                       params: Any = None, rules=shd.DEFAULT_RULES
                       ) -> tuple[nnx.GraphDef, TrainState, TrainState]:
  """(graphdef, state placed on the mesh, its shardings). Fresh parameters come from `seed`;
  `params` (an nnx.State, e.g. from a Hugging Face checkpoint) replaces them when given."""
  graphdef, _ = abstract_model(cfg)
  init = _initializer(cfg, tx)
  key = jax.random.PRNGKey(seed)
  abstract = jax.eval_shape(init, key)
  shardings = state_shardings(abstract, mesh, rules)
  with jax.set_mesh(mesh):
    if params is None:
      state = jax.jit(init, out_shardings=shardings)(key)
    else:
      params = jax.device_put(params, shardings.params)
      state = jax.jit(init, out_shardings=shardings)(key, params)
  return graphdef, state, shardings


def count_params(params: Any) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))
