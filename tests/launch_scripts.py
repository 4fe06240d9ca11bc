"""Loading a launch script that defines its absl flags at import (launch/perturb_experiment.py),
for tests of its helpers. launch/reproduce.py, agent_experiment.py and rl_experiment.py are not
loaded this way: their logic is in lwm_jax.recipe (reproduce, agent_experiment, rl_experiment)."""
import importlib.util
import os
import re
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
  if name in sys.modules:
    return sys.modules[name]
  from absl import flags
  path = os.path.join(REPO, "launch", f"{name}.py")
  # Other test files in this worker may have loaded scripts that define the same flag names in
  # absl's process-wide registry: drop those names first (absl lets a module redefine only its
  # own flags), then load; a clash the file's own definitions did not show is dropped and retried.
  with open(path) as f:
    for flag in re.findall(r"flags\.DEFINE_\w+\(\s*[\"']([\w-]+)[\"']", f.read()):
      if flag in flags.FLAGS:
        delattr(flags.FLAGS, flag)
  spec = importlib.util.spec_from_file_location(name, path)
  for _ in range(20):
    mod = importlib.util.module_from_spec(spec)  # a fresh module: absl lets it redefine its own flags
    sys.modules[name] = mod
    try:
      spec.loader.exec_module(mod)
      return mod
    except flags.DuplicateFlagError as e:
      delattr(flags.FLAGS, str(e).split("'")[1])
  del sys.modules[name]
  raise RuntimeError(f"launch/{name}.py: flag clashes did not resolve")


@pytest.fixture(scope="module", autouse=True)
def _forget_launch_flags():
  """The launch scripts loaded here define absl flags in the process-wide registry; they are
  removed after the test file, so that a later test file in the same worker can define its own."""
  from absl import flags
  before = set(flags.FLAGS)
  yield
  for name in set(flags.FLAGS) - before:
    delattr(flags.FLAGS, name)
