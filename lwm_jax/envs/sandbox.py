"""Isolation for the environments that run real commands (terminal, swe), with bubblewrap.

A sandboxed command sees a private mount view: the system's programs and libraries read-only
(/usr and a few files of /etc), its episode directory as the only writable place (mounted at
`/sandbox`, plus the episode's `tmp/` as /tmp), a read-only root and nothing else of the host (no
/home, /root, /work, no project checkout). It has no network, its own PID namespace (when its
first process ends, or `close()` kills it, every process it started ends too) and resource limits
(CPU time, address space, file size, processes). Where bubblewrap is missing or cannot create
namespaces, `check()` raises, unless the caller opted into running unisolated with `unsafe=True`
or LWM_ENVS_UNSAFE=1, in which case a warning says so.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import warnings

from lwm_jax.envs import base

INNER_ROOT = "/sandbox"
UNSAFE_ENV = "LWM_ENVS_UNSAFE"
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`; `make test` "
                "does this as root)")
# Files of /etc the tools need (user names for `ls -l`, the loader cache, awk's alternative).
_ETC = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
        "alternatives", "localtime", "mime.types", "python3", f"python3.{sys.version_info.minor}")
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-process resource limits inside a sandbox (`ulimit`; hard limits, cannot be raised)."""
  cpu_s: int = 300
  memory_mb: int = 4096
  file_mb: int = 256
  processes: int = 1024     # per user by ulimit; for root, per sandbox by a pids cgroup
  output_bytes: int = 1 << 20   # what the host reads back from one command; the rest is dropped


_probe_result: str | None = None


def problem() -> str:
  """'' when bubblewrap can build a sandbox here, else why not (cached)."""
  global _probe_result
  if _probe_result is None:
    exe = shutil.which("bwrap")
    if exe is None:
      _probe_result = "bubblewrap (bwrap) is not installed"
    else:
      try:
        p = subprocess.run([exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
                            *_system_links(), "true"], capture_output=True, text=True, timeout=30)
        _probe_result = "" if p.returncode == 0 else (
            f"bwrap cannot create namespaces here: {p.stderr.strip() or p.returncode}")
      except (OSError, subprocess.TimeoutExpired) as e:
        _probe_result = f"bwrap failed to run: {e}"
  return _probe_result


def available() -> bool:
  return problem() == ""


def check(unsafe: bool, what: str) -> bool:
  """True when commands of `what` run isolated; False (with a warning) in explicit unsafe mode.

  Raises RuntimeError when isolation is unavailable and unsafe mode was not asked for.
  """
  unsafe = unsafe or os.environ.get(UNSAFE_ENV, "") not in ("", "0")
  why = problem()
  if not why:
    return True
  if not unsafe:
    raise RuntimeError(f"{what} refuses to start without a sandbox: {why}. Either {INSTALL_HINT}, "
                       f"or accept running commands unisolated on this machine with unsafe=True "
                       f"(or {UNSAFE_ENV}=1).")
  warnings.warn(f"{what}: running commands WITHOUT a sandbox ({why}); they can read and change "
                "this machine's files", RuntimeWarning, stacklevel=4)
  return False


def _system_links() -> list[str]:
  args = []
  for d in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):
    if os.path.islink(d):
      args += ["--symlink", os.readlink(d), d]
    elif os.path.isdir(d):
      args += ["--ro-bind", d, d]
  return args


