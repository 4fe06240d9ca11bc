"""The terminal and SWE sandboxes hold: every escape a hostile command tries leaves no trace outside.

Each probe names a path on the host that must not exist afterwards; the project checkout must not
be readable; no process may outlive close(). These ran unisolated before the sandbox (bash as the
user in a temp dir), where every probe appeared.
"""
import os
import socket
import time
import uuid

import pytest

from lwm_jax.envs import sandbox
from lwm_jax.envs.swe.env import SweEnv
from lwm_jax.envs.terminal.env import TerminalEnv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _processes_with(text: str) -> list[int]:
  """PIDs whose command line contains `text` (read from /proc, like `pgrep -f`)."""
  found = []
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
          if text.encode() in f.read().replace(b"\0", b" "):
            found.append(int(pid))
      except OSError:
        pass
  return found


@pytest.fixture(scope="module")
def term():
  env = TerminalEnv(time_limit=2.0)
  env.reset(5)
  yield env
  env.close()


def _escapes(outside: str) -> list[str]:
  """(command) list: each tries to create the host file `outside` from inside the shell."""
  name = os.path.basename(outside)
  folder = os.path.dirname(outside)
  return [
      f"touch {outside}",
      f"cd ../../../../../..; cd .{folder}; touch {name}",          # `cd ..` chains up to /
      f"echo $(touch {outside}; echo ran)",                        # command substitution
      f"ln -s {folder} out_link; touch out_link/{name}",           # a symlink out
      f"ln -s / root_link; touch root_link{outside}",
      f"python3 -c \"open('{outside}', 'w').write('x')\"",
      f"cp README.md {outside}",
  ]


@pytest.mark.parametrize("k", range(7))
def test_terminal_escape_leaves_no_probe_outside(term, k):
  outside = f"/tmp/lwm_probe_{uuid.uuid4().hex}"
  obs = term.step(_escapes(outside)[k])
  assert not os.path.exists(outside), obs
  term.step("cd ~")


def test_terminal_root_and_system_are_read_only_and_checkout_absent(term):
  probe = f"lwm_probe_{uuid.uuid4().hex}"
  obs = term.step(f"touch /{probe} /usr/{probe} /etc/{probe}")
  assert obs.count("Read-only file system") == 3, obs
  assert not any(os.path.exists(p) for p in (f"/{probe}", f"/usr/{probe}", f"/etc/{probe}"))
  obs = term.step(f"cat {REPO}/setup.py; ls {os.path.dirname(REPO)}; ls /root /home")
  assert "setup(" not in obs and "No such file or directory" in obs
  assert term.step("cat /etc/shadow").startswith("cat: /etc/shadow: No such file")
  # Writes inside the episode directory do work (the sandbox is usable).
  assert term.step("echo kept > mine.txt; cat mine.txt").startswith("kept\n")
  assert os.path.exists(os.path.join(term.home, "mine.txt"))


def test_terminal_has_no_network_even_to_this_machine(term):
  srv = socket.socket()
  srv.bind(("127.0.0.1", 0))
  srv.listen(1)
  port = srv.getsockname()[1]
  try:
    obs = term.step(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\""
                    " && echo CONNECTED")
  finally:
    srv.close()
  assert "CONNECTED" not in obs and "ConnectionRefusedError" in obs, obs


def test_terminal_resource_limits_hold(term):
  assert term.step("ulimit -t; ulimit -v; ulimit -Hv").startswith("300\n4194304\n4194304\n")
  obs = term.step("python3 -c \"b = bytearray(6 * 1024 ** 3)\"")
  assert "MemoryError" in obs
  assert "cannot modify limit" in term.step("ulimit -v unlimited")


_FORKS = ("python3 -c 'import os, time\npids = []\ntry:\n  for _ in range({n}):\n    p = os.fork()\n"
          "    if p == 0:\n      time.sleep(30)\n      os._exit(0)\n    pids.append(p)\n"
          "  print(\"all\", len(pids))\nexcept BlockingIOError:\n  print(\"refused after\", len(pids))\n"
          "for p in pids:\n  os.kill(p, 9)'")


