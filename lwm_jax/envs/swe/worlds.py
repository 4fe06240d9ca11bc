"""Generated repositories for the `swe` environment: a small Python package, its pytest suite and
one injected bug, all decided by the world's seed.

A world draws a package name, two or three modules (each a themed group of functions under a
drawn module name), the functions in them (each under one of several realistic names), the test
inputs, and one bug out of the chosen functions' known bugs. Expected values in the tests are
computed by running the correct code here, and the bug is kept only when running the buggy code
on the same inputs makes exactly one test fail: the test of the broken function (functions never
call each other, so no other test can notice).
"""
from __future__ import annotations

import dataclasses
import random
import re
from typing import Any

# A function template: names it may get, its source (with {n} for the name), input generator
# (rng -> argument tuple) and known bugs (exact text of the correct code, text that replaces it).
Fn = dict


def _words(rng: random.Random, lo: int, hi: int) -> str:
  pool = ("alpha", "Beta", "data", "Node", "river", "stone", "Light", "quiet", "rapid", "Maple",
          "ocean", "level", "radar", "civic", "Noon", "open", "Sky", "tree", "kayak", "Pixel")
  return " ".join(rng.choice(pool) for _ in range(rng.randint(lo, hi)))


def _ints(rng: random.Random, lo: int, hi: int, n_lo: int = 1, n_hi: int = 7) -> list[int]:
  return [rng.randint(lo, hi) for _ in range(rng.randint(n_lo, n_hi))]


TEXT: dict[str, Fn] = {
    "slugify": {
        "names": ("slugify", "make_slug", "to_slug"), "imports": ("re",),
        "src": '''def {n}(text):
  """Lower-case words of `text` joined by hyphens, punctuation dropped."""
  words = re.findall(r"[a-z0-9]+", text.lower())
  return "-".join(words)
''',
        "args": lambda r: (rng_title(r) + rng_choice(r, ["!", ", v2", " 3.0", "?", " & co"]),),
        "bugs": (('return "-".join(words)', 'return "_".join(words)'),
                 ('r"[a-z0-9]+"', 'r"[a-z]+"'))},
    "truncate_words": {
        "names": ("truncate_words", "shorten", "clip_words"), "imports": (),
        "src": '''def {n}(text, limit):
  """The first `limit` words of `text`, with '...' appended when words were cut."""
  words = text.split()
  if len(words) <= limit:
    return text
  return " ".join(words[:limit]) + "..."
''',
        "args": lambda r: (lambda t: (t, r.randint(1, len(t.split()) + 1)))(_words(r, 1, 5)),
        "bugs": (("  if len(words) <= limit:", "  if len(words) < limit:"),
                 ('" ".join(words[:limit])', '" ".join(words[:limit - 1])'))},
    "count_vowels": {
        "names": ("count_vowels", "vowel_count", "num_vowels"), "imports": (),
        "src": '''def {n}(text):
  """Number of vowels (a, e, i, o, u) in `text`, in either case."""
  return sum(1 for ch in text.lower() if ch in "aeiou")
''',
        "args": lambda r: (_words(r, 1, 4),),
        "bugs": (('if ch in "aeiou")', 'if ch in "aeio")'), ("for ch in text.lower() if", "for ch in text if"))},
    "is_palindrome": {
        "names": ("is_palindrome", "reads_same_backwards", "palindromic"), "imports": (),
        "src": '''def {n}(text):
  """True when the letters and digits of `text` read the same both ways, ignoring case."""
  letters = [ch.lower() for ch in text if ch.isalnum()]
  return letters == letters[::-1]
''',
        "args": lambda r: (rng_choice(r, ["Level", "Never odd or even", "kayak!", "Rotor", "python",
                                          "Step on no pets", "abca", "Madam, in Eden", "data"]),),
        "bugs": (("ch.lower() for ch in text if ch.isalnum()", "ch for ch in text if ch.isalnum()"),
                 ("ch.lower() for ch in text if ch.isalnum()", "ch.lower() for ch in text"))},
    "title_case": {
        "names": ("title_case", "capitalize_words", "headline"), "imports": (),
        "src": '''def {n}(text):
  """Each word of `text` with its first letter upper-case and the rest lower-case."""
  return " ".join(w[:1].upper() + w[1:].lower() for w in text.split())
''',
        "args": lambda r: (_words(r, 1, 4).replace("a", rng_choice(r, ["a", "A"])),),
        "bugs": (("w[1:].lower()", "w[1:]"), ("w[:1].upper() + w[1:]", "w[:1].upper() + w[2:]"))},
    "word_count": {
        "names": ("word_count", "count_words", "word_frequencies"), "imports": ("re",),
        "src": '''def {n}(text):
  """How often each word occurs in `text`, case-insensitively, as a dict."""
  counts = {{}}
  for word in re.findall(r"[a-z']+", text.lower()):
    counts[word] = counts.get(word, 0) + 1
  return counts
''',
        "args": lambda r: (_words(r, 2, 7),),
        "bugs": (("text.lower())", "text)"), ("counts.get(word, 0) + 1", "counts.get(word, 1)"))},
    "initials": {
        "names": ("initials", "name_initials", "monogram"), "imports": (),
        "src": '''def {n}(name):
  """Upper-case initials of the words of `name` ("ada  lovelace" -> "AL")."""
  return "".join(part[0].upper() for part in name.split())
''',
        "args": lambda r: (rng_choice(r, [" ", "  "]).join(r.sample(["ada", "grace", "alan", "Lin",
                                                                     "edsger", "barbara", "ken"], 2)),),
        "bugs": (("name.split())", 'name.split(" "))'), ("part[0].upper()", "part[0]"))},
}

