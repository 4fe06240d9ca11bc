"""The `swe` environment: a real git repository of a small Python package with one real bug.

`reset(seed)` writes the package `textkit` and its pytest suite into a throwaway directory, injects
one seeded bug, and commits it (fixed author, dates and identity, so hashes repeat). Actions view
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

from lwm_jax.envs import base, sandbox

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

STRINGS = '''"""String helpers."""
import re


def slugify(text):
  """Lower-case words joined by hyphens, punctuation dropped."""
  words = re.findall(r"[a-z0-9]+", text.lower())
  return "-".join(words)


def truncate_words(text, limit):
  """The first `limit` words of `text`, with '...' when words were cut."""
  words = text.split()
  if len(words) <= limit:
    return text
  return " ".join(words[:limit]) + "..."


def count_vowels(text):
  """Number of vowels (a, e, i, o, u) in `text`, any case."""
  return sum(1 for ch in text.lower() if ch in "aeiou")


def is_palindrome(text):
  """True when the letters of `text` read the same both ways."""
  letters = [ch.lower() for ch in text if ch.isalnum()]
  return letters == letters[::-1]
'''
MATHX = '''"""Small numeric helpers."""


def clamp(x, low, high):
  """`x` limited to the closed interval [low, high]."""
  if x < low:
    return low
  if x > high:
    return high
  return x


def mean(values):
  """Arithmetic mean; raises ValueError on an empty sequence."""
  if not values:
    raise ValueError("mean of empty sequence")
  return sum(values) / len(values)


def median(values):
  """Middle value (mean of the two middle values for an even count)."""
  s = sorted(values)
  n = len(s)
  mid = n // 2
  if n % 2 == 1:
    return s[mid]
  return (s[mid - 1] + s[mid]) / 2


def percent_change(old, new):
  """Relative change from `old` to `new` in percent, rounded to 2 decimals."""
  return round((new - old) / old * 100, 2)
'''
TEST_STRINGS = '''from textkit.strings import count_vowels, is_palindrome, slugify, truncate_words


def test_slugify():
  assert slugify("Hello, World!") == "hello-world"
  assert slugify("  A  b  ") == "a-b"


def test_truncate_words():
  assert truncate_words("one two three", 2) == "one two..."
  assert truncate_words("one two", 2) == "one two"


def test_count_vowels():
  assert count_vowels("Programming") == 3
  assert count_vowels("AEIOU xyz") == 5


def test_is_palindrome():
  assert is_palindrome("A man, a plan, a canal: Panama")
  assert not is_palindrome("python")
'''
TEST_MATHX = '''import pytest

from textkit.mathx import clamp, mean, median, percent_change


def test_clamp():
  assert clamp(5, 0, 3) == 3
  assert clamp(-1, 0, 3) == 0
  assert clamp(2, 0, 3) == 2


def test_mean():
  assert mean([1, 2, 3, 4]) == 2.5
  with pytest.raises(ValueError):
    mean([])


def test_median():
  assert median([3, 1, 2]) == 2
  assert median([4, 1, 3, 2]) == 2.5


def test_percent_change():
  assert percent_change(50, 75) == 50.0
  assert percent_change(200, 150) == -25.0
'''
# (file, correct code, buggy code, test that fails, bug report)
BUGS = [
    ("textkit/mathx.py", "  if x > high:\n    return high", "  if x > high:\n    return x",
     "test_clamp", "clamp(5, 0, 3) returns 5; it should return 3."),
    ("textkit/mathx.py", "  return sum(values) / len(values)", "  return sum(values) / (len(values) + 1)",
     "test_mean", "mean([1, 2, 3, 4]) gives 2.0 instead of 2.5."),
    ("textkit/mathx.py", "  return (s[mid - 1] + s[mid]) / 2", "  return (s[mid] + s[mid + 1]) / 2",
     "test_median", "median() of an even number of values raises IndexError or is wrong."),
    ("textkit/mathx.py", "(new - old) / old * 100", "(new - old) / new * 100",
     "test_percent_change", "percent_change(50, 75) reports 33.33 instead of 50.0."),
    ("textkit/strings.py", 'return "-".join(words)', 'return "_".join(words)',
     "test_slugify", "slugify('Hello, World!') gives 'hello_world'; slugs must use hyphens."),
    ("textkit/strings.py", "  if len(words) <= limit:", "  if len(words) < limit:",
     "test_truncate_words", "truncate_words('one two', 2) adds '...' although nothing was cut."),
    ("textkit/strings.py", 'if ch in "aeiou")', 'if ch in "aeio")',
     "test_count_vowels", "count_vowels('AEIOU xyz') returns 4, it misses the u."),
    ("textkit/strings.py", "ch.lower() for ch in text if ch.isalnum()", "ch for ch in text if ch.isalnum()",
     "test_is_palindrome", "is_palindrome('A man, a plan, a canal: Panama') is False."),
]
_GIT_ENV = {"GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
            "GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.com",
            "GIT_AUTHOR_DATE": "2024-06-01T09:00:00+00:00",
            "GIT_COMMITTER_DATE": "2024-06-01T09:00:00+00:00", "GIT_CONFIG_NOSYSTEM": "1"}


class SweEnv(sandbox.SandboxedEnv):
  domain = "swe"

  def __init__(self, root: str | None = None, test_timeout: float = 30.0, unsafe: bool = False,
               limits: sandbox.Limits = sandbox.Limits()) -> None:
    super().__init__(root, unsafe, limits)
    self.test_timeout = test_timeout
    # pytest runs with this interpreter, whose installation is shown read-only in the sandbox.
    self.python_paths = tuple(sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)
                                      if not os.path.realpath(p).startswith("/usr/")}))

  def _env(self) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.inner, "LC_ALL": "C",
            "TZ": "UTC", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "GIT_PAGER": "cat", **_GIT_ENV}

  def _run(self, args: list[str], timeout: float = 30.0) -> tuple[int, str]:
    """Runs a tool in the episode's sandbox, in the repository; returns (exit code, output)."""
    argv = self._argv(args, self.inner_repo, self.python_paths)
    rc, out, timed_out = sandbox.run(argv, cwd=self.repo, env=self._env(), timeout=timeout,
                                     max_output=self.limits.output_bytes)
    return (124, f"[timed out after {timeout:g} s]\n") if timed_out else (rc, out)

  def reset(self, seed: int) -> str:
    rng = self._begin(seed)
    self.inner_repo = os.path.join(self._open_dir("lwm_swe_"), "repo")
    self.repo = os.path.join(self.sandbox, "repo")
    bug_idx = rng.randrange(len(BUGS))
    path, good, bad, test, report = BUGS[bug_idx]
    files = {"README.md": "# textkit\n\nSmall string and number helpers. Run `pytest` to test.\n",
             "textkit/__init__.py": '"""textkit: small helpers."""\n', "textkit/strings.py": STRINGS,
             "textkit/mathx.py": MATHX, "tests/test_strings.py": TEST_STRINGS,
             "tests/test_mathx.py": TEST_MATHX, "setup.cfg": "[tool:pytest]\ntestpaths = tests\n",
             "tests/conftest.py": "import os, sys\nsys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))\n"}
    assert good in files[path]
    files[path] = files[path].replace(good, bad)
    for rel, text in files.items():
      full = os.path.join(self.repo, rel)
      os.makedirs(os.path.dirname(full), exist_ok=True)
      with open(full, "w") as f:
        f.write(text)
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", "textkit: string and math helpers"]):
      rc, out = self._run(cmd)
      if rc:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out}")
    self.goal = {"bug": bug_idx, "path": path, "good": good, "bad": bad, "test": test,
                 "func": test[len("test_"):],
                 "text": f"Bug report: {report} Find the cause, fix it, and make the test suite pass."}
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
    if not isinstance(rel, str) or not rel:
      raise ValueError("path must be a non-empty string")
    full = os.path.realpath(os.path.join(self.repo, rel))
    if full != self.repo and not full.startswith(self.repo + os.sep):
      raise ValueError(f"path '{rel}' is outside the repository")
    return full

  def step(self, action: str) -> str:
    if not self.sandbox:
      raise RuntimeError("call reset(seed) before step()")
    self.steps += 1
    try:
      name, kw = base.parse_call(action, SIGNATURES)
      out = getattr(self, "_do_" + name)(**kw)
    except (ValueError, TypeError) as e:
      out = f"Error: {e}"
    for repo in (self.inner_repo, self.repo):
      out = out.replace(repo, REPO_SHOWN)
    out = out.replace(self.sandbox, "/sandbox")
    out = re.sub(r" in \d+\.\d+s", " in 0.01s", out)
    return base.truncate(out.rstrip("\n") + "\n", self.max_obs_chars)

  def _do_ls(self, path: str = ".") -> str:
    full = self._safe(path)
    if not os.path.isdir(full):
      return f"ls: cannot access '{path}': No such file or directory"
    names = sorted(n + ("/" if os.path.isdir(os.path.join(full, n)) else "")
                   for n in os.listdir(full) if n != ".git")
    return "\n".join(names)

  def _do_view(self, path: str, start: int = 1, end: int | None = None) -> str:
    full = self._safe(path)
    if os.path.isdir(full):
      return f"Error: '{path}' is a directory; use ls"
    if not os.path.exists(full):
      return f"Error: file '{path}' does not exist"
    lines = open(full).read().splitlines()
    if not isinstance(start, int) or start < 1 or start > max(1, len(lines)):
      return f"Error: start line {start} is outside 1..{len(lines)}"
    end = len(lines) if end is None else min(int(end), len(lines))
    return "\n".join(f"{i:4d}  {lines[i - 1]}" for i in range(start, end + 1))

  def _do_search(self, pattern: str, path: str = ".") -> str:
    self._safe(path)
    if not isinstance(pattern, str) or not pattern:
      raise ValueError("pattern must be a non-empty string")
    # `-e` and `--`: neither the pattern nor the path is ever read as an option.
    rc, out = self._run(["git", "grep", "-n", "-E", "-e", pattern, "--", path])
    return out if out else f"(no matches for /{pattern}/)" if rc == 1 else out

  def _do_edit(self, path: str, old: str, new: str) -> str:
    full = self._safe(path)
    if not os.path.isfile(full):
      return f"Error: file '{path}' does not exist"
    text = open(full).read()
    n = text.count(old)
    if n == 0:
      return f"Error: `old` text not found in {path}; nothing changed"
    if n > 1:
      return f"Error: `old` text occurs {n} times in {path}; give more context"
    text = text.replace(old, new)
    with open(full, "w") as f:
      f.write(text)
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
    return out + f"[exit code {rc}]"

  def _do_diff(self) -> str:
    _, out = self._run(["git", "diff"])
    return out or "(no changes)"


