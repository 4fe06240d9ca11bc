"""Greedy decoding on an 8-device CPU mesh equals decoding on one device (the static engine, and
the continuous engine with its slots sharded over the mesh). The test runs this file
as a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from lwm_jax import sharding
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.continuous import ContinuousEngine
from lwm_jax.sampling.engine import Engine
from lwm_jax.sampling.params import SamplingParams

from conftest import xla_env


MESHES = {"data2_expert2_tensor2": {"data": 2, "expert": 2, "tensor": 2},
          "fsdp2_expert4": {"fsdp": 2, "expert": 4}}


def main():
  assert jax.device_count() == 8, jax.devices()
  cfg = get_preset("tiny")
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, cfg.vocab_size, size=n).tolist() for n in (5, 17, 9, 3)]
  sp = [SamplingParams(temperature=0, max_new_tokens=12)] * 4
  ref = Engine(Transformer(cfg, rngs=nnx.Rngs(0)), min_prompt_bucket=32).generate(
      prompts, sp, [[]] * 4)
  out = {}
  for spec in sys.argv[1:]:
    axes = MESHES[spec]
    mesh = sharding.make_mesh(**axes)
    eng = Engine(Transformer(cfg, rngs=nnx.Rngs(0)), mesh=mesh, min_prompt_bucket=32)
    got = eng.generate(prompts, sp, [[]] * 4)
    # The continuous engine on the same mesh: slots sharded like the static engine's batch,
    # two slots for four requests (slots reused), an n = 2 fork of the first prompt.
    ceng = ContinuousEngine(Transformer(cfg, rngs=nnx.Rngs(0)), mesh=mesh, min_prompt_bucket=32,
                            num_slots=2, min_batch_bucket=2, cache_len=64)
    cont = ceng.generate(prompts + prompts[:1], sp + sp[:1], [[]] * 5)
    out[json.dumps(axes)] = {
        "same_tokens": all(a.token_ids == b.token_ids for a, b in zip(ref, got)),
        "max_logprob_diff": float(max(np.max(np.abs(np.array(a.logprobs) - b.logprobs))
                                      for a, b in zip(ref, got))),
        "continuous_same_tokens": all(a.token_ids == b.token_ids
                                      for a, b in zip(ref + ref[:1], cont)),
        "continuous_max_logprob_diff": float(max(np.max(np.abs(np.array(a.logprobs) - b.logprobs))
                                                 for a, b in zip(ref + ref[:1], cont))),
        "continuous_forked": ceng.forked_rows}
  print(json.dumps(out))


# Both meshes in `make test-slow` (CI runs it after `make test`): 8-device subprocesses are heavy.
@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["data2_expert2_tensor2", "fsdp2_expert4"])
def test_sharded_decoding_equals_single_device(mesh):
  env = xla_env(8)
  res = subprocess.run([sys.executable, os.path.abspath(__file__), mesh], env=env,
                       capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  out = json.loads(res.stdout.strip().splitlines()[-1])
  assert len(out) == 1
  for axes, r in out.items():
    assert r["same_tokens"], axes
    assert r["max_logprob_diff"] < 1e-4, (axes, r)
    assert r["continuous_same_tokens"], axes
    assert r["continuous_max_logprob_diff"] < 1e-4, (axes, r)
    assert r["continuous_forked"] == 1, (axes, r)


if __name__ == "__main__":
  sys.exit(main())