NUMBERS: dict[str, Fn] = {
    "clamp": {
        "names": ("clamp", "bound", "limit_to"), "imports": (),
        "src": '''def {n}(x, low, high):
  """`x` limited to the closed interval [low, high]."""
  if x < low:
    return low
  if x > high:
    return high
  return x
''',
        "args": lambda r: (r.randint(-20, 40), r.randint(-5, 5), r.randint(10, 25)),
        "bugs": (("  if x > high:\n    return high", "  if x > high:\n    return x"),
                 ("  if x < low:\n    return low", "  if x < low:\n    return high"))},
    "mean": {
        "names": ("mean", "average", "arithmetic_mean"), "imports": (),
        "src": '''def {n}(values):
  """Arithmetic mean of `values`; raises ValueError when there are none."""
  if not values:
    raise ValueError("mean of an empty sequence")
  return sum(values) / len(values)
''',
        "args": lambda r: (_ints(r, 0, 50, 2, 6),),
        "bugs": (("sum(values) / len(values)", "sum(values) / (len(values) + 1)"),
                 ("sum(values) / len(values)", "sum(values[1:]) / len(values)"))},
    "median": {
        "names": ("median", "middle_value", "median_of"), "imports": (),
        "src": '''def {n}(values):
  """Middle value of `values` (the mean of the two middle ones for an even count)."""
  s = sorted(values)
  mid = len(s) // 2
  if len(s) % 2 == 1:
    return s[mid]
  return (s[mid - 1] + s[mid]) / 2
''',
        "args": lambda r: (_ints(r, 0, 30, 3, 6),),
        "bugs": (("(s[mid - 1] + s[mid]) / 2", "(s[mid] + s[mid + 1]) / 2"),
                 ("  s = sorted(values)", "  s = list(values)"))},
    "percent_change": {
        "names": ("percent_change", "pct_change", "relative_change"), "imports": (),
        "src": '''def {n}(old, new):
  """Change from `old` to `new` in percent of `old`, rounded to 2 decimals."""
  return round((new - old) / old * 100, 2)
''',
        "args": lambda r: (r.choice([20, 40, 50, 80, 200, 250]), r.randint(10, 300)),
        "bugs": (("(new - old) / old * 100", "(new - old) / new * 100"),
                 ("(new - old) / old * 100", "(old - new) / old * 100"))},
    "to_fahrenheit": {
        "names": ("to_fahrenheit", "celsius_to_fahrenheit", "c_to_f"), "imports": (),
        "src": '''def {n}(celsius):
  """Degrees Fahrenheit for `celsius`, rounded to one decimal."""
  return round(celsius * 9 / 5 + 32, 1)
''',
        "args": lambda r: (r.randint(-30, 45),),
        "bugs": (("celsius * 9 / 5 + 32", "celsius * 5 / 9 + 32"), ("celsius * 9 / 5 + 32", "(celsius + 32) * 9 / 5"))},
    "apply_discount": {
        "names": ("apply_discount", "discounted_price", "price_after_discount"), "imports": (),
        "src": '''def {n}(price, percent):
  """`price` reduced by `percent` per cent, rounded to cents."""
  return round(price * (100 - percent) / 100, 2)
''',
        "args": lambda r: (r.choice([9.99, 20, 45.5, 120, 7.25, 300]), r.choice([5, 10, 15, 25, 50])),
        "bugs": (("price * (100 - percent) / 100", "price * (100 - percent) / 10"),
                 ("price * (100 - percent) / 100", "price - percent"))},
    "safe_divide": {
        "names": ("safe_divide", "divide_or", "ratio"), "imports": (),
        "src": '''def {n}(a, b, default=0):
  """`a / b`, or `default` when `b` is zero."""
  if b == 0:
    return default
  return a / b
''',
        "args": lambda r: (r.randint(0, 40), r.choice([0, 0, 2, 4, 5, 8]), r.choice([0, -1])),
        "bugs": (("  if b == 0:", "  if a == 0:"), ("  return a / b", "  return a // b"))},
    "is_leap_year": {
        "names": ("is_leap_year", "leap_year", "is_leap"), "imports": (),
        "src": '''def {n}(year):
  """True for Gregorian leap years."""
  return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
''',
        "args": lambda r: (r.choice([1900, 2000, 2023, 2024, 2100, 1996, 2400, 2019]),),
        "bugs": (("(year % 100 != 0 or year % 400 == 0)", "year % 100 != 0"),
                 ("year % 4 == 0 and", "year % 4 == 0 or"))},
}

