"""Isolation for the environments that run real commands (terminal, swe), with bubblewrap.

A sandboxed command sees a private mount view: the system's programs and libraries read-only
(/usr and a few files of /etc), its episode directory as the only writable place (mounted at
`/sandbox`, plus the episode's `tmp/` as /tmp), a read-only root and nothing else of the host (no
/home, /root, /work, no project checkout). It has no network, its own PID namespace (when its
first process ends, or `close()` kills it, every process it started ends too) and resource limits
(CPU time, address space, file size, processes). Where bubblewrap is missing or cannot create
namespaces, `check()` raises, unless the caller opted into running unisolated with `unsafe=True`
or LWM_ENVS_UNSAFE=1, in which case a warning says so.

No sandboxed process holds a capability, whoever starts it: every sandbox gets its own user
namespace with the capability bounding set emptied (`--cap-drop ALL`), a seccomp filter (see
`seccomp`) refuses mount, ptrace, keyring, module, BPF and namespace calls, and /sys is absent
(/proc is the sandbox's own, with its kernel-tunable parts read-only). When the host process is
root, bwrap itself runs as the unprivileged host uid `SANDBOX_UID` (the episode's files are handed
to it), so the namespace's root is nobody on the host; the shell still sees itself as uid 0 there,
as the recorded corpus does, with no capability behind it. Per sandbox, a memory cgroup bounds all
of its processes together (v2, or v1's memory controller) and a pids cgroup their number; the
episode directory is a size-limited tmpfs when the host may mount one. `describe()` says which of
these hold on this machine; docs/sandbox.md lists them.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import warnings
import weakref

from lwm_jax.envs import base, confined, sandbox_limits, seccomp

INNER_ROOT = "/sandbox"
UNSAFE_ENV = "LWM_ENVS_UNSAFE"
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`; `make test` "
                "does this as root)")
# Files of /etc the tools need (user names for `ls -l`, the loader cache, awk's alternative).
_ETC = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
        "alternatives", "localtime", "mime.types", "python3", f"python3.{sys.version_info.minor}")
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The host uid a sandbox runs as when the host process is root (nobody by default).
SANDBOX_UID = int(os.environ.get("LWM_SANDBOX_UID", "65534"))
_FD_BINDS = ("--bind-fd", "--ro-bind-fd")  # their source is a host path until popen opens it


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits of a sandbox: per process by `ulimit` (hard limits, cannot be raised) and per
  sandbox by cgroups and a size-limited tmpfs where this machine allows them (`describe()`)."""
  cpu_s: int = 300
  memory_mb: int = 4096     # per process (address space) and, by a memory cgroup, for the sandbox
  file_mb: int = 256
  processes: int = 1024     # per user by ulimit; per sandbox by a pids cgroup
  output_bytes: int = 1 << 20   # what the host reads back from one command; the rest is dropped
  # > 0: the episode directory (with its tmp/) is a tmpfs of this size, which bounds the disk an
  # episode fills. Off by default: a tmpfs reports other directory sizes in `ls -l` (80, not
  # 4096) than the filesystem the corpus was recorded on, so the real environment would stop
  # reproducing its own recorded observations (the replay reward, `make corpus`).
  disk_mb: int = 0


_probe_result: str | None = None
_drop_uid: int | None = None   # the host uid bwrap runs as (None: the host process's own)


def _bwrap_knows(option: str) -> bool:
  try:
    return option in subprocess.run(["bwrap", "--help"], capture_output=True, text=True,
                                    timeout=10).stdout
  except (OSError, subprocess.TimeoutExpired):
    return False


def problem() -> str:
  """'' when bubblewrap can build a sandbox here, else why not (cached).

  Tries the sandbox as it will run: as `SANDBOX_UID` when the host process is root (falling back
  to the host's uid, still without capabilities, where that uid cannot make a user namespace)."""
  global _probe_result, _drop_uid
  if _probe_result is None:
    if shutil.which("bwrap") is None:
      _probe_result = "bubblewrap (bwrap) is not installed"
      return _probe_result
    import tempfile
    why = ""
    for uid in ([SANDBOX_UID, None] if os.geteuid() == 0 else [None]):
      _drop_uid = uid
      with tempfile.TemporaryDirectory(prefix="lwm_probe_") as d:
        if uid is not None:
          os.chown(d, uid, uid)
        try:
          base_py = os.path.realpath(sys.base_prefix)
          ro = () if base_py.startswith("/usr/") else (base_py,)
          rc, out, _ = run(command(["true"], d, INNER_ROOT, ro_paths=ro), cwd=d,
                           env={"PATH": "/usr/bin:/bin"}, timeout=30, max_output=4096)
        except OSError as e:
          rc, out = -1, str(e)
      if rc == 0:
        why = ""
        break
      why = why or (f"bwrap cannot create namespaces here: {out.strip() or rc}")
    _probe_result = why
  return _probe_result


