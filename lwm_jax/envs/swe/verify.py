"""The swe domain's task verifiers (the record's `verifier` and `transcript_verifier`).

`check(env, goal, turns)` judges a finished episode on the real environment's state;
`check_transcript(env, goal, turns)` judges it from the transcript alone, with `env` only reset to
the episode's world. What each checks is listed in `lwm_jax/envs/verify.py` and
`lwm_jax/envs/verify_transcript.py`, which dispatch to these through the domain registry.
"""
from __future__ import annotations

import re
from typing import Any

from lwm_jax.envs import verify as V
from lwm_jax.envs.verify import Turns, Verdict, _read, _v


# -- swe ------------------------------------------------------------------------------------------
_SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors)\b")


def _pytest_counts(out: str) -> tuple[int, int]:
  passed = failed = 0
  for n, what in _SUMMARY.findall(out):
    if what == "passed":
      passed += int(n)
    else:
      failed += int(n)
  return passed, failed


def check(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  changed = sorted(p for p, text in env.world.files.items()
                   if p.startswith("tests/") and _read(env.repo, p) != text)
  rc, out = env.suite_result()
  passed, failed = _pytest_counts(out)
  share = passed / max(passed + failed, 1)
  if changed:
    return _v(False, 0, f"test files changed: {', '.join(changed)}")
  return _v(rc == 0, share, f"test suite: {passed} passed, {failed} failed (exit code {rc})")


# -- search ---------------------------------------------------------------------------------------


def check_transcript(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  edited = [a for a in turns if re.match(r"\s*edit\(\s*(path\s*=\s*)?['\"]tests/", a[0])]
  if edited:
    return V._v(False, 0, "an edit changed a test file")
  last_edit = max((i for i, (a, o) in enumerate(turns) if o.startswith("Edited ")), default=-1)
  runs = [(a, o) for a, o in turns[last_edit + 1:] if re.match(r"\s*run_tests\(", a)]
  target = re.compile(r"\s*run_tests\(\s*(target\s*=\s*)?(['\"](tests/?|" + re.escape(g["test_path"])
                      + "(::" + re.escape(g["test"]) + r")?)['\"])?\s*\)\s*$")
  covering = [o for a, o in runs if target.match(a)]
  if not covering:
    return V._v(False, 0, f"no test run after the last edit covers {g['test']}")
  passed, failed = _pytest_counts(runs[-1][1])
  ok = all(o.rstrip().endswith("[exit code 0]") for _, o in runs)
  return V._v(ok, passed / max(passed + failed, 1),
              f"{len(runs)} test runs after the last edit, {len(covering)} covering {g['test']}; "
              f"{'all passed' if ok else 'not all passed'}")


# -- web ------------------------------------------------------------------------------------------
