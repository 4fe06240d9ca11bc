"""Sharded train step on 8 CPU devices equals one device; two processes on loopback agree."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import xla_env
from lwm_jax.sampling.background import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

SHARDED = textwrap.dedent("""
  import json, sys, jax, numpy as np, ml_collections
  from lwm_jax import sharding as shd
  from lwm_jax.model.config import get_preset
  from lwm_jax.train import state as st, steps, optimizer, synthetic
  cfg = get_preset("tiny", num_hidden_layers=1, num_experts=4)
  oc = ml_collections.ConfigDict(dict(lr=1e-3, warmup_steps=0, decay_steps=10, end_lr_ratio=0.1,
      b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0))
  tx, sch = optimizer.make_optimizer(oc, 10)
  batches = [synthetic.synthetic_batch(0, i, 8, 32, cfg.vocab_size) for i in range(2)]
  out = {}
  meshes = {"data2_expert2_tensor2": dict(data=2, expert=2, tensor=2),
            "fsdp4_expert2": dict(fsdp=4, expert=2)}
  for name, axes in [("single", dict(devices=jax.devices()[:1]))] + [
      (m, meshes[m]) for m in sys.argv[1:]]:
    mesh = shd.make_mesh(**axes)
    g, s, sh = st.create_train_state(cfg, tx, mesh, 0)
    # the meshes take the token-chunked loss (gathered head, scattered head gradient) against the
    # single device's plain full-logits loss
    sc = steps.StepConfig(micro_batches=2, xent_chunk=0 if name == "single" else 16)
    f = steps.compile_xent_step(g, tx, sch, sc, mesh, sh,
                                {k: v.shape for k, v in batches[0].items()})
    losses = []
    for b in batches:
      s, m = f(s, b)
      losses.append(float(m["loss"]))
    leaves = [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(s.params)]
    n_sharded = sum(len(x.sharding.device_set) > 1 and not x.sharding.is_fully_replicated
                    for x in jax.tree.leaves(s.params))
    out[name] = dict(losses=losses, n_sharded=n_sharded, leaves=leaves)
  ref = out["single"]
  res = {}
  for k in sys.argv[1:]:
    d = max(float(np.max(np.abs(a - b))) for a, b in zip(ref["leaves"], out[k]["leaves"]))
    res[k] = dict(param_diff=d, loss_diff=max(abs(a - b) for a, b in zip(ref["losses"], out[k]["losses"])),
                  n_sharded=out[k]["n_sharded"])
  print("RESULT", json.dumps(res))
""")


# Both meshes in `make test-slow` (CI runs it after `make test`): 8-device subprocesses are heavy.
@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["data2_expert2_tensor2", "fsdp4_expert2"])
def test_sharded_step_equals_single_device(mesh):
  env = xla_env(8, PYTHONPATH=ROOT)
  p = subprocess.run([PY, "-c", SHARDED, mesh], env=env, capture_output=True, text=True,
                     timeout=600, cwd=ROOT)
  line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")]
  assert p.returncode == 0 and line, p.stderr[-3000:]
  res = json.loads(line[0][len("RESULT "):])
  assert list(res) == [mesh]
  for name, r in res.items():
    assert r["n_sharded"] > 0, name          # parameters really are split
    assert r["loss_diff"] < 1e-5, (name, r)
    assert r["param_diff"] < 1e-5, (name, r)


WORKER = textwrap.dedent("""
  import json, sys
  from configs import cpt
  from lwm_jax.train import trainer
  c = cpt.get_config("tiny")
  c.model.num_hidden_layers = 1
  c.model.num_experts = 4
  c.train.update(dict(num_steps=4, batch_size=4, seq_len=32, log_every=0, eval_every=0, progress=False))
  c.checkpoint.every = 0
  c.dist.update(dict(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]),
                     timeout_s=60, cpu_collectives="gloo"))
  out = trainer.train(c, sys.argv[3])
  import jax
  print("RESULT", json.dumps(dict(losses=out["losses"], devices=jax.device_count(),
                                  processes=jax.process_count(), torch="torch" in sys.modules)))
""")


@pytest.mark.slow
def test_two_processes_on_loopback(tmp_path):
  addr = f"127.0.0.1:{free_port()}"
  env = xla_env(1, PYTHONPATH=ROOT)
  procs = [subprocess.Popen([PY, "-c", WORKER, addr, str(i), str(tmp_path / "wd"), ROOT], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
           for i in range(2)]
  results = []
  for p in procs:
    out, err = p.communicate(timeout=300)
    line = [l for l in out.splitlines() if l.startswith("RESULT")]
    assert p.returncode == 0 and line, err[-3000:]
    results.append(json.loads(line[0][len("RESULT "):]))
  assert results[0]["processes"] == 2 and results[0]["devices"] == 2
  assert len(results[0]["losses"]) == 4
  assert results[0]["losses"] == pytest.approx(results[1]["losses"], abs=1e-6)
  assert (tmp_path / "wd" / "checkpoints" / "4").exists()
  # A training run never imports torch (tensorboardX would, for seconds, when it is installed).
  assert not results[0]["torch"] and not results[1]["torch"]
