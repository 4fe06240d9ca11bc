"""The `swe` environment: a real git repository of a small Python package with one real bug.

`reset(seed)` writes the generated package of world `seed` (see `swe_worlds`: modules, functions,
tests and one injected bug, all drawn from the seed) into a throwaway directory and commits it (fixed author, dates and identity, so hashes repeat). Actions view
files, grep, edit by exact string replacement, run pytest and show `git diff`; the observations are
those tools' real output, with the sandbox path shown as `/repo` and pytest's run time fixed.
Every tool (git, pytest and whatever code the agent puts in the tests) runs in the episode's
sandbox (see `sandbox`), and no argument of an action is ever read as a command-line option.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any

from lwm_jax.envs import base, confined, sandbox
from lwm_jax.envs.swe.worlds import generate_world

REPO_SHOWN = "/repo"
SIGNATURES = {"view": ("path", "start", "end"), "search": ("pattern", "path"),
              "edit": ("path", "old", "new"), "run_tests": ("target",), "diff": (), "ls": ("path",)}
ACTION_SPACE = """\
One tool call per turn, Python call syntax with literal arguments:
  ls(path=".")                                list a directory of the repository
  view(path, start=1, end=None)               show numbered lines of a file
  search(pattern, path=".")                   git grep -n for a regular expression
  edit(path, old, new)                        replace the one exact occurrence of `old` by `new`
  run_tests(target="tests")                   run pytest (-q, short tracebacks) on a path or node id
  diff()                                      git diff of the working tree
