"""JAX's persistent compilation cache for serving: a restart reads compiled shapes from disk
instead of compiling them again.

`enable("auto")` puts the cache under the user's cache folder (`$XDG_CACHE_HOME/lwm_jax/jax_cache`,
default `~/.cache/lwm_jax/jax_cache`), one shared folder: JAX keys every entry by the computation,
the compiler and the device, so models and versions never read each other's entries. A path puts
it there; "off" leaves JAX's setting as it is. Every compilation is cached (no minimum compile
time or size), since a server's small shapes are also what makes its start slow.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def default_dir() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "lwm_jax", "jax_cache")


def enable(where: str = "auto") -> str | None:
  """Turns the persistent cache on (see the module docstring); returns its folder, or None when
  `where` is "off" or the folder cannot be created (then the server compiles as before, and says
  so in the log)."""
  import jax  # pylint: disable=import-outside-toplevel
  if where in ("off", "none", ""):
    return None
  path = default_dir() if where == "auto" else os.path.abspath(os.path.expanduser(where))
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    log.warning("compilation cache %s: cannot create it (%s); compiling without a cache", path,
                e.strerror)
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  log.info("compilation cache: %s", path)
  return path
