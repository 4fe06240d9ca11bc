"""The domain registry (lwm_jax/domains.py): the records of the seven bundled domains, lookups and
their errors, and the benchmark's domain count derived from it."""
import dataclasses
import os
import subprocess
import sys

import pytest

import lwm_jax
from lwm_jax import domains

BUNDLED = ("mcp", "search", "terminal", "swe", "android", "web", "os")


def test_the_seven_bundled_domains_in_the_benchmark_order():
  assert domains.names()[:7] == BUNDLED
  assert domains.bench_domains() == BUNDLED
  for d in domains.domains()[:7]:
    assert d.load("env").domain == d.name  # each record names its own environment
    assert callable(d.load("agent")) and callable(d.load("world"))
    assert callable(d.load("verifier")) and callable(d.load("transcript_verifier"))
    assert d.env.startswith("lwm_jax.envs.") and d.judge_guidance.strip()


def test_the_order_does_not_depend_on_what_was_imported_first():
  code = ("import lwm_jax.envs.desktop, lwm_jax.envs.terminal\n"
          "from lwm_jax import domains\nprint(','.join(domains.names()))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": lwm_jax.child_pythonpath()})
  assert out.stdout.strip() == ",".join(BUNDLED)


def test_lookups_name_what_is_known():
  assert domains.get_domain("os").display == "OS" and domains.is_domain("swe")
  with pytest.raises(ValueError, match="unknown domain 'nope' \\(expected one of mcp, search"):
    domains.get_domain("nope")
  with pytest.raises(ValueError, match="already registered"):
    domains.register_domain(dataclasses.replace(domains.get_domain("web"), display="W"))
  with pytest.raises(ValueError, match="content must be one of"):
    dataclasses.replace(domains.get_domain("web"), name="web2", content="html")
  with pytest.raises(ValueError, match="'module:attribute'"):
    dataclasses.replace(domains.get_domain("web"), name="web2", verifier="no_colon")


def test_an_eighth_benchmark_domain_counts_for_partial():
  from lwm_jax.eval import metrics
  five = dict(format=5, factuality=5, consistency=5, realism=5, quality=5)
  rows = [{"task": d, "scores": five} for d in BUNDLED]
  assert not metrics.aggregate(rows)["partial"]
  extra = dataclasses.replace(domains.get_domain("web"), name="shop2", display="Shop2")
  domains.register_domain(extra)
  try:
    assert len(metrics.bench_domains()) == 8
    assert metrics.aggregate(rows)["partial"]  # seven of eight: partial, whatever the number
    assert not metrics.aggregate(rows + [{"task": "shop2", "scores": five}])["partial"]
  finally:
    domains.unregister_domain("shop2")
  assert metrics.bench_domains() == BUNDLED


def test_threads_never_see_a_half_filled_registry():
  """The first lookups of a fresh process from many threads at once (as a Grain worker's thread
  pool makes them) all find every bundled domain: none returns while another thread is still
  importing the domain folders."""
  import subprocess
  import sys
  code = """
import threading
from lwm_jax import domains
start, errors = threading.Barrier(8), []
def look():
  start.wait()
  try:
    domains.get_domain("os")
  except ValueError as e:
    errors.append(str(e))
ts = [threading.Thread(target=look) for _ in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print(len(errors), len(domains.names()))
"""
  for _ in range(3):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "7"], out.stdout + out.stderr