SEQS: dict[str, Fn] = {
    "chunk": {
        "names": ("chunk", "batched", "split_every"), "imports": (),
        "src": '''def {n}(items, size):
  """`items` cut into consecutive lists of `size` (the last one may be shorter)."""
  return [items[i:i + size] for i in range(0, len(items), size)]
''',
        "args": lambda r: (_ints(r, 0, 9, 2, 8), r.randint(2, 3)),
        "bugs": (("items[i:i + size]", "items[i:i + size - 1]"),
                 ("range(0, len(items), size)", "range(0, len(items) - 1, size)"))},
    "dedupe": {
        "names": ("dedupe", "unique", "drop_duplicates"), "imports": (),
        "src": '''def {n}(items):
  """`items` without repeats, each kept where it first occurs."""
  seen = set()
  out = []
  for item in items:
    if item not in seen:
      seen.add(item)
      out.append(item)
  return out
''',
        "args": lambda r: (_ints(r, 0, 5, 3, 8),),
        "bugs": (("      seen.add(item)\n      out.append(item)", "      out.append(item)"),
                 ("      out.append(item)\n  return out", "      out.append(item)\n  return sorted(out)"))},
    "running_total": {
        "names": ("running_total", "cumulative_sum", "prefix_sums"), "imports": (),
        "src": '''def {n}(values):
  """The running sums of `values` ([1, 2, 3] -> [1, 3, 6])."""
  out = []
  total = 0
  for v in values:
    total += v
    out.append(total)
  return out
''',
        "args": lambda r: (_ints(r, -5, 20, 2, 6),),
        "bugs": (("    total += v\n    out.append(total)", "    out.append(total)\n    total += v"),
                 ("    total += v", "    total = v"))},
    "rotate": {
        "names": ("rotate", "rotate_left", "shift_items"), "imports": (),
        "src": '''def {n}(items, k):
  """`items` rotated left by `k` places."""
  if not items:
    return []
  k %= len(items)
  return items[k:] + items[:k]
''',
        "args": lambda r: (_ints(r, 0, 9, 3, 6), r.randint(1, 8)),
        "bugs": (("items[k:] + items[:k]", "items[-k:] + items[:-k]"), ("  k %= len(items)\n  return", "  return"))},
    "parse_duration": {
        "names": ("parse_duration", "duration_minutes", "to_minutes"), "imports": ("re",),
        "src": '''def {n}(text):
  """Minutes in a duration such as '1h30m', '45m' or '2h'."""
  m = re.fullmatch(r"(?:(\\d+)h)?(?:(\\d+)m)?", text.strip())
  if not m or not text.strip():
    raise ValueError(f"bad duration: {{text!r}}")
  hours = int(m.group(1) or 0)
  minutes = int(m.group(2) or 0)
  return hours * 60 + minutes
''',
        "args": lambda r: (rng_choice(r, [f"{r.randint(1, 9)}h{r.randint(1, 59)}m", f"{r.randint(1, 90)}m",
                                          f"{r.randint(1, 5)}h"]),),
        "bugs": (("hours * 60 + minutes", "hours * 100 + minutes"), ("int(m.group(2) or 0)", "int(m.group(2) or 1)"))},
}

GROUPS = {"text": (TEXT, ("strings", "text", "textutil", "words")),
          "numbers": (NUMBERS, ("mathx", "numeric", "calc", "arith")),
          "seqs": (SEQS, ("seqs", "listutil", "sequences", "iters"))}
