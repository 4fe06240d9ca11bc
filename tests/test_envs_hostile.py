"""The second fuzz campaign's escapes and hangs (issue 68), each as a case that must now fail.

A hostile episode tries to regain root's powers inside its sandbox, to make the host follow its
symbolic links or open its FIFOs, and to exhaust memory or disk. Each case names the evidence:
a marker that must not appear outside, a host file that must keep its content and time, a
capability set read from /proc inside the sandbox, a call that must return within its limit.
"""
import os
import subprocess
import time
import uuid

import pytest

from lwm_jax.envs import confined, sandbox, seccomp, verify
from lwm_jax.envs.swe.env import SweEnv
from lwm_jax.envs.terminal.env import TerminalEnv

pytestmark = pytest.mark.skipif(not sandbox.available(), reason=f"no sandbox: {sandbox.problem()}")
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def term():
  env = TerminalEnv(time_limit=3.0)
  env.reset(5)
  yield env
  env.close()


@pytest.fixture
def host_file(tmp_path):
  """A host file with a secret marker and an old mtime, outside every sandbox."""
  marker = f"SECRET-{uuid.uuid4().hex}"
  path = tmp_path / "host_secret.txt"
  path.write_text(marker + "\n")
  os.utime(path, (1_000_000_000, 1_000_000_000))
  os.chmod(tmp_path, 0o755)
  return str(path), marker


def _status(env: TerminalEnv, field: str) -> str:
  line = env.step(f"grep '^{field}:' /proc/self/status").splitlines()[0]
  return line.split(":", 1)[1].strip()


# -- escape 1: root's powers -------------------------------------------------------------------
def test_no_capability_inside_whoever_starts_the_sandbox(term):
  for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
    assert int(_status(term, field), 16) == 0, field
  assert _status(term, "NoNewPrivs") == "1"
  if seccomp.program() is not None:
    assert _status(term, "Seccomp") == "2"  # a filter is loaded
  # The host sees the sandbox's shell as an unprivileged uid (root starts it as SANDBOX_UID).
  with open(f"/proc/{term.shell_pid}/status") as f:
    uids = next(l for l in f if l.startswith("Uid:")).split()[1:]
  assert all(int(u) == (sandbox.drop_uid() if ROOT else os.geteuid()) for u in uids), uids
  if ROOT:
    assert sandbox.drop_uid() not in (None, 0)


@pytest.mark.parametrize("attempt", [
    "mount -o remount,bind,rw /usr && touch /usr/bin/{p}",
    "mount -o remount,bind,rw /etc/passwd && echo {p} >> /etc/passwd",
    "unshare -rm sh -c 'mount -o remount,bind,rw /usr && touch /usr/bin/{p}'",
    "mount -t tmpfs none /usr/bin && touch /usr/bin/{p}",
    "python3 -c \"import ctypes; l = ctypes.CDLL(None); print(l.mount(b'/usr', b'/usr', None, 4096 | 32, None)); open('/usr/bin/{p}', 'w')\"",
])
def test_read_only_binds_cannot_be_remounted(term, attempt):
  probe = f"lwm_probe_{uuid.uuid4().hex}"
  obs = term.step(attempt.format(p=probe) + "; echo done")
  assert not os.path.exists(f"/usr/bin/{probe}"), obs
  assert probe not in open("/etc/passwd").read()
  assert "Read-only file system" in term.step(f"touch /usr/bin/{probe}")
  assert "/usr " in term.step("grep ' /usr ' /proc/self/mounts") and " ro," in term.step(
      "grep ' /usr ' /proc/self/mounts")


def test_kernel_tunables_and_sys_are_out_of_reach(term):
  obs = term.step("echo '|/bin/true' > /proc/sys/kernel/core_pattern; echo rc=$?")
  assert "rc=0" not in obs, obs
  assert "No such file or directory" in term.step("ls /sys")
  with open("/proc/sys/kernel/core_pattern") as f:
    assert "/bin/true" not in f.read()


def test_seccomp_refuses_ptrace_keyring_and_namespaces(term):
  if seccomp.program() is None:
    pytest.skip("no seccomp program for this architecture")
  # Each call would succeed for an unprivileged process without the filter.
  code = ("import ctypes, os; l = ctypes.CDLL(None, use_errno=True); "
          "r = [l.ptrace(0, 0, 0, 0), l.syscall({keyctl}, 0, -3, 0), l.unshare(0x10000000)]; "
          "print(r, ctypes.get_errno())")
  nr = {"x86_64": 250, "aarch64": 219}[os.uname().machine]
  obs = term.step(f"python3 -c '{code.format(keyctl=nr)}'")
  assert obs.startswith("[-1, -1, -1] 1\n"), obs  # EPERM
  assert "rc=0" not in term.step("unshare -U true; echo rc=$?")