Observation: the real output of the tool (errors included)."""

_GIT_ENV = {"GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
            "GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.com",
            "GIT_AUTHOR_DATE": "2024-06-01T09:00:00+00:00",
            "GIT_COMMITTER_DATE": "2024-06-01T09:00:00+00:00", "GIT_CONFIG_NOSYSTEM": "1"}


_EXIT_RE = re.compile(r"\[exit code (\d+)\]\s*$")


def error(observation: str) -> str:
  """What failed, as the observation shows it ("" when nothing did): a tool's `Error: ...` or
  `ls: cannot access ...` answer, git's `fatal:`/`error:` for a pattern it refused, or a test run
  that ended with an exit code other than 0 (passed) and 1 (tests failed)."""
  first = observation.split("\n", 1)[0]
  if first.startswith(("Error: ", "ls: cannot access ", "fatal: ", "error: ")):
    return first
  m = _EXIT_RE.search(observation)
  return m.group(0) if m and m.group(1) not in ("0", "1") else ""


class SweEnv(sandbox.SandboxedEnv):
  domain = "swe"

  def __init__(self, root: str | None = None, test_timeout: float = 30.0, unsafe: bool = False,
               limits: sandbox.Limits = sandbox.Limits()) -> None:
    super().__init__(root, unsafe, limits)
    self.test_timeout = test_timeout
    # pytest runs with this interpreter, whose installation is shown read-only in the sandbox, at
    # its real place and at the place it was reached by (a venv behind a symbolic link).
    self.python_paths = tuple(sorted({(os.path.realpath(p), q) for p in (sys.prefix, sys.base_prefix)
                                      for q in (os.path.realpath(p), os.path.abspath(p))
                                      if not os.path.realpath(p).startswith("/usr/")}))

  def _env(self) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.inner, "LC_ALL": "C",
            "TZ": "UTC", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "GIT_PAGER": "cat", **_GIT_ENV}

  def _run(self, args: list[str], timeout: float = 30.0) -> tuple[int, str]:
    """Runs a tool in the episode's sandbox, in the repository; returns (exit code, output)."""
    argv = self._argv(args, self.inner_repo, self.python_paths)
    rc, out, timed_out = sandbox.run(argv, cwd=self.repo, env=self._env(), timeout=timeout,
                                     max_output=self.limits.output_bytes, limits=self.limits)
    return (124, f"[timed out after {timeout:g} s]\n") if timed_out else (rc, out)

  def reset(self, seed: int) -> str:
    self._begin(seed)
    self.inner_repo = os.path.join(self._open_dir("lwm_swe_"), "repo")
    self.repo = os.path.join(self.sandbox, "repo")
    world = generate_world(seed)
    self.world = world
    self._set_world(world.to_json())
    files = world.files
    for rel, text in files.items():
      full = os.path.join(self.repo, rel)
      os.makedirs(os.path.dirname(full), exist_ok=True)
      with open(full, "w") as f:
        f.write(text)
    self._hand_over()
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", f"{world.package}: first version"]):
      rc, out = self._run(cmd)
      if rc:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out}")
    self.goal = {"bug": f"{world.func}: {world.bad.strip()}", "path": world.path, "good": world.good,
                 "bad": world.bad, "test": world.test, "func": world.func,
                 "test_path": world.test_path, "package": world.package,
                 "text": f"Bug report: {world.report} Find the cause, fix it, and make the test suite pass."}
    _, head = self._run(["git", "log", "--oneline", "-1"])
    initial = (f"Repository {REPO_SHOWN} (git, branch main, HEAD {head.strip()}); "
               "working tree clean.\nFiles: " + ", ".join(sorted(files)))
    return self._ready(self.goal["text"], ACTION_SPACE, initial)

  def episode_meta(self) -> dict[str, Any]:
    return {"bug": self.goal.get("bug"), "failing_test": self.goal.get("test"),
            "normalised": ["repo path shown as /repo", "pytest run time shown as 0.01s",
                           "git identity and dates fixed"]}

  def close(self) -> None:
    self._remove_dir()

  def _safe(self, rel: Any) -> str:
    """The host path of `rel` inside the repository (a path that leaves it is refused); the
    files themselves are only ever opened through `confined`."""
    if not isinstance(rel, str) or not rel:
      raise ValueError("path must be a non-empty string")
    try:
      names = confined.parts(rel)
    except confined.Refused:
      raise ValueError(f"path '{rel}' is outside the repository") from None
    return os.path.join(self.repo, *names)

  def step(self, action: str) -> str:
    if not self.sandbox:
      raise RuntimeError("call reset(seed) before step()")
    self.steps += 1
    self.step_error = ""
    try:
      name, kw = base.parse_call(action, SIGNATURES)
      out = getattr(self, "_do_" + name)(**kw)
    except (ValueError, TypeError) as e:
      out = self._fail(str(e), "refused")
    for repo in (self.inner_repo, self.repo):
      out = out.replace(repo, REPO_SHOWN)
    out = out.replace(self.sandbox, "/sandbox")
    out = re.sub(r" in \d+\.\d+s", " in 0.01s", out)
    return base.truncate(out.rstrip("\n") + "\n", self.max_obs_chars)

  def _do_ls(self, path: str = ".") -> str:
    self._safe(path)
    if confined.kind(self.repo, path) != "dir":
      self.step_error = "no such folder"
      return f"ls: cannot access '{path}': No such file or directory"
    return "\n".join(n + ("/" if k == "dir" else "") for n, k in confined.listdir(self.repo, path)
                     if n != ".git")

  def _read(self, path: str) -> str | None:
    """The text of a regular file of the repository, None when missing; a link, FIFO or device
    (which the agent's code can leave there) is refused with a clear error, never opened."""
    what = confined.kind(self.repo, path)
    if what is None:
      return None
    if what == "dir":
      raise ValueError(f"'{path}' is a directory; use ls")
    try:
      return confined.read_bytes(self.repo, path, confined.MAX_READ).decode("utf-8", "replace")
    except FileNotFoundError:
      return None
    except OSError as e:
      raise ValueError(f"cannot read '{path}': {e}") from None

  def _do_view(self, path: str, start: int = 1, end: int | None = None) -> str:
    self._safe(path)
    text = self._read(path)
    if text is None:
      return self._fail(f"file '{path}' does not exist", "no such file")
    lines = text.splitlines()
    if not isinstance(start, int) or start < 1 or start > max(1, len(lines)):
      return self._fail(f"start line {start} is outside 1..{len(lines)}", "bad line range")
    if end is not None and (not isinstance(end, int) or end < start):
      return self._fail(f"end line {end} is before start line {start}", "bad line range")
    end = len(lines) if end is None else min(end, len(lines))
    return "\n".join(f"{i:4d}  {lines[i - 1]}" for i in range(start, end + 1))

  def _do_search(self, pattern: str, path: str = ".") -> str:
    self._safe(path)
    if not isinstance(pattern, str) or not pattern:
      raise ValueError("pattern must be a non-empty string")
    # `-e` and `--`: neither the pattern nor the path is ever read as an option.
    rc, out = self._run(["git", "grep", "-n", "-E", "-e", pattern, "--", path])
    if rc > 1:  # 1 is "no match"; above it git refused the pattern or the path
      self.step_error = f"git grep exit status {rc}"
    return out if out else f"(no matches for /{pattern}/)" if rc == 1 else out

  def _do_edit(self, path: str, old: str, new: str) -> str:
    self._safe(path)
    text = self._read(path)
    if text is None:
      return self._fail(f"file '{path}' does not exist", "no such file")
    n = text.count(old)
    if n == 0:
      return self._fail(f"`old` text not found in {path}; nothing changed", "edit refused")
    if n > 1:
      return self._fail(f"`old` text occurs {n} times in {path}; give more context", "edit refused")
    text = text.replace(old, new)
    try:
      confined.write_text(self.repo, path, text)
    except OSError as e:
      raise ValueError(f"cannot write '{path}': {e}") from None
    line = text[:text.index(new)].count("\n") + 1 if new else 1
    lines = text.splitlines()
    lo, hi = max(1, line - 2), min(len(lines), line + new.count("\n") + 2)
    snippet = "\n".join(f"{i:4d}  {lines[i - 1]}" for i in range(lo, hi + 1))
    return f"Edited {path}.\n{snippet}"

  def _do_run_tests(self, target: str = "tests") -> str:
    if not isinstance(target, str) or target.startswith("-"):
      raise ValueError(f"target must be a path or a node id such as tests/test_x.py::test_y, "
                       f"not {target!r}")
    self._safe(target.split("::")[0])
    # pytest reads options even after `--`, hence the check above; `--` is kept for clarity.
    rc, out = self._run([sys.executable, "-m", "pytest", "-q", "--tb=short", "-p", "no:cacheprovider",
                         "--", target], timeout=self.test_timeout)
    if rc not in (0, 1):  # 1: tests ran and some failed, an answer; above it pytest could not run them
      self.step_error = f"pytest exit code {rc}"
    return out + f"[exit code {rc}]"

  def _fail(self, message: str, reason: str) -> str:
    """An error answer: the tool refused the call (`step_error` says why)."""
    self.step_error = reason
    return f"Error: {message}"

  def state_digest(self) -> str | None:
    """The working tree (git's own folder and Python's caches left out)."""
    if not self.sandbox or not os.path.isdir(self.repo):
      return None
    return confined.tree_digest(self.repo, skip=(".git", "__pycache__", ".pytest_cache"))

  def suite_result(self) -> tuple[int, str]:
    """Runs the whole test suite on the working tree as it is now, outside the episode (no step
    is counted, nothing is changed); (pytest exit code, output). Read by the task verifier."""
    return self._run([sys.executable, "-m", "pytest", "-q", "--tb=no", "-p", "no:cacheprovider",
                      "--", "tests"], timeout=self.test_timeout)

  def _do_diff(self) -> str:
    _, out = self._run(["git", "diff"])
    return out or "(no changes)"