PACKAGES = ("textkit", "toolbelt", "utilkit", "minilib", "handy", "stdplus", "corekit", "snippets",
            "pyhelpers", "bitsnbobs", "commons", "quickutils")


def rng_choice(r: random.Random, options: list[str]) -> str:
  return r.choice(options)


def rng_title(r: random.Random) -> str:
  return _words(r, 1, 3).title()


@dataclasses.dataclass
class Repo:
  """A generated repository: its files, the bug and what the agent needs to know about it."""
  package: str
  files: dict[str, str]         # relative path -> text (the bug already injected)
  path: str                     # module file with the bug
  good: str                     # correct code, replaced in `path` by `bad`
  bad: str
  func: str                     # the broken function
  test: str                     # its test (the only one that fails)
  test_path: str
  report: str                   # the bug report, written from the buggy code's real result
  functions: dict[str, str]     # function name -> module file defining it
  tests: dict[str, str]         # test name -> test file

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _call(src: str, imports: tuple[str, ...], name: str, args: tuple) -> tuple[str, Any]:
  """Runs `name(*args)` from `src`; ("ok", value) or ("raise", exception class name)."""
  scope: dict[str, Any] = {m: __import__(m) for m in imports}
  exec(compile(src, "<generated>", "exec"), scope)
  try:
    return "ok", scope[name](*args)
  except Exception as e:  # the buggy code may raise; that is the symptom to report
    return "raise", type(e).__name__


def _fmt_call(name: str, args: tuple) -> str:
  return f"{name}({', '.join(repr(a) for a in args)})"


def generate_world(seed: int) -> Repo:
  """The repository of world `seed` (pure and deterministic)."""
  r = random.Random(f"swe-world-{seed}")
  package = r.choice(PACKAGES)
  groups = r.sample(sorted(GROUPS), r.choice([2, 2, 3]))
  files: dict[str, str] = {}
  functions: dict[str, str] = {}
  tests: dict[str, str] = {}
  plans = []  # (module path, test path, [(key, fn, name, cases)])
  for g in sorted(groups):
    pool, mod_names = GROUPS[g]
    mod = r.choice(mod_names)
    keys = r.sample(sorted(pool), r.randint(3, min(5, len(pool))))
    chosen = []
    for key in keys:
      fn = pool[key]
      name = r.choice(fn["names"])
      cases = [fn["args"](r) for _ in range(r.randint(2, 3))]
      chosen.append((key, fn, name, cases))
    plans.append((f"{package}/{mod}.py", f"tests/test_{mod}.py", chosen, mod))
  # The bug: one known bug of one chosen function, with a test input that shows it; bugs whose
  # text is not unique in the module (edits must name one place) are passed over.
  candidates = [(p, c) for p in plans for c in p[2]]
  r.shuffle(candidates)
  for (mod_path, test_path, chosen, _), (key, fn, bug_name, cases) in candidates:
    module_src = "".join(f["src"].format(n=n) for _, f, n, _ in chosen)
    bugs = [b for b in fn["bugs"] if module_src.count(b[0]) == 1
            and module_src.replace(b[0], b[1], 1).count(b[1]) == 1]
    if not bugs:
      continue
    good, bad = r.choice(bugs)
    src = fn["src"].format(n=bug_name)
    buggy = src.replace(good, bad, 1)
    for _ in range(200):
      if any(_call(src, fn["imports"], bug_name, a) != _call(buggy, fn["imports"], bug_name, a)
             for a in cases):
        break
      cases.append(fn["args"](r))
      if len(cases) > 4:
        cases.pop(0)
    else:
      continue
    break
  else:
    raise RuntimeError(f"swe world {seed}: no bug of the chosen functions can be shown by a test")
  for path, tpath, chosen_m, mod in plans:
    imports = sorted({i for _, f, _, _ in chosen_m for i in f["imports"]})
    head = "".join(f"import {i}\n" for i in imports)
    blocks = []
    test_blocks = []
    for _, f, name, cs in chosen_m:
      code = f["src"].format(n=name)
      blocks.append(code)
      functions[name] = path
      tests[f"test_{name}"] = tpath
      lines = []
      for a in cs:
        kind, val = _call(code, f["imports"], name, a)
        assert kind == "ok", (name, a, val)
        if isinstance(val, bool):
          lines.append(f"  assert {'' if val else 'not '}{_fmt_call(name, a)}\n")
        else:
          lines.append(f"  assert {_fmt_call(name, a)} == {val!r}\n")
      test_blocks.append(f"def test_{name}():\n" + "".join(lines))
    doc = f'"""{mod.capitalize()} helpers of {package}."""\n'
    files[path] = doc + head + "\n\n" + "\n\n".join(blocks)
    names = sorted(n for _, _, n, _ in chosen_m)
    files[tpath] = (f"from {package}.{mod} import {', '.join(names)}\n\n\n" + "\n\n".join(test_blocks))
  files[mod_path] = files[mod_path].replace(good, bad, 1)
  # The report: the first test input whose result the bug changes, with both results.
  for a in cases:
    ok, bug = _call(src, fn["imports"], bug_name, a), _call(buggy, fn["imports"], bug_name, a)
    if ok != bug:
      got = f"raises {bug[1]}" if bug[0] == "raise" else f"returns {bug[1]!r}"
      report = f"{_fmt_call(bug_name, a)} {got}; it should return {ok[1]!r}."
      break
  files[f"{package}/__init__.py"] = f'"""{package}: small helpers."""\n'
  files["README.md"] = (f"# {package}\n\n{_readme_line(r, groups)}\nRun `pytest` to test.\n")
  # pytest puts the repository root on the import path (`pythonpath`), so the tests import the
  # package as its users would
  files["setup.cfg"] = "[tool:pytest]\ntestpaths = tests\npythonpath = .\n"
  files["tests/conftest.py"] = ("# shared test setup\n"
                                "# (setup.cfg puts the repository root on the import path)\n")
  return Repo(package=package, files=dict(sorted(files.items())), path=mod_path, good=good,
              bad=bad, func=bug_name, test=f"test_{bug_name}", test_path=test_path, report=report,
              functions=functions, tests=tests)


