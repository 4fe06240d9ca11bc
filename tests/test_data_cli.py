"""launch/data.py as a user runs it: stats and inspect on a small trajectory file."""
import collections
import os
import subprocess
import sys

from lwm_jax.data import hygiene, schema

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(REPO, "tests", "fixtures", "data", "trajectories.jsonl")


def _run(*args):
  return subprocess.run([sys.executable, os.path.join(REPO, "launch", "data.py"), *args],
                        capture_output=True, text=True, timeout=300, cwd=REPO)


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
