"""The platform a computation is being built FOR, which need not be the host's.

Choices that depend on the hardware (the MoE backend `auto`, the compute dtype of precision
`auto`, the sampler's decode layout) ask `target_platform()` rather than `jax.default_backend()`:
when a step is compiled ahead of time for a TPU topology on a CPU host (`lwm_jax.compile`), the
host's backend is "cpu" but the code must be the TPU's. The answer is, in order:

1. the platform named by an enclosing `with target("tpu"):` block;
2. the platform of the devices of the concrete mesh set by an enclosing `jax.set_mesh(mesh)`
   (a mesh built from a topology description's devices says "tpu");
3. `jax.default_backend()`.
"""
from __future__ import annotations

import contextlib
import contextvars

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("lwm_target_platform",
                                                                     default=None)


@contextlib.contextmanager
def target(platform: str | None):
  """Within the block, `target_platform()` returns `platform` (None: no override)."""
  token = _TARGET.set(platform.lower() if platform else None)
  try:
    yield
  finally:
    _TARGET.reset(token)


def _mesh_platform() -> str | None:
  try:
    from jax._src import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
    mesh = mesh_lib.get_concrete_mesh()
  except (ImportError, AttributeError):
    return None
  if mesh is None or getattr(mesh, "empty", True):
    return None
  try:
    return str(mesh.devices.flat[0].platform).lower()
  except (AttributeError, IndexError):
    return None


def target_platform() -> str:
  """"cpu", "gpu"/"cuda"/"rocm" or "tpu": the platform code is being built for (see module)."""
  return _TARGET.get() or _mesh_platform() or jax.default_backend()


def is_cpu() -> bool:
  return target_platform() == "cpu"


def is_tpu() -> bool:
  return target_platform() == "tpu"
