"""launch/data.py as a user runs it: stats and inspect on a small trajectory file."""
import pytest
import collections
import json
import os
import subprocess
import sys

from lwm_jax.data import hygiene, schema

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(REPO, "tests", "fixtures", "data", "trajectories.jsonl")


def _run(*args):
  return subprocess.run([sys.executable, os.path.join(REPO, "launch", "data.py"), *args],
                        capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_stats_counts_every_domain(tmp_path):
  png = tmp_path / "lengths.png"
  proc = _run("stats", f"--inputs={FIX}", f"--png={png}", "--sp_vocab=600")
  assert proc.returncode == 0, proc.stderr[-2000:]
  # The fixture holds 3 trajectories that hygiene drops (checked in test_data_schema); count the rest.
  kept = hygiene.filter_trajectories(list(schema.read_jsonl(FIX)))
  expected = collections.Counter(t.domain for t in kept)
  assert sum(expected.values()) == 8
  rows = {}
  for line in proc.stdout.splitlines():  # the first line naming a domain is its table row
    if line.strip():
      rows.setdefault(line.split()[0], line.split())
  for domain, n in expected.items():
    assert rows[domain][1] == str(n), (domain, rows.get(domain))
  assert "turn classes (all domains)" in proc.stdout
  assert png.stat().st_size > 1000


def test_inspect_marks_loss_tokens():
  traj = next(iter(schema.read_jsonl(FIX)))
  proc = _run("inspect", f"--inputs={FIX}", "--index=0", "--stage=sft", "--nocolor",
              "--sp_vocab=600")
  assert proc.returncode == 0, proc.stderr[-2000:]
  marked = "".join(part.split("]]")[0] for part in proc.stdout.split("[[")[1:])
  # The SFT target is one observation of this trajectory; its text is inside the loss marks.
  assert any(t.observation.strip()[:20] in marked for t in traj.turns)


def test_too_small_vocab_is_one_clear_line():
  proc = _run("stats", f"--inputs={FIX}", "--sp_vocab=50")
  assert proc.returncode == 2
  assert "vocab_size 50 is too small" in proc.stderr and "Traceback" not in proc.stderr


def test_stats_prints_the_jaccard_statistic(tmp_path):
  turns = {  # hand-computed Jaccard of the word sets: |A & O| / |A | O|
      "t1": [("get x", "x is big and old"),          # {x} / {get,x,is,big,and,old} = 1/6
             ("ls foo bar", "ls foo bar")],          # 3/3 = 1
      "t2": [("search cats", "felines are small"),   # 0/5 = 0
             ("open a b", "a b c d")]}               # {a,b} / {open,a,b,c,d} = 2/5
  path = tmp_path / "j.jsonl"
  with open(path, "w") as f:
    for tid, pairs in turns.items():
      f.write(json.dumps(schema.Trajectory(
          id=tid, domain="terminal" if tid == "t1" else "search", task="t", action_space="a",
          initial_state="s", turns=[schema.Turn(a, o) for a, o in pairs]).to_dict()) + "\n")
  proc = _run("stats", f"--inputs={path}", "--sp_vocab=600")
  assert proc.returncode == 0, proc.stderr[-2000:]
  mean = (1 / 6 + 1 + 0 + 2 / 5) / 4
  assert (f"Jaccard of action and observation word sets (logged only, no rule uses it): "
          f"mean {mean:.3f} over 4 turns; search {0.2:.3f}, terminal {7 / 12:.3f}") in proc.stdout
