"""Sharded model == single device, on 8 forced CPU devices (run in a subprocess)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import xla_env

CASES = [
    "blocked:8:data=2,expert=2,tensor=2",   # tokens exchanged by all_to_all
    "blocked:8:fsdp=4,expert=2",
    "ragged_dot:8:expert=8",
    "blocked:2:data=2,expert=2,tensor=2",   # batch too small for the expert axis: psum path
    "blocked:8:data=2,expert=2,tensor=2:tiny_hybrid",  # Gated DeltaNet + gated attention
]


@pytest.fixture(scope="module")
def results():
  env = xla_env(8)
  script = pathlib.Path(__file__).with_name("sharded_model_check.py")
  proc = subprocess.run([sys.executable, str(script), *CASES], env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_all_cases_ran(results):
  assert len(results) == len(CASES)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_sharded_equals_single_device(results, i):
  r = results[i]
  assert r["logits"] < 1e-5, r
  assert r["grads"] < 1e-5, r
  assert r["aux"] < 1e-5, r
  assert r["loss"] < 1e-5, r