def describe() -> dict[str, str]:
  """What isolation a sandbox gets on this machine (measured, not promised: see
  tools/sandbox_report.py for the view from inside)."""
  why = problem()
  if why:
    return {"sandbox": f"unavailable: {why}"}
  return {"host uid": str(_drop_uid if _drop_uid is not None else os.geteuid()),
          "uid inside": str(_inner_ids()[0]),
          "capabilities": "none (own user namespace, bounding set empty)",
          "seccomp": (f"{len(seccomp.REFUSED)} calls refused ({platform.machine()})"
                      if seccomp.program() else f"none (unknown architecture {platform.machine()})"),
          "cgroups": sandbox_limits.kind(),
          "disk": ("per file (ulimit -f); a size-limited tmpfs per episode with "
                   "Limits(disk_mb=N), as root")}


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


def _inner_ids() -> tuple[int, int]:
  """The uid and gid the sandbox's processes have inside their namespace: the host's own for
  other users; 0 for root (as the corpus records it), which holds no capability there and is
  `SANDBOX_UID` on the host."""
  if os.geteuid() == 0:
    return 0, 0
  return os.geteuid(), os.getegid()


def drop_uid() -> int | None:
  """The host uid sandboxes run as (None: the host process's own); episode files go to it."""
  problem()
  return _drop_uid


def command(argv: list[str], episode_dir: str, cwd: str, limits: Limits = Limits(),
            ro_paths: tuple = (), tmp: str | None = None) -> list[str]:
  """The bwrap command line running `argv` in a sandbox over `episode_dir` (seen as /sandbox).

  `cwd` is a path inside the sandbox; `ro_paths` are extra host paths shown read-only, each a
  path (shown at the same place) or a (host path, place inside) pair (e.g. the Python
  installation that runs pytest); `tmp` (a host directory inside the episode directory) becomes
  /tmp. Host paths are bound through descriptors that `popen` opens, so bwrap needs no access to
  them when it runs as `SANDBOX_UID`.
  """
  uid, gid = _inner_ids()
  args = ["bwrap", "--unshare-all", "--unshare-user", "--uid", str(uid), "--gid", str(gid),
          "--cap-drop", "ALL", "--die-with-parent", "--new-session"]
  if _bwrap_knows("--disable-userns"):
    args += ["--disable-userns"]
  if seccomp.program() is not None:
    args += ["--seccomp", "@seccomp"]
  args += ["--ro-bind", "/usr", "/usr", *_system_links()]
  for name in _ETC:
    args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
  args += ["--proc", "/proc", "--dev", "/dev"]
  args += ["--bind-fd", episode_dir, INNER_ROOT]
  if tmp is not None:
    args += ["--bind-fd", tmp, "/tmp"]
  # After /tmp: a Python installation that lives under the host's /tmp (a checkout's venv there)
  # must not be hidden by the episode's /tmp.
  shown = []
  for p in ro_paths:
    src, dest = (p, p) if isinstance(p, str) else p
    args += ["--ro-bind-fd", src, dest]
    shown += [os.path.realpath(src), dest]
  # The project checkout stays out of sight even when it lives under a mounted tree.
  if any(_CHECKOUT == p or _CHECKOUT.startswith(p.rstrip("/") + "/") for p in ("/usr", *shown)):
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
    self.tmpfs = False

  def _open_dir(self, prefix: str) -> str:
    """Makes the episode directory (with its tmp/), a size-limited tmpfs where the host may mount
    one; returns where commands see it."""
    self._make_dir(prefix)
    uid = drop_uid() if self.isolated else None
    if self.isolated and os.geteuid() == 0 and self.limits.disk_mb > 0:
      owner = os.geteuid() if uid is None else uid
      self.tmpfs = sandbox_limits.mount_tmpfs(self.sandbox, self.limits.disk_mb, owner, owner)
      if self.tmpfs:  # an env dropped without close() still gives its mount back (at the latest
        # when the interpreter exits)
        self._unmount = weakref.finalize(self, _drop_tmpfs, self.sandbox)
    os.makedirs(os.path.join(self.sandbox, "tmp"))
    self.inner = INNER_ROOT if self.isolated else self.sandbox
    return self.inner

  def _hand_over(self) -> None:
    """Gives the episode directory's files to the uid the sandbox runs as (after the host wrote
    them); never follows a link."""
    uid = drop_uid() if self.isolated else None
    if uid is not None:
      confined.chown_tree(self.sandbox, uid, uid)

  def _remove_dir(self) -> None:
    if self.tmpfs and self.sandbox:
      self._unmount()
      self.tmpfs = False
    super()._remove_dir()

  def _argv(self, argv: list[str], cwd: str, ro_paths: tuple = ()) -> list[str]:
    """`argv` wrapped to run in the episode's sandbox (or only under its limits, when unsafe)."""
    if self.isolated:
      return command(argv, self.sandbox, cwd, self.limits, ro_paths,
                     tmp=os.path.join(self.sandbox, "tmp"))
    return ["/bin/bash", "-c", ulimit_script(self.limits), argv[0], *argv]