def command(argv: list[str], episode_dir: str, cwd: str, limits: Limits = Limits(),
            ro_paths: tuple[str, ...] = (), tmp: str | None = None) -> list[str]:
  """The bwrap command line running `argv` in a sandbox over `episode_dir` (seen as /sandbox).

  `cwd` is a path inside the sandbox; `ro_paths` are extra host paths shown read-only at the same
  place (e.g. the Python installation that runs pytest); `tmp` (a host directory inside the
  episode directory) becomes /tmp.
  """
  args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
          "--ro-bind", "/usr", "/usr", *_system_links()]
  for name in _ETC:
    args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
  args += ["--proc", "/proc", "--dev", "/dev"]
  args += ["--bind", episode_dir, INNER_ROOT]
  if tmp is not None:
    args += ["--bind", tmp, "/tmp"]
  # After /tmp: a Python installation that lives under the host's /tmp (a checkout's venv there)
  # must not be hidden by the episode's /tmp.
  for p in ro_paths:
    args += ["--ro-bind", p, p]
  # The project checkout stays out of sight even when it lives under a mounted tree.
  if any(_CHECKOUT == p or _CHECKOUT.startswith(p.rstrip("/") + "/") for p in ("/usr", *ro_paths)):
    args += ["--tmpfs", _CHECKOUT]
  args += ["--remount-ro", "/", "--chdir", cwd]
  return args + ["/bin/bash", "-c", ulimit_script(limits), argv[0], *argv]


def ulimit_script(limits: Limits) -> str:
  """A `bash -c` script that sets `limits` (soft and hard) and then runs its arguments."""
  l = limits
  return (f"ulimit -t {l.cpu_s} -v {l.memory_mb * 1024} -f {l.file_mb * 2048} -u {l.processes}"
          ' && exec "$@"')


def inner_path(episode_dir: str, host_path: str) -> str:
  """Where a host path inside the episode directory appears in the sandbox."""
  rel = os.path.relpath(host_path, episode_dir)
  return INNER_ROOT if rel == "." else os.path.join(INNER_ROOT, rel)


class SandboxedEnv(base.Env):
  """An env that runs real commands, each inside a sandbox over its episode directory."""

  def __init__(self, root: str | None, unsafe: bool, limits: Limits) -> None:
    super().__init__()
    self.root_parent = root
    self.limits = limits
    self.isolated = check(unsafe, type(self).__name__)

  def _open_dir(self, prefix: str) -> str:
    """Makes the episode directory (with its tmp/); returns where commands see it."""
    self._make_dir(prefix)
    os.makedirs(os.path.join(self.sandbox, "tmp"))
    self.inner = INNER_ROOT if self.isolated else self.sandbox
    return self.inner

  def _argv(self, argv: list[str], cwd: str, ro_paths: tuple[str, ...] = ()) -> list[str]:
    """`argv` wrapped to run in the episode's sandbox (or only under its limits, when unsafe)."""
    if self.isolated:
      return command(argv, self.sandbox, cwd, self.limits, ro_paths,
                     tmp=os.path.join(self.sandbox, "tmp"))
    return ["/bin/bash", "-c", ulimit_script(self.limits), argv[0], *argv]


def descendants(pid: int) -> list[int]:
  """Every live descendant of `pid` (children first), read from /proc."""
  todo, seen = [pid], []
  while todo:
    p = todo.pop()
    try:
      with open(f"/proc/{p}/task/{p}/children") as f:
        kids = [int(x) for x in f.read().split()]
    except OSError:
      kids = []
    seen.extend(kids)
    todo.extend(kids)
  return seen


_PIDS_ROOT = "/sys/fs/cgroup/pids"  # the cgroup v1 pids controller, where the host mounts it


def _pids_cgroup(limit: int) -> str | None:
  """A fresh pids cgroup capped at `limit` processes, or None where none can be made.

  The kernel does not apply `ulimit -u` to root, so a sandbox started by root (this machine, CI)
  needs the cgroup to stop a fork bomb; for other users the ulimit already holds."""
  if os.geteuid() != 0 or not os.access(_PIDS_ROOT, os.W_OK):
    return None
  path = os.path.join(_PIDS_ROOT, "lwm_jax_sandbox", f"{os.getpid()}-{time.monotonic_ns()}")
  try:
    os.makedirs(path)
    with open(os.path.join(path, "pids.max"), "w") as f:
      f.write(str(limit))
  except OSError:
    return None
  return path


def _join_cgroup(path: str) -> None:  # runs in the child between fork and exec
  with open(os.path.join(path, "cgroup.procs"), "w") as f:
    f.write("0")


def _remove_cgroup(proc: subprocess.Popen) -> None:
  path = getattr(proc, "sandbox_cgroup", None)
  if path:
    proc.sandbox_cgroup = None  # type: ignore[attr-defined]
    try:
      os.rmdir(path)
    except OSError:
      pass