class SweAgent(base.PlanAgent):
  """Reproduces the failure, locates the function, fixes it (sometimes after a bad try), re-tests."""

  def make_plan(self, env: base.Env, initial_state: str) -> list[Any]:
    r, g = self.rng, env.goal
    plan: list[Any] = []
    if r.random() < 0.5:
      plan.append(r.choice(['ls()', f'ls(path="{g["package"]}")', 'view(path="README.md")', 'ls(path="tests")']))
    if r.random() < 0.15:
      plan.append(r.choice([f'view(path="{g["package"]}/utils.py")', 'ls(path="src")', 'view("setup.py")']))
    plan.append(r.choice(['run_tests()', 'run_tests(target="tests")',
                          f'run_tests(target="{g["test_path"]}")']))
    plan.append(f'search(pattern="def {g["func"]}")')
    plan.append(_view_definition)
    if r.random() < 0.3:
      plan.append(f'view(path="{g["test_path"]}")')
    if r.random() < 0.35:  # a bad edit: text that is not in the file, or a wrong fix
      plan.append(repr_edit(g["path"], g["bad"].replace("  ", "    ", 1), g["good"]))
    if r.random() < 0.25:
      wrong = g["bad"].replace("return", "return  ", 1) if "return" in g["bad"] else g["bad"] + " "
      plan += [repr_edit(g["path"], g["bad"], wrong), f'run_tests(target="{g["test_path"]}::{g["test"]}")',
               repr_edit(g["path"], wrong, g["good"])]
    else:
      plan.append(repr_edit(g["path"], g["bad"], g["good"]))
    plan.append(f'run_tests(target="{g["test_path"]}::{g["test"]}")'
                if r.random() < 0.4 else "run_tests()")
    if r.random() < 0.7:
      plan.append("diff()")
    if r.random() < 0.3:
      plan.append("run_tests()")
    return plan


def _view_definition(observation: str) -> str:
  """Opens the file around the definition that the previous search found (or searches again)."""
  hit = base.first_hit(observation, r"[\w/]+\.py")
  if hit is None:
    return 'search(pattern="def ")'
  return f'view(path="{hit[0]}", start={max(1, hit[1] - 1)}, end={hit[1] + 10})'


def repr_edit(path: str, old: str, new: str) -> str:
  return f"edit(path={path!r}, old={old!r}, new={new!r})"


def corpus_problem(traj: Any) -> str | None:
  """Why a recorded episode must stay out of a corpus (a call of an undeclared tool), or None;
  the domain record's `corpus_check`."""
  for i, t in enumerate(traj.turns):
    name = t.action.split("(", 1)[0].strip()
    if name not in SIGNATURES:
      return f"turn {i}: undeclared tool {name!r}"
  return None
