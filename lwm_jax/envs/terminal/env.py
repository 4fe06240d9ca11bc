"""A persistent real bash session in a sandbox (see `sandbox`) with a seeded file tree.

Every command runs in the same `bash` process (so `cd`, variables and functions persist), reads an
empty stdin, is limited in time (children are killed past the limit), and its real output plus
the next prompt line is the observation. A command that ends the shell (`exit`, `kill -9 $$`) or
sends its output elsewhere (`exec >/dev/null`) gets a note and a fresh shell in ~. Determinism:
TZ=UTC, LC_ALL=C, a fixed clock (`date` reads `$LWM_NOW`, which advances one minute per step;
files touched by a command get that time as mtime), $RANDOM seeded, and the home directory shown
as `/home/user`.
"""
from __future__ import annotations

import getpass
import os
import random
import re
import secrets
import select
import shlex
import signal
import subprocess
import time
from typing import Any

from lwm_jax.envs import base, confined, sandbox
from lwm_jax.envs.terminal.worlds import NAMES, generate_world

HOME_SHOWN = "/home/user"
_STATUS_FD, _OUT_FD = 87, 88  # the shell's private status pipe; a copy of its output pipe
_BASH_INIT = r"""
shopt -s expand_aliases
alias ls='ls -C'
date() { local a; for a in "$@"; do case "$a" in -d*|--date*|-r*|--reference*|-s*|--set*)
  command date "$@"; return;; esac; done; command date -d "@$LWM_NOW" "$@"; }
"""
ACTION_SPACE = """\
One bash command line per turn, typed at the prompt of a persistent interactive bash session
(GNU coreutils, grep, sed, awk, find, sort, wc, python3, jq are installed). The shell keeps its
working directory and variables between turns. Each command may run for at most {limit} seconds;
longer ones are killed. Observation: everything the command printed (stdout and stderr
interleaved) followed by the next prompt `USER@sandbox:DIR$ ` (`#` for root)."""

_TASKS = ("count_errors", "sum_region", "find_def", "backup_csv", "rename_notes", "top_users")
# Kinds an episode gets only when asked for (`TerminalEnv(task=...)`), so the corpus's draws stay.
_ON_REQUEST = ("tour",)


# Commands whose exit status 1 is an answer, not a failure: grep found nothing, diff and cmp found
# a difference, a test was false. Status 2 and above from them is still an error.
_ANSWER_ONE = re.compile(r"(?:^|[\s;&|(!`])(?:[ezf]?grep|diff|cmp|test|false|\[\[?)(?=\s|$|[;&|)])")


def step_error(action: str, status: int | None, timed_out: bool, trouble: str) -> str:
  """The terminal's own error signal for one command line: killed by the time limit, the shell
  lost, or a non-zero exit status (`$?` of the line; status 1 of a command in `_ANSWER_ONE` is
  an answer). A failure inside a pipeline whose last command succeeds has status 0 and is not
  counted: the shell does not report it."""
  if timed_out:
    return "killed by the time limit"
  if trouble:
    return trouble
  if status and not (status == 1 and _ANSWER_ONE.search(action)):
    return f"exit status {status}"
  return ""


# What the text of an observation shows as a failure: messages of the shell and coreutils
# (`prog: what: why`), usage lines, Python tracebacks and exception lines, jq/awk/sed errors,
# and this environment's own notes about a killed command or a lost shell.
_ERROR_LINE = re.compile(
    r"^(?:bash: .*|[\w.+/-]+: (?:.*: )?(?:No such file or directory|Permission denied|Is a directory|"
    r"Not a directory|Directory not empty|File exists|Operation not permitted|command not found|"
    r"(?:invalid|unrecognized|illegal|unknown) (?:option|argument|number|operand|field).*|"
    r"missing (?:file )?operand.*|extra operand.*|cannot .*|can't .*|option requires an argument.*|"
    r"no such .*|not found.*|.*: No such file or directory)|"
    r"[Uu]sage: .*|Try '.+ --help' for more information\.|Traceback \(most recent call last\):|"
    r"[A-Z]\w*(?:Error|Exception): .*|jq: error.*|awk: .*|sed: -e expression.*|"
    r"\^C|\[command killed after .*|\[.*; a new shell was started in ~\])$", re.M)


def error(observation: str) -> str:
  """The first line of a terminal observation that shows a failure ("" when none does)."""
  m = _ERROR_LINE.search(observation)
  return m.group(0) if m else ""


