"""A bounded re-run of the hostile-user campaign of issue 68, tallied the way the issue counts.

  python tools/fuzz_campaign.py [--json benchmarks/results/fuzz_campaign_68.json] [--quick]

Every case plays one thing a hostile or careless user tries (a command in a terminal episode, a
SWE action or test code, a launcher flag, a damaged model folder, a bad request field) and is
judged by its evidence only: `escape` when a marker shows up outside the sandbox, a read-only
place became writable, a capability is held or a host file was read or changed; `data_loss` when
a folder the program did not make lost a file, or a damaged model loaded; `crash` when a
traceback, an unexpected exception type or a hang past the case's bound came back; otherwise
`clean`. Each case has a wall-clock bound (the env's own limits, or a subprocess timeout).
--quick leaves out the launcher subprocesses (they cost ~10 s of CPU each).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from lwm_jax.envs import sandbox, verify
from lwm_jax.envs.swe.env import SweEnv
from lwm_jax.envs.terminal.env import TerminalEnv

CASES: list[tuple[str, str, Callable[[], str]]] = []  # (group, name, case -> outcome)


def case(group: str, name: str):
  def add(fn):
    CASES.append((group, name, fn))
    return fn
  return add


MADE: list[str] = []  # folders the campaign made, removed at its end


def _tmp(prefix: str = "lwm_campaign_") -> str:
  MADE.append(tempfile.mkdtemp(prefix=prefix))
  return MADE[-1]


def _host_secret() -> tuple[str, str]:
  d = _tmp("lwm_campaign_host_")
  os.chmod(d, 0o755)
  marker = f"SECRET-{uuid.uuid4().hex}"
  path = os.path.join(d, "secret.txt")
  with open(path, "w") as f:
    f.write(marker + "\n")
  os.utime(path, (1e9, 1e9))
  return path, marker


# -- escapes: a terminal episode tries to get out ------------------------------------------------
_TERM: dict = {}


def term() -> TerminalEnv:
  if "env" not in _TERM:
    _TERM["env"] = TerminalEnv(time_limit=3.0)
    _TERM["env"].reset(5)
  return _TERM["env"]


def _marker_case(cmd: str) -> Callable[[], str]:
  def run() -> str:
    probe = f"lwm_probe_{uuid.uuid4().hex}"
    spots = [f"/tmp/{probe}", f"/usr/bin/{probe}", f"/usr/{probe}", f"/{probe}", f"/etc/{probe}"]
    term().step(cmd.format(p=probe))
    term().step("cd ~")
    return "escape" if any(os.path.exists(s) for s in spots) else "clean"
  return run


for i, cmd in enumerate([
    "touch /tmp/{p}", "cd ../../../../..; touch tmp/{p}", "ln -s /tmp out_{p}; touch out_{p}/{p}",
    "python3 -c \"open('/tmp/{p}', 'w').write('x')\"", "cp README.md /tmp/{p}",
    "mount -o remount,bind,rw /usr && touch /usr/bin/{p}",
    "mount -o remount,bind,rw / && touch /{p}",
    "mount -t tmpfs none /usr/bin && touch /usr/bin/{p}",
    "unshare -rm sh -c 'mount -o remount,bind,rw /usr; touch /usr/{p}'",
    "python3 -c \"import ctypes; l=ctypes.CDLL(None); l.mount(b'/usr', b'/usr', None, 4096|32, None); open('/usr/{p}','w')\"",
    "mount -o remount,bind,rw /etc/passwd && touch /etc/{p}",
    "echo '|/bin/touch /tmp/{p}' > /proc/sys/kernel/core_pattern; sleep 0.1; kill -SEGV $$",
    "nsenter -t 1 -m touch /tmp/{p}", "chroot / touch /tmp/{p}",
    "python3 -c \"import os; os.setuid(0); open('/tmp/{p}', 'w')\"",
]):
  case("escape", f"terminal: {cmd[:60]}")(_marker_case(cmd))


@case("escape", "terminal: capabilities inside (CapEff, CapBnd = 0)")
def _caps() -> str:
  out = term().step("grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status")
  vals = [int(l.split()[1], 16) for l in out.splitlines() if l.startswith("Cap")]
  return "clean" if len(vals) == 4 and not any(vals) else "escape"


@case("escape", "terminal: ptrace / keyctl / unshare allowed")
def _seccomp() -> str:
  out = term().step("python3 -c 'import ctypes; l = ctypes.CDLL(None); "
                    "print(l.ptrace(0, 0, 0, 0), l.syscall(250, 0, -3, 0), l.unshare(0x10000000))'")
  return "clean" if out.startswith("-1 -1 -1") else "escape"


@case("escape", "terminal verifier follows a link to a host file")
def _verifier_link() -> str:
  path, marker = _host_secret()
  with TerminalEnv(time_limit=3.0, task="count_errors") as env:
    env.reset(0)
    env.step(f"ln -s {path} report.txt")
    v = verify.check(env, [])
  return "escape" if marker in v.reason else "clean"


@case("escape", "mtime fixing follows a folder swapped for a link")
def _mtimes() -> str:
  path, _ = _host_secret()
  folder = os.path.dirname(path)
  with TerminalEnv(time_limit=3.0) as env:
    env.reset(1)
    env.step(f"mkdir -p s; (for i in $(seq 3000); do mv s s.d; ln -s {folder} s; rm s; mv s.d s; "
             "done) >/dev/null 2>&1 &")
    raised = 0
    for _ in range(15):
      try:
        env.step("touch s/new; ls s >/dev/null")
      except Exception:  # noqa: BLE001 - counted
        raised += 1
    env.step("kill %1; wait")
  if os.stat(path).st_mtime != 1e9 or os.path.exists(os.path.join(folder, "new")):
    return "escape"
  return "crash" if raised else "clean"


@case("escape", "SWE: test code remounts the interpreter read-write and drops a .pth")
def _swe_pth() -> str:
  with SweEnv(test_timeout=20) as env:
    env.reset(3)
    target = os.path.join(env.python_paths[0][1], f"lwm_probe_{uuid.uuid4().hex}.pth")
    code = (f"import subprocess, sys\\nsubprocess.run(['mount', '-o', 'remount,bind,rw', sys.prefix])\\n"
            f"try:\\n  open({target!r}, 'w').write('import os')\\nexcept OSError:\\n  pass\\n")
    env.step(f'edit(path="tests/conftest.py", old="import os, sys", new="import os, sys\\n{code}")')
    env.step(f'run_tests(target="{env.goal["test_path"]}")')
  if os.path.exists(target):
    os.remove(target)
    return "escape"
  return "clean"


@case("escape", "SWE: edit() through a link to a host file")
def _swe_edit_link() -> str:
  path, marker = _host_secret()
  with SweEnv(test_timeout=20) as env:
    env.reset(3)
    code = f"import os\\nos.path.lexists('leak.txt') or os.symlink({path!r}, 'leak.txt')\\n"
    env.step(f'edit(path="tests/conftest.py", old="import os, sys", new="import os, sys\\n{code}")')
    env.step(f'run_tests(target="{env.goal["test_path"]}")')
    obs = env.step('view(path="leak.txt")') + env.step('edit(path="leak.txt", old="SECRET", new="x")')
  changed = open(path).read() != marker + "\n"
  return "escape" if changed or marker in obs else "clean"


# -- hangs and resource exhaustion ---------------------------------------------------------------
def _bounded(fn: Callable[[], object], limit: float) -> str:
  t = time.monotonic()
  try:
    fn()
  except Exception:  # noqa: BLE001 - an exception here is a crash of the host side
    return "crash"
  return "clean" if time.monotonic() - t < limit else "crash"


@case("hang", "terminal verifier on a backup of FIFOs and a /dev/zero link")
def _fifo_backup() -> str:
  with TerminalEnv(time_limit=3.0, task="backup_csv") as env:
    env.reset(0)
    bak, data = env.goal["backup"], env.goal["data"]
    names = [os.path.basename(p) for p in env.files if p.endswith(".csv") and p.startswith(data + "/")]
    env.step(f"mkdir -p {bak} && cd {bak} && ln -s /dev/zero {names[0]}; mkfifo {' '.join(names[1:]) or 'x'}; cd ~")
    return _bounded(lambda: verify.check(env, []), 10)


for what, setup in [("a FIFO", "os.mkfifo('p')"), ("a /dev/zero link", "os.symlink('/dev/zero', 'p')")]:
  def _swe_view(setup=setup) -> str:
    with SweEnv(test_timeout=20) as env:
      env.reset(3)
      code = f"import os\\nos.path.lexists('p') or {setup}\\n"
      env.step(f'edit(path="tests/conftest.py", old="import os, sys", new="import os, sys\\n{code}")')
      env.step(f'run_tests(target="{env.goal["test_path"]}")')
      return _bounded(lambda: env.step('view(path="p")'), 10)
  case("hang", f"SWE view() of {what}")(_swe_view)


@case("hang", "SWE verifier with a test file swapped for a FIFO")
def _swe_verifier_fifo() -> str:
  with SweEnv(test_timeout=3) as env:
    env.reset(4)
    path = env.goal["test_path"]
    code = f"import os\\nos.remove({path!r}); os.mkfifo({path!r})\\n"
    env.step(f'edit(path="tests/conftest.py", old="import os, sys", new="import os, sys\\n{code}")')
    env.step(f'run_tests(target="{path}")')
    return _bounded(lambda: verify.check(env, []), 20)


@case("hang", "terminal: a background job churns the listed folder")
def _churn() -> str:
  with TerminalEnv(time_limit=3.0) as env:
    env.reset(2)
    env.step("(for i in $(seq 3000); do mkdir -p c/$i/x; rm -rf c/$((i-1)); done) >/dev/null 2>&1 &")
    return _bounded(lambda: [env.step("ls >/dev/null") for _ in range(20)], 120)


@case("hang", "terminal: memory of two processes together past the sandbox's limit")
def _memory() -> str:
  if sandbox.sandbox_limits.kind() == "none":
    return "crash"
  with TerminalEnv(time_limit=20.0, limits=sandbox.Limits(memory_mb=160)) as env:
    env.reset(0)
    grab = "python3 -c 'import time; b = bytearray(100 << 20); time.sleep(2); print(\"kept\")'"
    out = env.step(f"{grab} & {grab} & wait")
  return "clean" if out.splitlines().count("kept") <= 1 else "escape"


@case("hang", "terminal: filling the disk")
def _disk() -> str:
  with TerminalEnv(time_limit=10.0, limits=sandbox.Limits(disk_mb=8)) as env:
    env.reset(0)
    out = env.step("for i in 1 2 3; do head -c 4000000 /dev/zero > big$i || break; done")
  return "clean" if "No space left" in out else "escape"


@case("hang", "terminal: fork bomb")
def _forks() -> str:
  with TerminalEnv(time_limit=5.0, limits=sandbox.Limits(processes=64)) as env:
    env.reset(0)
    return _bounded(lambda: env.step(":(){ :|:& };:"), 30)


# -- crashes: bad values in the library's faces ----------------------------------------------------
def _clear(fn: Callable[[], object], kinds=(ValueError,)) -> str:
  try:
    fn()
  except kinds:
    return "clean"
  except Exception:  # noqa: BLE001
    return "crash"
  return "crash"  # accepted silently


def _world(**kw) -> dict:
  return {"domain": "os", "task": "t", "action_space": "a", "initial_state": "s", **kw}


def _deep(n: int) -> dict:
  g: dict = {}
  for _ in range(n):
    g = {"g": g}
  return g


from lwm_jax.sim.env import World

for name, fields in [("finish_actions: 5", dict(finish_actions=5)),
                     ("finish_actions: 'abc'", dict(finish_actions="abc")),
                     ("goal nested 50,000 deep", dict(goal=_deep(50_000))),
                     ("task '\\ud800'", dict(task="\ud800")),
                     ("domain 'nope'", dict(domain="nope"))]:
  case("crash", f"World({name})")(lambda fields=fields: _clear(lambda: World.from_dict(_world(**fields))))


@case("crash", "SimulatedEnv action '\\ud800'")
def _sim_action() -> str:
  from lwm_jax.sim.env import SimulatedEnv
  env = SimulatedEnv.__new__(SimulatedEnv)
  env.closed, env.started, env.done, env.turns = False, True, False, []
  return _clear(lambda: env.check_step("\ud800"))


@case("crash", "a truncated tokenizer.model")
def _tok() -> str:
  from lwm_jax.data.tokenizer import load_tokenizer
  d = _tmp()
  p = os.path.join(d, "tokenizer.model")
  with open(p, "wb") as f:
    f.write(open(os.path.join(REPO, "data", "world_model", "tokenizer.model"), "rb").read()[:1000])
  return _clear(lambda: load_tokenizer(p))


@case("crash", "deeply nested predictions file")
def _nested() -> str:
  from lwm_jax.eval import official
  d = _tmp()
  p = os.path.join(d, "p.jsonl")
  with open(p, "w") as f:
    f.write('{"key": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
  return _clear(lambda: official.read_predictions(p))


@case("crash", "HF config.json that is a JSON list")
def _cfg_list() -> str:
  import shutil
  from lwm_jax import checkpoints
  d = _tmp()
  shutil.copytree(os.path.join(REPO, "data", "world_model"), os.path.join(d, "m"))
  with open(os.path.join(d, "m", "config.json"), "w") as f:
    f.write("[1]")
  return _clear(lambda: checkpoints.load(os.path.join(d, "m"), tokenizer=object()))


# -- data loss and silent corruption ---------------------------------------------------------------
@case("data_loss", "HF folder with 4 KB of 0xff in model.safetensors loads")
def _damaged_hf() -> str:
  import shutil
  from lwm_jax import hf
  d = _tmp()
  m = os.path.join(d, "m")
  shutil.copytree(os.path.join(REPO, "data", "world_model"), m)
  w = os.path.join(m, "model.safetensors")
  with open(w, "r+b") as f:
    f.seek(os.path.getsize(w) // 2)
    f.write(b"\xff" * 4096)
  try:
    hf.load_pretrained(m)
  except hf.CheckpointError as e:
    return "clean" if "model.safetensors" in str(e) else "crash"
  except Exception:  # noqa: BLE001
    return "crash"
  return "data_loss"


LAUNCHERS = [
    ("launch/rl_experiment.py", "config.workdir", ["--config.corpus=/nope"]),
    ("launch/rl_experiment.py", "config.workdir", []),
    ("launch/agent_experiment.py", "config.out", ["--config.domain=nope"]),
    ("launch/agent_experiment.py", "config.out", ["--config.arms=bogus"]),
    ("launch/agent_experiment.py", "config.out", ["--config=configs/agent_experiment.py:full",
                                                  "--config.arms=sim"]),
    ("launch/agent_experiment.py", "config.out", ["--config.arms=bc"]),
    ("launch/reproduce.py", "config.workdir", ["--config=configs/reproduce.py:tiny"]),
    ("launch/copy_drill.py", "out", [f"--start={os.path.join(REPO, 'data', 'world_model')}"]),
]


def launcher_cases() -> None:
  def run(script: str, flag: str, extra: list[str]) -> str:
    d = _tmp("lwm_campaign_user_")
    with open(os.path.join(d, "notes.txt"), "w") as f:
      f.write("the user's notes\n")
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    try:
      # the folder flag last: an override of a --config field must follow that --config
      p = subprocess.run([sys.executable, os.path.join(REPO, script), *extra, f"--{flag}={d}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
      return "crash"
    if not os.path.exists(os.path.join(d, "notes.txt")):
      return "data_loss"
    return "clean" if p.returncode != 0 and "Traceback" not in p.stdout + p.stderr else "crash"
  for script, flag, extra in LAUNCHERS:
    case("data_loss", f"{os.path.basename(script)} --{flag}=USER_FOLDER {' '.join(extra)}")(
        lambda s=script, f=flag, e=extra: run(s, f, e))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", default="")
  ap.add_argument("--quick", action="store_true")
  args = ap.parse_args()
  if not args.quick:
    launcher_cases()
  results = []
  t0 = time.time()
  for group, name, fn in CASES:
    t = time.monotonic()
    try:
      outcome = fn()
    except Exception as e:  # noqa: BLE001 - the campaign itself never stops on a case
      outcome = "crash"
      name += f" [{type(e).__name__}: {str(e)[:80]}]"
    results.append({"group": group, "case": name, "outcome": outcome,
                    "seconds": round(time.monotonic() - t, 2)})
    print(f"{outcome:9s} {group:9s} {name}", flush=True)
  if "env" in _TERM:
    _TERM["env"].close()
  import shutil
  for d in MADE:
    shutil.rmtree(d, ignore_errors=True)
  totals = {k: sum(r["outcome"] == k for r in results) for k in ("clean", "crash", "data_loss", "escape")}
  summary = {"cases": len(results), **totals, "seconds": round(time.time() - t0),
             "host_euid": os.geteuid(), "sandbox": sandbox.describe(), "results": results}
  print(json.dumps({k: v for k, v in summary.items() if k != "results"}))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(summary, f, indent=1)


if __name__ == "__main__":
  main()