def _drop_tmpfs(path: str) -> None:
  sandbox_limits.unmount(path)
  shutil.rmtree(path, ignore_errors=True)


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


def _child_setup(cgroups: list[str], uid: int | None, staged: list[str], where: str) -> None:
  """Between fork and exec (as the host user): joins the cgroups, shows the read-only sources
  where bwrap can reach them, then becomes `uid`."""
  sandbox_limits.join(cgroups)
  if staged:
    sandbox_limits.stage(where, staged)
  if uid is not None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _remove_cgroup(proc: subprocess.Popen) -> None:
  paths = getattr(proc, "sandbox_cgroups", None)
  if paths:
    proc.sandbox_cgroups = []  # type: ignore[attr-defined]
    sandbox_limits.remove(paths)


def popen(argv: list[str], pids_max: int = Limits().processes, memory_mb: int = Limits().memory_mb,
          **kwargs) -> subprocess.Popen:
  """subprocess.Popen for a command line made by `command()` (or a plain one).

  For a sandbox it opens the bound host paths and the seccomp program as descriptors for bwrap,
  puts bwrap in fresh cgroups (memory, processes) where it can, runs it as `SANDBOX_UID` when
  the host process is root, and asks bwrap for the host PID of the sandbox's first process, so
  that `kill_tree`/`run` can wait until the whole sandbox is gone: bwrap itself may exit a moment
  before the kernel has ended the other processes of its PID namespace.
  """
  info_w = -1
  cgroups: list[str] = []
  fds: list[int] = []
  staged: list[str] = []
  where = ""
  if argv[0] == "bwrap":
    argv = list(argv)
    try:
      for i, a in enumerate(argv[:-1]):
        if a in _FD_BINDS and not argv[i + 1].isdigit() and _drop_uid is not None:
          # bwrap resolves a bound descriptor's path again, as the unprivileged uid, which may
          # not enter its parents (/root, pytest's 0700 /tmp/pytest-of-root): stage it.
          where = where or sandbox_limits.stage_dir()
          argv[i] = "--ro-bind" if a == "--ro-bind-fd" else "--bind"
          staged.append(os.path.realpath(argv[i + 1]))
          argv[i + 1] = os.path.join(where, str(len(staged) - 1))
        elif a in _FD_BINDS and not argv[i + 1].isdigit():
          fds.append(os.open(argv[i + 1], os.O_PATH | os.O_CLOEXEC))
          argv[i + 1] = str(fds[-1])
        elif a == "--seccomp" and argv[i + 1] == "@seccomp":
          fds.append(seccomp.program_fd())
          argv[i + 1] = str(fds[-1])
    except OSError:
      for fd in fds:
        os.close(fd)
      raise
    cgroups = sandbox_limits.make(memory_mb, pids_max)
    kwargs["preexec_fn"] = functools.partial(_child_setup, cgroups, _drop_uid, staged, where)
    info_r, info_w = os.pipe()
    argv = [argv[0], "--info-fd", str(info_w), *argv[1:]]
    kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), info_w, *fds)
  try:
    proc = subprocess.Popen(argv, **kwargs)
  except BaseException:
    if info_w >= 0:
      os.close(info_r)
    sandbox_limits.remove(cgroups)
    raise
  finally:
    if info_w >= 0:
      os.close(info_w)
    for fd in fds:
      os.close(fd)
  proc.sandbox_info_fd = info_r if info_w >= 0 else -1  # type: ignore[attr-defined]
  proc.sandbox_cgroups = cgroups  # type: ignore[attr-defined]
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
        max_output: int, limits: Limits = Limits()) -> tuple[int, str, bool]:
  """Runs a command to the end (or `timeout`), reading at most `max_output` bytes of its output.

  Returns (exit code, stdout+stderr, timed out); extra output is dropped with a note. The whole
  process tree is killed at the timeout.
  """
  proc = popen(argv, pids_max=limits.processes, memory_mb=limits.memory_mb, cwd=cwd, env=env,
               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
               start_new_session=True)
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