class TerminalEnv(sandbox.SandboxedEnv):
  domain = "terminal"

  def __init__(self, time_limit: float = 3.0, root: str | None = None, unsafe: bool = False,
               limits: sandbox.Limits = sandbox.Limits(), names: str = "usual",
               task: str = "") -> None:
    if names not in NAMES:
      raise ValueError(f"TerminalEnv names: expected one of {', '.join(NAMES)}, got {names!r}")
    if task and task not in _TASKS + _ON_REQUEST:
      raise ValueError(f"TerminalEnv task: expected one of {', '.join(_TASKS + _ON_REQUEST)}, "
                       f"got {task!r}")
    super().__init__(root, unsafe, limits)
    self.names = names  # how the worlds name their directories and files (`generate_world`)
    self.task = task    # every episode's task kind ("": drawn per episode from _TASKS)
    self.time_limit = time_limit
    self.home = ""
    self.proc: subprocess.Popen | None = None
    self.files: dict[str, str] = {}
    self.layout: dict[str, Any] = {}  # where this world keeps its log, CSVs, code and notes
    self._status, self._timed_out = None, False  # of the last command line (see `_exchange`)
    self._last_run: tuple[int | None, bool, str] = (None, False, "")

  # -- lifecycle -------------------------------------------------------------------------------
  def reset(self, seed: int) -> str:
    rng = self._begin(seed)
    # Paths as the shell sees them: the episode directory is /sandbox inside the sandbox.
    self.inner_home = os.path.join(self._open_dir("lwm_term_"), "home")
    self.home = os.path.join(self.sandbox, "home")
    world = generate_world(seed, self.names)
    self._set_world(world)
    self.files, self.layout = world["files"], world["layout"]
    for rel, text in sorted(self.files.items()):
      path = os.path.join(self.home, rel)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    self._fix_mtimes(force=True)
    self._hand_over()
    kind = rng.choice(_TASKS)  # drawn even when self.task fixes it: the goal's draws stay
    kind = self.task or kind
    self.goal = self._make_goal(kind, rng)
    self.seed = seed
    self._start_shell()
    listing = "\n".join(sorted(self.files))
    initial = f"Files under ~ (= {HOME_SHOWN}):\n{listing}\n\n{self._prompt()}"
    return self._ready(self.goal["text"], ACTION_SPACE.format(limit=self.time_limit), initial)

  def _start_shell(self) -> None:
    """Starts bash (in its sandbox) in ~; commands come on stdin, status lines on a private pipe."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.inner_home, "TZ": "UTC", "LC_ALL": "C",
           "LANG": "C", "TERM": "dumb", "TMPDIR": os.path.join(self.inner, "tmp"),
           "SOURCE_DATE_EPOCH": str(base.FIXED_EPOCH), "COLUMNS": "80"}
    argv = self._argv(["bash", "--noprofile", "--norc"], self.inner_home)
    status_r, status_w = os.pipe()
    try:
      self.proc = sandbox.popen(argv, pids_max=self.limits.processes, memory_mb=self.limits.memory_mb,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=self.home, env=env,
                                start_new_session=True, pass_fds=(status_w,))
    finally:
      os.close(status_w)
    self.status_fd = status_r
    self.cwd = self.inner_home
    self.shell_pid = 0
    init = (_BASH_INIT + f"RANDOM={self.seed % 32768}\n"
            f"exec {_STATUS_FD}>&{status_w} {status_w}>&- {_OUT_FD}>&1\n")
    self._run_raw(init, quiet=True)

  def _stop_shell(self) -> None:
    if self.proc is not None:
      sandbox.kill_tree(self.proc)
      for f in (self.proc.stdin, self.proc.stdout):
        if f:
          f.close()
      os.close(self.status_fd)
      self.proc = None

  def close(self) -> None:
    self._stop_shell()
    self._remove_dir()

  def episode_meta(self) -> dict[str, Any]:
    meta = {"task_kind": self.goal.get("kind"), "normalised": [
        "sandbox path shown as /home/user", "clock fixed (date, file mtimes)", "TZ=UTC LC_ALL=C",
        "PIDs in bash job messages shown as 1000+step"]}
    if self.names != "usual":
      meta["names"] = self.names
    return meta

  # -- stepping --------------------------------------------------------------------------------
  def step(self, action: str) -> str:
    if self.proc is None:
      raise RuntimeError("call reset(seed) before step()")
    self.steps += 1
    now = base.FIXED_EPOCH + self.steps * base.STEP_SECONDS
    # Commands read an empty stdin: the shell's own stdin carries the next commands.
    out = self._run_raw(f"LWM_NOW={now}\neval {shlex.quote(action)} </dev/null\n")
    self.step_error = step_error(action, *self._last_run)
    self._fix_mtimes()
    out = re.sub(r"bash: (eval: )?line \d+: ", "bash: ", out)
    # Job messages carry real PIDs ("bash: 15820 Killed ..."): renumber them per step.
    out = re.sub(r"^bash: +\d+ ", f"bash: {1000 + self.steps:5d} ", out, flags=re.M)
    for home in (self.inner_home, self.home):
      out = out.replace(home, HOME_SHOWN)
    out = out.replace(self.sandbox, "/sandbox")
    return base.truncate(out, self.max_obs_chars) + self._prompt()

  def state_digest(self) -> str | None:
    """The files under ~ (names, kinds, modes, contents; times are the sandbox clock's)."""
    return confined.tree_digest(self.home) if self.home and os.path.isdir(self.home) else None

  def _prompt(self) -> str:
    cwd = self.cwd
    if cwd == self.inner_home or cwd.startswith(self.inner_home + "/"):
      cwd = "~" + cwd[len(self.inner_home):]
    user = getpass.getuser()
    return f"{user}@sandbox:{cwd}{'#' if user == 'root' else '$'} "

  def _run_raw(self, script: str, quiet: bool = False) -> str:
    """Runs `script` in the shell; returns its output (restarting the shell if it was lost)."""
    out, trouble = self._exchange(script)
    self._last_run = (self._status, self._timed_out, trouble)
    if out and not out.endswith("\n"):
      out += "\n"
    if trouble:
      if self.proc is None or self.shell_pid == 0:
        raise RuntimeError(f"bash failed to start: {trouble}\n{out}")
      self._stop_shell()
      self._start_shell()
      out += f"[{trouble}; a new shell was started in ~]\n"
    return "" if quiet else out

  def _exchange(self, script: str) -> tuple[str, str]:
    """Sends `script` plus a status request; returns (output, why the shell is lost or '').

    The status line goes to a pipe the commands' output never reaches and carries a random
    token, so a command cannot end or fake it by printing text.
    """
    assert self.proc and self.proc.stdin and self.proc.stdout
    token = secrets.token_hex(12)
    # Status: the command's exit code, whether stdout and stderr still reach the env's pipe (a
    # copy of it was kept as fd _OUT_FD when the shell started), the shell's PID and directory.
    script += (f"printf '%s %d ' {token} \"$?\" >&{_STATUS_FD}; [[ /dev/fd/1 -ef /dev/fd/{_OUT_FD} && "
               f"/dev/fd/2 -ef /dev/fd/{_OUT_FD} ]]; printf '%d %d %s\\n' \"$?\" \"$$\" \"$PWD\" "
               f">&{_STATUS_FD}\n")
    try:
      self.proc.stdin.write(script.encode())
      self.proc.stdin.flush()
    except BrokenPipeError:
      return "", self._lost()
    out_fd = self.proc.stdout.fileno()
    buf, status = bytearray(), b""
    size_cap = self.limits.output_bytes
    dropped = 0
    deadline = time.monotonic() + self.time_limit
    timed_out = False
    trouble = ""
    status_line = None
    self._status, self._timed_out = None, False
    while status_line is None:
      left = deadline - time.monotonic()
      if left <= 0 and not timed_out:
        timed_out = True
        self._kill_children()
        deadline = time.monotonic() + 5.0
        continue
      if left <= 0:
        trouble = "the shell did not return after its command was killed"
        break
      ready, _, _ = select.select([out_fd, self.status_fd], [], [], min(left, 0.5))
      if out_fd in ready:
        chunk = os.read(out_fd, 65536)
        keep = chunk[:max(0, size_cap - len(buf))]
        buf += keep
        dropped += len(chunk) - len(keep)
      if self.status_fd in ready:
        chunk = os.read(self.status_fd, 4096)
        if not chunk:
          trouble = self._lost()
          break
        status += chunk
        for line in status.split(b"\n")[:-1]:
          if line.startswith(token.encode() + b" "):
            status_line = line.decode("utf-8", "replace").split(" ", 4)
        status = status[status.rfind(b"\n") + 1:]
      elif not ready and self.proc.poll() is not None:
        trouble = self._lost()
        break
    while select.select([out_fd], [], [], 0)[0]:  # what the command wrote before it ended
      chunk = os.read(out_fd, 65536)
      if not chunk:
        break
      keep = chunk[:max(0, size_cap - len(buf))]
      buf += keep
      dropped += len(chunk) - len(keep)
    out = buf.decode("utf-8", "replace")
    if dropped:
      out += f"\n[{dropped} more bytes of output dropped]"
    self._timed_out = timed_out
    if status_line is not None:
      self._status = int(status_line[1])
      self.shell_pid = self._host_pid(int(status_line[3]))
      self.cwd = status_line[4] if len(status_line) > 4 else self.cwd
      if status_line[2] != "0":
        trouble = "the command redirected the shell's output away"
    if timed_out:
      out = out + ("\n" if out and not out.endswith("\n") else "")
      out += f"^C\n[command killed after {self.time_limit:g} s time limit]"
    return out, trouble

  def _lost(self) -> str:
    """Why the shell is gone (it exited or was killed)."""
    assert self.proc
    try:
      rc = self.proc.wait(2)
    except subprocess.TimeoutExpired:
      return "the shell stopped answering"
    if rc < 0 or rc >= 128:
      sig = -rc if rc < 0 else rc - 128
      try:
        name = signal.Signals(sig).name
      except ValueError:
        name = str(sig)
      return f"the shell was killed by {name}"
    return f"the shell exited with status {rc}"

  def _host_pid(self, inner_pid: int) -> int:
    """The host PID of the shell whose PID inside its namespace is `inner_pid`."""
    assert self.proc
    if self.shell_pid:
      return self.shell_pid
    for pid in [self.proc.pid, *sandbox.descendants(self.proc.pid)]:
      try:
        with open(f"/proc/{pid}/status") as f:
          ns = next(l for l in f if l.startswith("NSpid:")).split()
      except (OSError, StopIteration):
        continue
      if int(ns[-1]) == inner_pid:
        return pid
    return 0

  def _kill_children(self) -> None:
    """Kills every descendant of the shell (never the shell itself)."""
    for pid in sandbox.descendants(self.shell_pid)[::-1] if self.shell_pid else []:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass

  def _fix_mtimes(self, force: bool = False) -> None:
    """Gives files the sandbox clock's time (real time never reaches an observation).

    Confined to the episode directory: no link is followed, a folder swapped for a link while
    this runs is passed over, and entries that vanish meanwhile are skipped."""
    stamp = base.FIXED_EPOCH + self.steps * base.STEP_SECONDS
    confined.stamp_tree(self.sandbox, stamp, None if force else base.FIXED_EPOCH + 10_000_000)

  # -- tasks -----------------------------------------------------------------------------------
  def _make_goal(self, kind: str, rng: random.Random) -> dict[str, Any]:
    lay = self.layout
    goal: dict[str, Any] = {"kind": kind, **{k: lay[k] for k in ("log", "data", "sales", "src", "notes")}}
    if kind == "count_errors":
      goal["text"] = f"Count the ERROR lines in {lay['log']} and write the number to report.txt in the home directory."
    elif kind == "sum_region":
      goal["region"] = rng.choice(lay["regions"])
      goal["text"] = (f"Compute the total {lay['amount']} of the '{goal['region']}' region in "
                      f"{lay['sales']}.")
    elif kind == "find_def":
      goal["func"] = rng.choice(sorted(lay["functions"]))
      goal["text"] = f"Find the file that defines the function `{goal['func']}` and show its definition."
    elif kind == "backup_csv":
      goal["backup"] = lay["backup"]
      goal["text"] = (f"Copy every CSV file under {lay['data']}/ into a new directory {lay['backup']}/ "
                      "and check the copies.")
    elif kind == "rename_notes":
      goal["text"] = f"Rename every .txt file in {lay['notes']}/ to the .md extension."
    elif kind == "tour":
      goal["dirs"] = sorted({os.path.dirname(p) for p in self.files if "/" in p})
      goal["text"] = "List the files of every directory under the home directory."
    else:
      goal["text"] = (f"List the users that appear in {lay['log']} with how often each appears, most "
                      "frequent first.")
    return goal


class TerminalAgent(base.PlanAgent):
  """Explores a little, makes typical mistakes, then carries out the goal step by step."""

  def make_plan(self, env: base.Env, initial_state: str) -> list[Any]:
    r, g = self.rng, env.goal
    log, data, sales, src, notes = g["log"], g["data"], g["sales"], g["src"], g["notes"]
    lay = getattr(env, "layout", {})
    todo = lay.get("todo", f"{notes}/todo.txt")
    plan: list[Any] = []
    explore = ["ls", "ls -la", f"ls {log.rsplit('/', 1)[0]} {data}", "cat README.md", "ls -R", "pwd",
               f"head -n 5 {log}", f"wc -l {log} {sales}", f"cat {todo}", "date", f"ls -l {data}",
               "find . -name '*.py'", f"tail -n 3 {log}", "echo $HOME", "whoami", f"ls {notes}"]
    mistakes = [f"cat {log[:-4]}.txt", "cd reports_old", "sl", f"grep -c ERROR {log.split('/')[0]}x/app.log",
                f"gerp ERROR {log}", f"python3 {src}/missing.py", f"head -n five {sales}", "ls /nonexistent",
                f"awk -F, '{{print $9' {sales}", f"rm {notes}", f"tail -f {log}"]
    for _ in range(r.randint(1, 4)):
      plan.append(r.choice(explore))
    if r.random() < 0.6:
      plan.insert(r.randrange(len(plan) + 1), r.choice(mistakes))
    k = g["kind"]
    if k == "count_errors":
      plan += [f"grep -c ERROR {log}", f"grep -c ERROR {log} > report.txt", "cat report.txt"]
      if r.random() < 0.5:
        plan.insert(-2, f"grep ERROR {log} | head -n 5")
    elif k == "sum_region":
      reg, cols = g["region"], lay["sales_columns"]
      rc, ac = cols.index("region") + 1, cols.index(lay["amount"]) + 1
      plan += [f"head -n 3 {sales}", f"grep ',{reg}' {sales}",
               f"awk -F, '${rc}==\"{reg}\" {{s+=${ac}}} END {{print s+0}}' {sales}"]
    elif k == "find_def":
      plan += [f"grep -rn 'def {g['func']}' {src}", _show_definition]
    elif k == "backup_csv":
      bak, first = g["backup"], sales.rsplit("/", 1)[1]
      plan += [f"ls {data}", f"mkdir {bak}", f"cp {data}/*.csv {bak}/", f"ls -l {bak}",
               f"diff {sales} {bak}/{first} && echo same"]
      if r.random() < 0.4:
        plan.insert(-3, f"mkdir {bak}")  # a second mkdir fails: File exists
    elif k == "tour":
      dirs = list(g["dirs"])
      r.shuffle(dirs)
      plan += [r.choice(["ls {}", "ls {}", "ls -l {}", "ls -a {}"]).format(d) for d in dirs]
      if r.random() < 0.5:
        plan.insert(r.randrange(len(plan) + 1), r.choice(["ls", "ls -R", "ls -l"]))
    elif k == "rename_notes":
      plan += [f"ls {notes}", f"cd {notes}", "for f in *.txt; do mv \"$f\" \"${f%.txt}.md\"; done",
               "ls", "cd " + "/".join([".."] * (notes.count("/") + 1))]
    else:
      if lay.get("log_format") == "keyvalue":
        plan += [f"awk '{{print $4}}' {log} | head -n 3",
                 f"awk '{{print $4}}' {log} | cut -d= -f2 | sort | uniq -c | sort -rn"]
      else:
        plan += [f"awk '{{print $3}}' {log} | head -n 3",
                 f"awk '{{print $3}}' {log} | tr -d '[]' | sort | uniq -c | sort -rn"]
    for _ in range(r.randint(0, 3)):
      plan.insert(r.randrange(len(plan) + 1), r.choice(explore))
    if r.random() < 0.3:
      plan.append(r.choice(["ls", "date", "ls -l", "cat report.txt", f"cat {todo}"]))
    return plan


def _show_definition(observation: str) -> str:
  """Prints the definition that the previous grep found (or greps again)."""
  hit = base.first_hit(observation, r"[\w/]+\.py")
  return "grep -rn 'def ' ." if hit is None else f"sed -n '{hit[1]},{hit[1] + 2}p' {hit[0]}"
