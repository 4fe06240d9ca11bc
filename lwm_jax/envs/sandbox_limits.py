"""Limits a sandbox gets as a whole (not per process): cgroups for memory and processes, a
size-limited tmpfs for the episode directory. Each is taken where this machine allows it, and
`in_force()` says which: cgroup v2 (`memory.max`, `pids.max`) where its controllers can be
enabled, else cgroup v1's memory and pids controllers, else none (the per-process `ulimit`s of
the sandbox then remain the only bound); the tmpfs needs the right to mount (root).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import time

_V2_ROOT = "/sys/fs/cgroup"
_V1_ROOTS = {"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids"}
_GROUP = "lwm_jax_sandbox"
_MNT_DETACH = 2
_MS_NOSUID, _MS_NODEV = 2, 4


def _write(path: str, text: str) -> None:
  with open(path, "w") as f:
    f.write(text)


@functools.lru_cache(maxsize=None)
def _v2_parent() -> str | None:
  """Our cgroup v2 parent with the memory and pids controllers enabled for its children."""
  if not os.path.exists(os.path.join(_V2_ROOT, "cgroup.subtree_control")):
    return None
  parent = os.path.join(_V2_ROOT, _GROUP)
  try:
    with open(os.path.join(_V2_ROOT, "cgroup.controllers")) as f:
      if not {"memory", "pids"} <= set(f.read().split()):
        return None
    _write(os.path.join(_V2_ROOT, "cgroup.subtree_control"), "+memory +pids")
    os.makedirs(parent, exist_ok=True)
    _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
  except OSError:
    return None
  return parent


def _v1_ok(controller: str) -> bool:
  root = _V1_ROOTS[controller]
  return os.path.isdir(root) and os.access(root, os.W_OK)


def kind() -> str:
  """Which cgroups a sandbox gets here: 'v2', 'v1' (memory and/or pids) or 'none'."""
  if _v2_parent():
    return "v2"
  have = [c for c in ("memory", "pids") if _v1_ok(c)]
  return f"v1 ({', '.join(have)})" if have else "none"


def make(memory_mb: int, processes: int) -> list[str]:
  """Fresh cgroups for one sandbox, capped at `memory_mb` (all its processes together, no swap)
  and `processes`; their folders (join each with `join`), or [] where none can be made."""
  name = f"{os.getpid()}-{time.monotonic_ns()}"
  limit = str(memory_mb << 20)
  made = []
  parent = _v2_parent()
  try:
    if parent:
      path = os.path.join(parent, name)
      os.mkdir(path)
      made.append(path)
      _write(os.path.join(path, "memory.max"), limit)
      if os.path.exists(os.path.join(path, "memory.swap.max")):
        _write(os.path.join(path, "memory.swap.max"), "0")
      _write(os.path.join(path, "pids.max"), str(processes))
      return made
    if _v1_ok("memory"):
      path = os.path.join(_V1_ROOTS["memory"], _GROUP, name)
      os.makedirs(path)
      made.append(path)
      _write(os.path.join(path, "memory.limit_in_bytes"), limit)
      if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
        _write(os.path.join(path, "memory.memsw.limit_in_bytes"), limit)
    if _v1_ok("pids"):
      path = os.path.join(_V1_ROOTS["pids"], _GROUP, name)
      os.makedirs(path)
      made.append(path)
      _write(os.path.join(path, "pids.max"), str(processes))
  except OSError:
    remove(made)
    return []
  return made


def join(paths: list[str]) -> None:
  """Moves the calling process into `paths` (runs in the child between fork and exec)."""
  for path in paths:
    _write(os.path.join(path, "cgroup.procs"), "0")


def remove(paths: list[str]) -> None:
  for path in paths:
    for _ in range(50):  # the kernel may still be finishing the last process's exit
      try:
        os.rmdir(path)
        break
      except FileNotFoundError:
        break
      except OSError:
        time.sleep(0.01)


@functools.lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL:
  return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(path: str, size_mb: int, uid: int, gid: int) -> bool:
  """Mounts a tmpfs of `size_mb` over the (empty) directory `path`, owned by uid:gid; False when
  this process may not mount."""
  opts = f"size={size_mb}m,mode=0700,uid={uid},gid={gid}".encode()
  rc = _libc().mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts)
  return rc == 0


def unmount(path: str) -> None:
  _libc().umount2(path.encode(), _MNT_DETACH)


_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_CLONE_NEWNS = 0x00020000


def stage_dir() -> str:
  """An empty folder the host owns, over which `stage` mounts (in a private mount namespace)."""
  import tempfile
  path = os.path.join(tempfile.gettempdir(), "lwm_jax_sandbox_stage")
  os.makedirs(path, mode=0o755, exist_ok=True)
  return path


def stage(where: str, sources: list[str]) -> None:
  """Runs in the child, as root, between fork and exec: in a private mount namespace, shows each
  of `sources` at where/<i> (a fresh tmpfs), so that bwrap, run as an unprivileged uid next,
  can bind them although their parents (e.g. /root) are closed to that uid."""
  libc = _libc()
  if libc.unshare(_CLONE_NEWNS) != 0:
    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
  if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
    raise OSError(ctypes.get_errno(), "making mounts private failed")
  if libc.mount(b"tmpfs", where.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=64k") != 0:
    raise OSError(ctypes.get_errno(), f"mounting a tmpfs on {where} failed")
  for i, src in enumerate(sources):
    dest = os.path.join(where, str(i))
    if os.path.isdir(src):
      os.mkdir(dest)
    else:
      open(dest, "w").close()
    if libc.mount(src.encode(), dest.encode(), None, _MS_BIND | _MS_REC, None) != 0:
      raise OSError(ctypes.get_errno(), f"binding {src} failed")