def popen(argv: list[str], pids_max: int = Limits().processes, **kwargs) -> subprocess.Popen:
  """subprocess.Popen for a command line made by `command()` (or a plain one).

  For a sandbox it asks bwrap for the host PID of the sandbox's first process, so that
  `kill_tree`/`run` can wait until the whole sandbox is gone: bwrap itself may exit a moment
  before the kernel has ended the other processes of its PID namespace.
  """
  info_w = -1
  cgroup = None
  if argv[0] == "bwrap":
    cgroup = _pids_cgroup(pids_max)
    if cgroup:
      kwargs["preexec_fn"] = functools.partial(_join_cgroup, cgroup)
    info_r, info_w = os.pipe()
    argv = [argv[0], "--info-fd", str(info_w), *argv[1:]]
    kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), info_w)
  try:
    proc = subprocess.Popen(argv, **kwargs)
  except BaseException:
    if info_w >= 0:
      os.close(info_r)
    raise
  finally:
    if info_w >= 0:
      os.close(info_w)
  proc.sandbox_info_fd = info_r if info_w >= 0 else -1  # type: ignore[attr-defined]
  proc.sandbox_cgroup = cgroup  # type: ignore[attr-defined]
  return proc


def _await_end(proc: subprocess.Popen, timeout: float = 5.0) -> None:
  """After `proc` (bwrap) has exited: waits until its sandbox's first process has ended too,
  which the kernel allows only once every process of the sandbox has ended."""
  fd = getattr(proc, "sandbox_info_fd", -1)
  if fd < 0:
    _remove_cgroup(proc)
    return
  proc.sandbox_info_fd = -1  # type: ignore[attr-defined]
  info = b""
  with os.fdopen(fd, "rb") as f:
    info = f.read()
  m = re.search(rb'"child-pid":\s*(\d+)', info)
  if m:
    _await_gone([int(m.group(1))], timeout)
  _remove_cgroup(proc)


def _await_gone(pids: list[int], timeout: float = 5.0) -> None:
  """Waits until every process in `pids` has ended (gone, or a zombie)."""
  deadline = time.monotonic() + timeout
  for pid in pids:
    while time.monotonic() < deadline:
      try:
        with open(f"/proc/{pid}/stat") as f:
          if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            break
      except (OSError, IndexError):
        break
      time.sleep(0.005)


def kill_tree(proc: subprocess.Popen) -> None:
  """SIGKILLs `proc`, its process group and every descendant, then reaps it and waits until
  they have all ended."""
  kids = descendants(proc.pid)
  for pid in kids[::-1]:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  try:
    proc.kill()
  except ProcessLookupError:
    pass
  proc.wait()
  _await_gone(kids)
  _await_end(proc)


def run(argv: list[str], *, cwd: str, env: dict[str, str], timeout: float,
        max_output: int) -> tuple[int, str, bool]:
  """Runs a command to the end (or `timeout`), reading at most `max_output` bytes of its output.

  Returns (exit code, stdout+stderr, timed out); extra output is dropped with a note. The whole
  process tree is killed at the timeout.
  """
  proc = popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
               stderr=subprocess.STDOUT, start_new_session=True)
  assert proc.stdout is not None
  fd = proc.stdout.fileno()
  chunks, size, dropped = [], 0, 0
  deadline = time.monotonic() + timeout
  timed_out = False
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      timed_out = True
      break
    ready, _, _ = select.select([fd], [], [], min(left, 0.5))
    if not ready:
      continue
    chunk = os.read(fd, 65536)
    if not chunk:
      break
    keep = chunk[:max(0, max_output - size)]
    chunks.append(keep)
    size += len(keep)
    dropped += len(chunk) - len(keep)
  if timed_out:
    kill_tree(proc)
  else:
    proc.wait()
    _await_end(proc)
  proc.stdout.close()
  out = b"".join(chunks).decode("utf-8", "replace")
  if dropped:
    out += f"\n[{dropped} more bytes of output dropped]\n"
  return (124 if timed_out else proc.returncode), out, timed_out
