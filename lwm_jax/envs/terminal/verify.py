"""The terminal domain's task verifiers (the record's `verifier` and `transcript_verifier`).

`check(env, goal, turns)` judges a finished episode on the real environment's state;
`check_transcript(env, goal, turns)` judges it from the transcript alone, with `env` only reset to
the episode's world. What each checks is listed in `lwm_jax/envs/verify.py` and
`lwm_jax/envs/verify_transcript.py`, which dispatch to these through the domain registry.
"""
from __future__ import annotations

import os
import re
from typing import Any

from lwm_jax.envs import confined
from lwm_jax.envs import verify as V
from lwm_jax.envs.verify import Turns, Verdict, _read, _share, _v
from lwm_jax.envs.verify_transcript import _last


_PROMPT = re.compile(r"^\S+@sandbox:.*[#$] ?$")


def shell_output(observation: str) -> list[str]:
  """A terminal observation's output lines, without the trailing prompt line."""
  lines = observation.splitlines()
  if lines and _PROMPT.match(lines[-1]):
    lines = lines[:-1]
  return lines


def _number(text: str) -> float | None:
  try:
    return float(text.strip())
  except ValueError:
    return None


def last_number_answer(turns: Turns) -> float | None:
  """The output of the last command that printed exactly one number and nothing else."""
  for _, obs in reversed(turns):
    out = [l for l in shell_output(obs) if l.strip()]
    if len(out) == 1 and _number(out[0]) is not None:
      return _number(out[0])
  return None


def _fmt(x: float) -> str:
  return str(int(x)) if float(x).is_integer() else f"{x:.6f}".rstrip("0")


_COUNT_ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s*$")


def last_count_table(turns: Turns) -> list[tuple[int, str]] | None:
  """The last command output made only of `count name` rows (as `uniq -c` prints them)."""
  for _, obs in reversed(turns):
    out = [l for l in shell_output(obs) if l.strip()]
    rows = [_COUNT_ROW.match(l) for l in out]
    if out and all(rows):
      return [(int(m.group(1)), m.group(2)) for m in rows]
  return None


# -- terminal -------------------------------------------------------------------------------------
def _log_users(env_files: dict[str, str], lay: dict[str, Any]) -> dict[str, int]:
  counts: dict[str, int] = {}
  pat = r"\[([^\]]+)\]" if lay.get("log_format") == "bracket" else r"\buser=(\S+)"
  for line in env_files[lay["log"]].splitlines():
    m = re.search(pat, line)
    if m:
      counts[m.group(1)] = counts.get(m.group(1), 0) + 1
  return counts


def _terminal_question(g: dict[str, Any], files: dict[str, str], lay: dict[str, Any],
                       turns: Turns) -> Verdict | None:
  """Verdicts of the terminal tasks that are questions (judged from the transcript alone)."""
  k = g["kind"]
  if k == "sum_region":
    cols = lay["sales_columns"]
    rc, ac = cols.index("region"), cols.index(lay["amount"])
    rows = [l.split(",") for l in files[lay["sales"]].splitlines()[1:] if l]
    total = sum(float(r[ac]) for r in rows if r[rc] == g["region"])
    got = last_number_answer(turns)
    if got is None:
      return _v(False, 0, f"no command printed a lone number; the total is {_fmt(total)}")
    return _v(abs(got - total) < 1e-6, 0, f"answer {_fmt(got)}, total {_fmt(total)}")
  if k == "tour":
    listed = 0
    for d in g["dirs"]:
      names = {os.path.basename(p) for p in files if os.path.dirname(p) == d}
      listed += any(a.split()[:1] == ["ls"] and d in a.split()
                    and names <= set(" ".join(shell_output(o)).split()) for a, o in turns)
    return _share(listed, len(g["dirs"]), "directories listed with all their files")
  if k == "top_users":
    truth = _log_users(files, lay)
    table = last_count_table(turns)
    if table is None:
      return _v(False, 0, f"no command printed a count table; {len(truth)} users in the log")
    got = {name.strip("[]").removeprefix("user="): n for n, name in table}
    right = sum(got.get(u) == n for u, n in truth.items())
    ordered = all(a[0] >= b[0] for a, b in zip(table, table[1:]))
    ok = got == truth and ordered
    return _v(ok, right / max(len(truth), 1) * (1.0 if ordered else 0.5),
              f"{right} of {len(truth)} users counted right, {len(got)} listed, "
              f"{'most frequent first' if ordered else 'not sorted by count'}")
  if k == "find_def":
    path = lay["functions"][g["func"]]
    shown = [(a, o) for a, o in turns if f"def {g['func']}(" in o]
    named = any(path in a or path in o or f"./{path}" in o for a, o in shown)
    if named:
      return _v(True, 1, f"the definition of {g['func']} was shown with its file {path}")
    return _v(False, 0.5 if shown else 0,
              f"definition {'shown without its file' if shown else 'never shown'}; it is in {path}")
  return None