def _readme_line(r: random.Random, groups: list[str]) -> str:
  what = {"text": "string", "numbers": "number", "seqs": "list"}
  kinds = [what[g] for g in sorted(groups)]
  return r.choice(["Small {} helpers.", "Helpers for {} handling.", "A grab bag of {} utilities."]).format(
      ", ".join(kinds[:-1]) + " and " + kinds[-1])


def check_consistent(repo: Repo) -> list[str]:
  """Problems with `repo` (empty when consistent): every test calls a function defined in the
  module it imports from, and the bug text sits in the broken function's module."""
  problems = []
  for test, tpath in repo.tests.items():
    body = repo.files[tpath]
    func = test[len("test_"):]
    mod = repo.functions.get(func)
    if mod is None or not re.search(rf"^def {func}\(", repo.files[mod], re.M):
      problems.append(f"{test}: no definition of {func}")
    elif f"from {mod[:-3].replace('/', '.')} import" not in body:
      problems.append(f"{tpath} does not import from {mod}")
  if repo.files[repo.path].count(repo.bad) != 1:
    problems.append("bug text not found exactly once")
  return problems


def check_with_pytest(repo: Repo, workdir: str, python: str) -> list[str]:
  """Runs the real test suite of `repo` in `workdir` (a fresh directory) with the bug and after
  the fix; returns problems (empty when only the targeted test fails and the fix passes all)."""
  import os
  import subprocess
  for rel, text in repo.files.items():
    os.makedirs(os.path.join(workdir, os.path.dirname(rel)), exist_ok=True)
    with open(os.path.join(workdir, rel), "w") as f:
      f.write(text)
  env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
  env.pop("PYTHONPATH", None)
  cmd = [python, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "tests"]
  problems = []
  out = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True).stdout
  failed = sorted(set(re.findall(r"^FAILED \S+::(\w+)", out, re.M)))
  if failed != [repo.test]:
    problems.append(f"with the bug, failing tests are {failed}, expected [{repo.test}]")
  path = os.path.join(workdir, repo.path)
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text.replace(repo.bad, repo.good, 1))
  proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
  if proc.returncode != 0 or f"{len(repo.tests)} passed" not in proc.stdout:
    problems.append(f"after the fix the suite does not pass:\n{proc.stdout[-800:]}")
  return problems


if __name__ == "__main__":
  # python -m lwm_jax.envs.swe.worlds N: runs the real suites of worlds 0..N-1, buggy and fixed.
  import sys
  import tempfile
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
  bad = 0
  for seed in range(n):
    with tempfile.TemporaryDirectory() as d:
      problems = check_with_pytest(generate_world(seed), d, sys.executable)
    if problems:
      bad += 1
      print(f"world {seed}: " + "; ".join(problems))
  print(f"{n - bad} of {n} worlds: only the targeted test fails with the bug, all pass after the fix")
  sys.exit(1 if bad else 0)