def test_sandbox_memory_is_limited_as_a_whole():
  """Two processes each under the per-process limit exceed the sandbox's together."""
  if sandbox.sandbox_limits.kind() == "none":
    pytest.skip("no writable memory cgroup on this machine")
  env = TerminalEnv(time_limit=20.0, limits=sandbox.Limits(memory_mb=160))
  env.reset(0)
  try:
    grab = "python3 -c 'import time; b = bytearray(100 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(2); print(\"kept\")'"
    obs = env.step(f"{grab} & {grab} & wait")
  finally:
    env.close()
  assert obs.splitlines().count("kept") == 1, obs
  assert "Killed" in obs or "MemoryError" in obs, obs


@pytest.mark.skipif(not ROOT, reason="the episode tmpfs needs the right to mount")
def test_episode_disk_is_bounded():
  env = TerminalEnv(time_limit=10.0, limits=sandbox.Limits(disk_mb=8))
  env.reset(0)
  try:
    obs = env.step("for i in 1 2 3; do head -c 4000000 /dev/zero > big$i || break; done; du -sm . /tmp")
  finally:
    env.close()
  assert "No space left on device" in obs, obs


# -- escapes 2-3 and hangs 4-5: the host never follows, never waits -----------------------------
def test_terminal_verifier_does_not_follow_the_agents_link(host_file):
  path, marker = host_file
  with TerminalEnv(time_limit=3.0, task="count_errors") as env:
    env.reset(0)
    obs = env.step(f"ln -s {path} report.txt; ls -l report.txt")
    assert "report.txt ->" in obs
    v = verify.check(env, [("ln -s", obs)])
  assert marker not in v.reason and not v.success, v


def test_mtime_fixing_never_touches_the_host_through_a_swapped_folder(term, host_file):
  path, marker = host_file
  folder = os.path.dirname(path)
  term.reset(1)
  # A background loop swaps a folder for a link to the host folder and back, all the time.
  term.step(f"mkdir -p swap; (for i in $(seq 4000); do mv swap swap.d; ln -s {folder} swap; "
            f"rm swap; mv swap.d swap; done) >/dev/null 2>&1 &")
  for _ in range(15):
    out = term.step("touch swap/new_file; ls swap >/dev/null")
    assert "Traceback" not in out
  term.step("kill %1; wait")
  assert os.stat(path).st_mtime == 1_000_000_000
  assert not os.path.exists(os.path.join(folder, "new_file"))


def test_a_churning_background_job_never_breaks_a_step(term):
  term.reset(2)
  term.step("(for i in $(seq 3000); do mkdir -p c/$i/x; rm -rf c/$((i-1)); done) >/dev/null 2>&1 &")
  for _ in range(20):
    assert term.step("ls >/dev/null; echo ok").startswith("ok\n")
  term.step("kill %1; wait")


def test_terminal_verifier_on_fifos_and_devices_returns_at_once():
  with TerminalEnv(time_limit=3.0, task="backup_csv") as env:
    env.reset(0)
    bak, data = env.goal["backup"], env.goal["data"]
    names = [os.path.basename(p) for p in env.files if p.endswith(".csv") and p.startswith(data + "/")]
    first, rest = names[0], names[1:]
    env.step(f"mkdir -p {bak} && cd {bak} && ln -s /dev/zero {first}"
             + (f" && mkfifo {' '.join(rest)}" if rest else "") + "; cd ~")
    t = time.monotonic()
    v = verify.check(env, [])
    assert time.monotonic() - t < 5 and not v.success, v


