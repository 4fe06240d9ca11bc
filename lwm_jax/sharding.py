"""Device mesh, logical-axis rules, parameter shardings and distributed initialisation.

Parameters name their dimensions with logical axes (`vocab`, `embed`, `q_heads`, `kv_heads`, `mlp`,
`expert`, `norm`, None); rules map each logical name to a mesh axis (or none). The mesh always has the
four axes `data`, `fsdp`, `expert`, `tensor` (size 1 where unused), so one device runs the same code:

  data    pure data parallelism (parameters replicated)
  fsdp    data parallelism with parameters split on their `embed` dimension
  expert  MoE experts split across devices (tokens split over it too outside the MoE)
  tensor  attention heads, MLP hidden units and the vocabulary split across devices
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("expert", "expert"),
    ("norm", None),
    ("linear_heads", "tensor"),   # Gated DeltaNet per-value-head parameters and projections
    ("linear_v", "tensor"),
    ("linear_qkv", None),         # q|k|v fused: splitting it over tensor would cut across parts
    ("conv_kernel", None),
)


def make_mesh(data: int = 1, fsdp: int = 1, expert: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over `devices` (default all); data=-1 takes whatever the other axes leave."""
  devices = list(devices if devices is not None else jax.devices())
  sizes = [data, fsdp, expert, tensor]
  if sizes.count(-1) > 1:
    raise ValueError("mesh: at most one axis may be -1")
  if -1 in sizes:
    rest = int(np.prod([s for s in sizes if s != -1]))
    if len(devices) % rest:
      raise ValueError(f"mesh: {len(devices)} devices do not divide into axes {sizes}")
    sizes[sizes.index(-1)] = len(devices) // rest
  n = int(np.prod(sizes))
  if n != len(devices):
    raise ValueError(f"mesh: data*fsdp*expert*tensor = {n} but {len(devices)} devices are "
                     f"available (sizes {dict(zip(MESH_AXES, sizes))})")
  arr = np.asarray(devices).reshape(sizes)
  return Mesh(arr, MESH_AXES, axis_types=(AxisType.Auto,) * 4)


def spec_for(axes: Iterable[str | None], shape: Sequence[int], mesh: Mesh,
             rules: Sequence[tuple[str, Any]] = DEFAULT_RULES) -> P:
  """PartitionSpec for one array: logical names through the rules; an axis that does not divide
  the dimension, or that an earlier dimension already uses, is left out (replicated)."""
  table = dict(rules)
  used: set[str] = set()
  out = []
  for name, dim in zip(axes, shape):
    target = table.get(name) if name is not None else None
    if isinstance(target, str):
      target = (target,)
    chosen = []
    size = 1
    for ax in target or ():
      s = mesh.shape[ax]
      if s > 1 and ax not in used and dim % (size * s) == 0:
        chosen.append(ax)
        size *= s
    used.update(chosen)
    out.append(tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None))
  return P(*out)


def _axes_of(var: nnx.Variable, ndim: int) -> tuple:
  axes = var.get_metadata().get("axes")
  return tuple(axes) if axes is not None else (None,) * ndim


def state_shardings(state: nnx.State, mesh: Mesh, rules=DEFAULT_RULES):
  """A NamedSharding for every leaf of an nnx State (variables without axes are replicated)."""
  def one(var):
    if isinstance(var, nnx.Variable):
      v = var.get_value()  # an array, or a ShapeDtypeStruct for an abstract model
      return var.replace(NamedSharding(mesh, spec_for(_axes_of(var, len(v.shape)), v.shape, mesh,
                                                      rules)))
    return NamedSharding(mesh, P())
  return jax.tree_util.tree_map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh, rules=DEFAULT_RULES) -> nnx.Module:
  """Places the model's parameters on the mesh according to the rules (in place)."""
  state = nnx.state(model)
  shardings = state_shardings(state, mesh, rules)
  nnx.update(model, jax.device_put(state, shardings))
  return model


def batch_axes(batch: int, mesh) -> tuple[str, ...]:
  """The batch axes (data, fsdp, expert, in order, of more than one device) that a batch of
  `batch` rows splits over: each whose size, times those before it, divides the batch."""
  shape = mesh.shape if hasattr(mesh.shape, "get") else dict(mesh.shape)
  axes, size = [], 1
  for ax in BATCH_AXES:
    s = shape.get(ax, 1)
    if s > 1 and batch % (size * s) == 0:
      axes.append(ax)
      size *= s
  return tuple(axes)


def batch_spec(batch: int, mesh, ndim: int = 2) -> P:
  """Batch split over the batch axes (data, fsdp, expert) whose sizes divide it."""
  axes = batch_axes(batch, mesh)
  lead = tuple(axes) if len(axes) > 1 else (axes[0] if axes else None)
  return P(lead, *([None] * (ndim - 1)))


def replicated_batch_axes(batch: int, mesh) -> tuple[str, ...]:
  """The batch axes (of more than one device) that `batch_spec` leaves out because the batch does
  not divide over them: activations are then replicated over those axes, each device of one
  doing the same work (and an expert axis left out also stops the MoE's all-to-all dispatch)."""
  shape = mesh.shape if hasattr(mesh.shape, "get") else dict(mesh.shape)
  used = batch_axes(batch, mesh)
  return tuple(a for a in BATCH_AXES if shape.get(a, 1) > 1 and a not in used)


def constrain_batch(x: jax.Array) -> jax.Array:
  """Inside jit under a mesh: keeps activations split over the batch axes. No-op without a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return x
  return jax.lax.with_sharding_constraint(x, batch_spec(x.shape[0], mesh, x.ndim))


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, timeout_s: int = 300,
                           cpu_collectives: str | None = None) -> None:
  """Starts multi-process JAX. With no arguments, auto-detects TPU pods and SLURM; with explicit
  coordinator/num_processes/process_id it works anywhere (e.g. several CPU processes on loopback)."""
  if cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  kwargs: dict[str, Any] = {"initialization_timeout": timeout_s}
  if coordinator_address:
    kwargs.update(coordinator_address=coordinator_address, num_processes=num_processes,
                  process_id=process_id)
  jax.distributed.initialize(**kwargs)
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