@pytest.mark.skipif(os.geteuid() != 0, reason="for other users `ulimit -u` caps processes")
def test_terminal_process_limit_holds_for_root():
  """The kernel ignores `ulimit -u` for root: a pids cgroup caps the sandbox instead."""
  limit = 48
  env = TerminalEnv(time_limit=20.0, limits=sandbox.Limits(processes=limit))
  env.reset(0)
  try:
    assert env.proc.sandbox_cgroups, "a sandbox started by root gets a pids cgroup"
    obs = env.step(_FORKS.format(n=limit + 30))
  finally:
    env.close()
  assert obs.startswith("refused after "), obs
  assert int(obs.split()[2]) < limit  # the shell and python count too


def test_terminal_close_ends_every_process():
  env = TerminalEnv(time_limit=2.0)
  env.reset(0)
  tag = str(170 + uuid.uuid4().int % 1000) + ".5"
  env.step(f"setsid sleep {tag} & nohup sleep {tag} >/dev/null 2>&1 & disown")
  for _ in range(200):  # the two shells have forked; wait until both run `sleep`
    if len(_processes_with(f"sleep {tag}")) == 2:
      break
    time.sleep(0.01)
  assert len(_processes_with(f"sleep {tag}")) == 2
  env.close()
  assert _processes_with(f"sleep {tag}") == []


def test_sandbox_run_caps_output_and_kills_tree_at_timeout(tmp_path):
  rc, out, timed_out = sandbox.run(["head", "-c", "3000000", "/dev/zero"], cwd=str(tmp_path),
                                   env={"PATH": "/usr/bin:/bin"}, timeout=20, max_output=1000)
  assert (rc, timed_out) == (0, False) and out.endswith("[2999000 more bytes of output dropped]\n")
  tag = str(300 + uuid.uuid4().int % 1000) + ".25"
  rc, _, timed_out = sandbox.run(["bash", "-c", f"setsid sleep {tag} & sleep {tag}"],
                                 cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"}, timeout=0.5,
                                 max_output=1000)
  assert (rc, timed_out) == (124, True)
  assert _processes_with(f"sleep {tag}") == []


def test_without_isolation_the_env_refuses_unless_unsafe(monkeypatch):
  monkeypatch.setattr(sandbox, "_probe_result", "bubblewrap (bwrap) is not installed")
  monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
  with pytest.raises(RuntimeError, match="refuses to start without a sandbox.*unsafe=True"):
    TerminalEnv()
  with pytest.raises(RuntimeError, match="SweEnv refuses"):
    SweEnv()
  with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
    env = TerminalEnv(unsafe=True)
  assert env.isolated is False
  env.reset(1)
  assert env.step("echo $HOME; pwd").startswith("/home/user\n/home/user\n")
  env.close()


@pytest.fixture(scope="module")
def swe():
  env = SweEnv(test_timeout=20)
  env.reset(2)
  yield env
  env.close()


def test_swe_search_and_run_tests_arguments_are_never_options(swe):
  probe = f"/tmp/lwm_probe_{uuid.uuid4().hex}"
  obs = swe.step(f'search(pattern="--open-files-in-pager=touch {probe}")')
  assert obs.startswith("(no matches for /--open-files-in-pager") and not os.path.exists(probe)
  obs = swe.step(f'run_tests(target="--junitxml={probe}")')
  assert obs.startswith("Error: target must be a path or a node id") and not os.path.exists(probe)
  # An option-like path after `--` is only a path.
  assert swe.step('search(pattern="def ", path="--no-index")').startswith("(no matches")


def test_swe_tests_run_inside_the_sandbox(swe):
  probe = f"/tmp/lwm_probe_{uuid.uuid4().hex}"
  tag = str(500 + uuid.uuid4().int % 1000) + ".75"
  code = (f"import subprocess\\nopen({probe!r}, 'w').write('x')\\n"
          f"subprocess.Popen(['setsid', 'sleep', '{tag}'])\\n"
          f"print(open({os.path.join(REPO, 'setup.py')!r}).read())\\n")
  obs = swe.step(f'edit(path="tests/conftest.py", old="# shared test setup", new="# shared test setup\\n{code}")')
  assert obs.startswith("Edited tests/conftest.py.")
  obs = swe.step(f'run_tests(target="{swe.goal["test_path"]}")')
  assert "FileNotFoundError" in obs and "setup.py" in obs, obs  # the checkout is not there
  assert not os.path.exists(probe)
  assert _processes_with(f"sleep {tag}") == []