class SweAgent(base.PlanAgent):
  """Reproduces the failure, locates the function, fixes it (sometimes after a bad try), re-tests."""

  def make_plan(self, env: base.Env, initial_state: str) -> list[Any]:
    r, g = self.rng, env.goal
    plan: list[Any] = []
    if r.random() < 0.5:
      plan.append(r.choice(['ls()', 'ls(path="textkit")', 'view(path="README.md")', 'ls(path="tests")']))
    if r.random() < 0.15:
      plan.append(r.choice(['view(path="textkit/utils.py")', 'ls(path="src")', 'view("setup.py")']))
    plan.append(r.choice(['run_tests()', 'run_tests(target="tests")',
                          f'run_tests(target="tests/test_{g["path"].split("/")[-1]}")']))
    plan.append(f'search(pattern="def {g["func"]}")')
    plan.append(_view_definition)
    if r.random() < 0.3:
      plan.append(f'view(path="tests/test_{g["path"].split("/")[-1]}")')
    if r.random() < 0.35:  # a bad edit: text that is not in the file, or a wrong fix
      plan.append(repr_edit(g["path"], g["bad"].replace("  ", "    ", 1), g["good"]))
    if r.random() < 0.25:
      wrong = g["bad"].replace("return", "return  ", 1) if "return" in g["bad"] else g["bad"] + " "
      plan += [repr_edit(g["path"], g["bad"], wrong), f'run_tests(target="tests/test_{g["path"].split("/")[-1]}::{g["test"]}")',
               repr_edit(g["path"], wrong, g["good"])]
    else:
      plan.append(repr_edit(g["path"], g["bad"], g["good"]))
    plan.append(f'run_tests(target="tests/test_{g["path"].split("/")[-1]}::{g["test"]}")'
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