def test_confined_reads_refuse_links_fifos_and_oversized_files(tmp_path, host_file):
  path, marker = host_file
  root = tmp_path / "ep"
  (root / "d").mkdir(parents=True)
  os.symlink(path, root / "link.txt")
  os.symlink(os.path.dirname(path), root / "dlink")
  os.mkfifo(root / "pipe")
  (root / "big").write_bytes(b"x" * 5000)
  (root / "d" / "ok.txt").write_text("fine")
  assert confined.read_text(str(root), "d/ok.txt") == "fine"
  for rel in ("link.txt", "dlink/host_secret.txt", "pipe", "../ep/link.txt", "/d/../../x"):
    assert confined.read_text(str(root), rel) is None, rel
  with pytest.raises(confined.Refused, match="larger than"):
    confined.read_bytes(str(root), "big", max_bytes=4096)
  with pytest.raises(confined.Refused, match="symbolic link"):
    confined.write_text(str(root), "link.txt", "overwritten")
  assert open(path).read() == marker + "\n"
  assert [k for _, k in confined.listdir(str(root), ".")] == ["file", "dir", "link", "link", "other"]


@pytest.fixture(scope="module")
def swe():
  env = SweEnv(test_timeout=20)
  env.reset(3)
  yield env
  env.close()


def _in_tests(swe, code: str) -> str:
  """Runs `code` from the repository's conftest (agent code under test), then restores it."""
  original = swe.world.files["tests/conftest.py"]
  body = code.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
  swe.step(f'edit(path="tests/conftest.py", old="# shared test setup", new="# shared test setup\\n{body}")')
  out = swe.step(f'run_tests(target="{swe.goal["test_path"]}")')
  confined.write_text(swe.repo, "tests/conftest.py", original)
  return out


def test_swe_view_of_a_fifo_or_link_returns_an_error(swe, host_file):
  path, marker = host_file
  _in_tests(swe, f"import os\nos.path.exists('pipe') or os.mkfifo('pipe')\n"
                 f"os.path.lexists('leak.txt') or os.symlink({path!r}, 'leak.txt')\n"
                 "os.path.lexists('zero') or os.symlink('/dev/zero', 'zero')\n")
  for name in ("pipe", "leak.txt", "zero"):
    t = time.monotonic()
    obs = swe.step(f'view(path="{name}")')
    assert time.monotonic() - t < 5 and obs.startswith("Error:") and marker not in obs, obs
  obs = swe.step(f'edit(path="leak.txt", old="SECRET", new="x")')
  assert obs.startswith("Error:") and open(path).read() == marker + "\n", obs
  assert swe.step('view(path="README.md", start=2, end=-5)').startswith("Error: end line -5")


def test_swe_test_code_cannot_remount_the_interpreter_writable(swe):
  probe = f"lwm_probe_{uuid.uuid4().hex}.pth"
  target = os.path.join(swe.python_paths[0][1], probe)
  out = _in_tests(swe, "import subprocess, sys\n"
                       f"subprocess.run(['mount', '-o', 'remount,bind,rw', sys.prefix])\n"
                       f"try:\n  open({target!r}, 'w').write('import os')\nexcept OSError as e:\n"
                       "  print('refused', e)\n")
  assert not os.path.exists(target), out


def test_swe_verifier_with_a_test_file_swapped_for_a_fifo_returns():
  with SweEnv(test_timeout=3) as env:
    env.reset(4)
    path = env.goal["test_path"]
    _in_tests(env, f"import os\nos.remove({path!r}); os.mkfifo({path!r})\n")
    assert confined.kind(env.repo, path) == "other"
    t = time.monotonic()
    v = verify.check(env, [])
  assert time.monotonic() - t < 15 and not v.success and path in v.reason, v


def test_swe_tests_run_when_the_interpreter_is_reached_through_a_link_under_tmp(tmp_path):
  """Lesser item of issue 68: run_tests exited 127 with a venv reached through a symbolic link."""
  import sys
  link = tmp_path / "venv_link"
  link.symlink_to(sys.prefix)
  code = ("from lwm_jax.envs.swe.env import SweEnv\n"
          "e = SweEnv(test_timeout=30); e.reset(2); print(e.step('run_tests()')); e.close()\n")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([str(link / "bin" / "python"), "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": repo}, timeout=120).stdout
  assert "passed" in out and "[exit code 1]" in out, out[-1500:]


def test_episodes_under_a_folder_the_sandbox_uid_cannot_enter(tmp_path):
  """pytest's own tmp folders are 0700 root: the episode folder is still reachable by bwrap."""
  closed = tmp_path / "closed"
  closed.mkdir(mode=0o700)
  with TerminalEnv(time_limit=3.0, root=str(closed)) as env:
    env.reset(0)
    assert env.step("echo hi > x.txt; cat x.txt").startswith("hi\n")
