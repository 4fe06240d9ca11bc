"""How many worlds a seed range gives (lwm_jax.envs.worlds): the census names the generator each
environment's reset() really uses, counts distinct worlds and repeats, and the CLI prints it."""
import os
import subprocess
import sys

import pytest

from lwm_jax import domains
from lwm_jax.envs import base, worlds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("domain", sorted(domains.bench_domains()))
def test_census_world_is_the_world_reset_builds(domain, tmp_path):
  """The id of the census's world for a seed equals the one the real environment records."""
  kwargs = {"root": str(tmp_path)} if domain in ("terminal", "swe", "os") else {}
  env = base.make_env(domain, **kwargs)
  try:
    env.reset(17)
    assert env.world_id == base.world_id(domain, worlds.generate(domain, 17))
    assert env.world_id != base.world_id(domain, worlds.generate(domain, 18))
  finally:
    env.close()


@pytest.mark.parametrize("domain", sorted(domains.bench_domains()))
def test_forty_seeds_give_forty_worlds(domain):
  c = worlds.census(domain, range(100, 140))
  assert (c.seeds, c.distinct, c.repeats) == (40, 40, [])
  assert c.parts and all(1 <= n <= 40 for n in c.parts.values())
  assert worlds.census(domain, range(100, 140)) == c  # deterministic per seed


def test_repeated_seeds_are_counted_as_repeats():
  c = worlds.census("web", [3, 5, 3, 5, 8])
  assert (c.seeds, c.distinct, c.repeats) == (5, 3, [(3, 3), (5, 5)])
  assert "3 distinct worlds from 5 seeds; repeats e.g. seed 3 = seed 3" in c.line()


def test_bad_ranges_and_domains_are_named():
  assert worlds.parse_seed_range("2:5") == range(2, 5)
  for bad in ("5", "a:b", "5:2", "-1:3"):
    with pytest.raises(ValueError, match="--seeds"):
      worlds.parse_seed_range(bad)
  with pytest.raises(ValueError, match="unknown domain 'moon'"):
    worlds.generate("moon", 0)


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_cli_prints_the_census_and_refuses_bad_flags():
  def run(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "launch", "data.py"), "worlds",
                           *args], capture_output=True, text=True, timeout=120, cwd=REPO)
  proc = run("--seeds=0:6", "--domains=search,android")
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.strip().splitlines()
  assert [ln.split(":")[0] for ln in lines] == ["search", "android"]
  assert all("6 distinct worlds from 6 seeds" in ln for ln in lines)
  proc = run("--domains=moon")  # (bad --seeds: test_bad_ranges_and_domains_are_named)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "--domains: unknown domain 'moon'" in proc.stderr
