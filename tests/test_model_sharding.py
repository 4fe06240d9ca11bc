"""Sharded model == single device, on 8 forced CPU devices (run in a subprocess)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import xla_env

# `make test` runs the "main" cases; `make test-slow` the other meshes and backends.
CASES = {
    "main": ["tiled:8:data=2,expert=2,tensor=2",   # tokens exchanged by all_to_all
             # the same, 48 tokens a device dispatched 20 at a time (3 chunks, the last padded)
             "tiled:8:data=2,expert=2,tensor=2:tiny:moe_chunk_tokens=20"],
    "slow": ["blocked:8:data=2,expert=2,tensor=2",
             "blocked:8:data=2,expert=2,tensor=2:tiny_hybrid",  # Gated DeltaNet + gated attention
             "blocked:8:fsdp=4,expert=2",
             "ragged_dot:8:expert=8",
             "blocked:2:data=2,expert=2,tensor=2"],  # batch too small for the expert axis: psum path
}


def _run(cases):
  env = xla_env(8)
  script = pathlib.Path(__file__).with_name("sharded_model_check.py")
  proc = subprocess.run([sys.executable, str(script), *cases], env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert len(out) == len(cases)
  return out


@pytest.fixture(scope="module")
def results():
  return _run(CASES["main"])


@pytest.fixture(scope="module")
def slow_results():
  return _run(CASES["slow"])


def _check(r):
  assert r["logits"] < 1e-5, r
  assert r["grads"] < 1e-5, r
  assert r["aux"] < 1e-5, r
  assert r["loss"] < 1e-5, r


@pytest.mark.parametrize("i", range(len(CASES["main"])))
def test_sharded_equals_single_device(results, i):
  _check(results[i])


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES["slow"])))
def test_sharded_equals_single_device_other_meshes(slow_results, i):
  _check(slow_results[i])