def check(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  files, lay, home = env.files, env.layout, env.home
  q = _terminal_question(g, files, lay, turns)
  if q is not None:
    return q
  k = g["kind"]
  if k == "count_errors":
    n = sum("ERROR" in l for l in files[lay["log"]].splitlines())
    text = _read(home, "report.txt")
    if text is None:
      return _v(False, 0, f"no ~/report.txt (a regular file); the log has {n} ERROR lines")
    text = text.strip()
    return _v(text == str(n), 0, f"report.txt holds {text[:40]!r}, the log has {n} ERROR lines")
  if k == "backup_csv":
    csvs = sorted(p for p in files if p.startswith(lay["data"] + "/") and p.endswith(".csv"))
    done = sum(_read(home, os.path.join(g["backup"], os.path.basename(p))) == files[p] for p in csvs)
    return _share(done, len(csvs), f"CSV files of {lay['data']}/ copied intact to {g['backup']}/")
  if k == "rename_notes":
    txts = sorted(p for p in files if os.path.dirname(p) == lay["notes"] and p.endswith(".txt"))
    done = sum(confined.kind(home, p) is None and _read(home, p[:-4] + ".md") == files[p]
               for p in txts)
    return _share(done, len(txts), f".txt notes of {lay['notes']}/ renamed to .md with their text")
  raise ValueError(f"terminal: unknown goal kind {k!r}")


def check_transcript(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  files, lay = env.files, env.layout
  q = _terminal_question(g, files, lay, turns)
  if q is not None:
    return q
  k = g["kind"]
  if k == "count_errors":
    n = sum("ERROR" in l for l in files[lay["log"]].splitlines())
    hit = _last(turns, lambda a, o: re.search(r"\b(cat|head|tail)\b[^>|]*report\.txt", a) is not None
                and ">" not in a)
    if hit is None:
      return V._v(False, 0, f"report.txt never printed; the log has {n} ERROR lines")
    out = shell_output(hit[1])
    first = out[0].strip() if out else ""
    return V._v(first == str(n), 0, f"report.txt printed as {first[:40]!r}; the log has {n} ERROR lines")
  if k == "backup_csv":
    names = sorted(os.path.basename(p) for p in files if p.startswith(lay["data"] + "/") and p.endswith(".csv"))
    hit = _last(turns, lambda a, o: a.lstrip().startswith("ls") and g["backup"] in a)
    shown = set(" ".join(shell_output(hit[1])).split()) if hit else set()
    return V._share(sum(n in shown for n in names), len(names),
                    f"CSV files listed in the last `ls` of {g['backup']}/")
  if k == "rename_notes":
    txts = sorted(os.path.basename(p) for p in files if os.path.dirname(p) == lay["notes"] and p.endswith(".txt"))
    mds = [t[:-4] + ".md" for t in txts]
    hit = _last(turns, lambda a, o: a.lstrip().startswith("ls")
                and any(x in o.split() for x in txts + mds))
    shown = set(" ".join(shell_output(hit[1])).split()) if hit else set()
    done = sum(m in shown and t not in shown for t, m in zip(txts, mds))
    return V._share(done, len(txts), "notes shown renamed to .md in the last listing")
  raise ValueError(f"terminal: unknown goal kind {k!r}")


# -- swe ------------------------------------------------------------------------------------------
