"""Suite-wide test setup: cheaper XLA compilation on CPU.

Most of the suite's time is XLA compiling tiny models, not running them. LLVM's optimisation level 0
and the classic (non-MLIR) CPU fusion emitters compile the same programs about three times faster;
the results agree with the default build to float32 rounding (3.6e-7 on the tiny model's logits),
far inside every tolerance here. The flags go into XLA_FLAGS before any JAX backend starts, so
subprocesses started from tests inherit them as well (multi-device tests append their device count
with `xla_env`). Set LWM_TEST_DEFAULT_XLA=1 to run the suite with XLA's default flags instead.
"""
from __future__ import annotations

import os

import pytest

FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _add_flags(flags: str, extra) -> str:
  """`flags` with each of `extra` appended unless that option is already set."""
  parts = flags.split()
  names = {p.split("=", 1)[0] for p in parts}
  parts += [f for f in extra if f.split("=", 1)[0] not in names]
  return " ".join(parts)


if os.environ.get("LWM_TEST_DEFAULT_XLA", "") in ("", "0"):
  os.environ["XLA_FLAGS"] = _add_flags(os.environ.get("XLA_FLAGS", ""), FAST_COMPILE_FLAGS)


def xla_env(devices: int = 8, **extra: str) -> dict:
  """Environment for a subprocess on `devices` forced CPU devices, keeping the suite's XLA flags."""
  flags = _add_flags(os.environ.get("XLA_FLAGS", ""),
                     [f"--xla_force_host_platform_device_count={devices}"])
  return dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", **extra)


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: an expensive check (several processes, every mesh) left to `make test-slow`; "
      "`make test` deselects it")


@pytest.fixture(scope="module")
def jax_disk_cache(tmp_path_factory):
  """JAX's persistent compilation cache in a fresh folder for one test module: runs in a module
  that compile the same step several times compile it once (`pytestmark =
  pytest.mark.usefixtures("jax_disk_cache")`). The old settings come back afterwards."""
  import jax  # pylint: disable=import-outside-toplevel
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  old = [getattr(jax.config, k) for k in keys]
  for k, v in zip(keys, (str(tmp_path_factory.mktemp("jax_cache")), 0, 0)):
    jax.config.update(k, v)
  yield
  for k, v in zip(keys, old):
    jax.config.update(k, v)
