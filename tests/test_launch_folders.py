"""Launchers never delete a folder they did not make, and check every flag before touching one.

Each case hands a launcher a folder holding a user's file (plus a bad flag, or none) and checks
that the launcher exits with an error naming the problem and that the folder is untouched. The
launchers run as the user would run them (subprocesses, all started at once).
"""
import os
import subprocess
import sys

import pytest

from lwm_jax import run_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "data", "corpus")
TINY = f"--config={os.path.join(REPO, 'configs', 'reproduce.py')}:tiny"
AGENT_FULL = f"--config={os.path.join(REPO, 'configs', 'agent_experiment.py')}:full"

# (launcher, its folder flag, other flags, what the error must say; the folder flag comes last,
# after a --config it overrides): one per launcher here,
# the campaign's other cases in the slow test below (each launcher start costs ~5-10 s of CPU).
CASES = [
    ("rl_experiment", "config.workdir", ["--config.corpus=/nope"], "--config.corpus"),
    ("agent_experiment", "config.out", ["--config.arms=bogus"], "unknown arm"),
    ("reproduce", "config.workdir", [TINY], "did not make"),
    ("copy_drill", "out", [f"--start={os.path.join(REPO, 'data', 'world_model')}"], "did not make"),
]
MORE_CASES = [
    ("rl_experiment", "config.workdir", ["--config.fractions=cpt=2"], "--config.fractions"),
    ("rl_experiment", "config.workdir", [f"--config.corpus={CORPUS}"], "did not make"),
    ("agent_experiment", "config.out", ["--config.domain=nope"], "--config.domain=nope"),
    ("agent_experiment", "config.out", [AGENT_FULL, "--config.arms=sim"],
     "--config.world_model is required"),
    ("agent_experiment", "config.out", ["--config.arms=bc"], "did not make"),
    ("reproduce", "config.workdir", [TINY, "--config.corpus=/nope"], "did not make"),
]


def _foreign(path) -> dict:
  os.makedirs(path / "mine")
  (path / "notes.txt").write_text("the user's notes\n")
  (path / "mine" / "data.csv").write_text("a,b\n1,2\n")
  return _snapshot(path)


def _snapshot(path) -> dict:
  out = {}
  for root, _, files in os.walk(path):
    for f in files:
      full = os.path.join(root, f)
      out[os.path.relpath(full, path)] = open(full).read()
  return out


@pytest.mark.slow  # heavy: `make test-slow` (CI runs it after `make test`) keeps `make test` under 8 minutes
def test_launchers_leave_a_foreign_folder_untouched(tmp_path):
  _run_cases(tmp_path, CASES)


@pytest.mark.slow
def test_launchers_leave_a_foreign_folder_untouched_more_flags(tmp_path):
  _run_cases(tmp_path, MORE_CASES)


def _run_cases(tmp_path, cases):
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  procs = []
  for i, (name, flag, extra, _) in enumerate(cases):
    folder = tmp_path / f"case{i}"
    before = _foreign(folder)
    cmd = [sys.executable, os.path.join(REPO, "launch", f"{name}.py"), *extra, f"--{flag}={folder}"]
    procs.append((folder, before, subprocess.Popen(cmd, env=env, cwd=str(tmp_path),
                                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                    text=True)))
  for (folder, before, proc), (name, _, extra, says) in zip(procs, cases):
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, (name, extra, out[-2000:])
    assert says in out, (name, extra, out[-2000:])
    assert "Traceback" not in out, (name, extra, out[-2000:])
    assert _snapshot(folder) == before, (name, extra)


def test_run_folder_rules(tmp_path):
  ours = tmp_path / "ours"
  run_folder.prepare(str(ours), "--workdir")
  (ours / "old.txt").write_text("x")
  assert run_folder.prepare(str(ours), "--workdir") == str(ours)     # ours: replaced
  assert sorted(os.listdir(ours)) == [run_folder.MARKER]
  (ours / "kept.txt").write_text("x")
  run_folder.prepare(str(ours), "--workdir", keep=True)               # ours, kept (a reuse)
  assert (ours / "kept.txt").exists()
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "a.txt").write_text("keep me")
  with pytest.raises(ValueError, match=r"--workdir=.*foreign is a folder this program did not make"):
    run_folder.prepare(str(foreign), "--workdir")
  assert (foreign / "a.txt").read_text() == "keep me"
  run_folder.prepare(str(foreign), "--workdir", overwrite=True)      # asked for: replaced
  assert not (foreign / "a.txt").exists()
  empty = tmp_path / "empty"
  empty.mkdir()
  run_folder.prepare(str(empty), "--out")                              # an empty folder is fine
  link = tmp_path / "link"
  link.symlink_to(ours)
  with pytest.raises(ValueError, match="symbolic link"):
    run_folder.prepare(str(link), "--out", overwrite=True)
  (tmp_path / "file").write_text("x")
  with pytest.raises(ValueError, match="is a file"):
    run_folder.prepare(str(tmp_path / "file"), "--out", overwrite=True)
