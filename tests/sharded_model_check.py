"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/test_model_sharding.py).

Compares logits, aux loss and parameter gradients of the tiny model on several meshes against the
same model on one device, and prints one JSON line per mesh with the largest differences.
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lwm_jax import sharding
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer


def loss_fn(model, tokens, segment_ids):
  out = model(tokens, segment_ids=segment_ids)
  logp = jax.nn.log_softmax(out.logits[:, :-1].astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  return jnp.mean(nll) + 0.01 * out.aux_loss, out


def run(model, tokens, segment_ids):
  grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
  (loss, out), grads = nnx.jit(grad_fn)(model, tokens, segment_ids)
  return (np.asarray(loss), np.asarray(out.logits), np.asarray(out.aux_loss),
          jax.tree_util.tree_map(np.asarray, nnx.to_pure_dict(grads)))


def parse_case(case: str):
  """'blocked:8:data=2,expert=2,tensor=2[:preset[:key=int,...]]' -> ('blocked', 8, {'data': 2,
  ...}, preset, {key: int}): the last part configures the sharded model only (the reference
  runs without it)."""
  backend, batch, axes, *rest = case.split(":")
  preset = rest[0] if rest else "tiny"
  sharded_only = dict(kv.split("=") for kv in rest[1].split(",")) if len(rest) > 1 else {}
  return (backend, int(batch), {k: int(v) for k, v in (kv.split("=") for kv in axes.split(","))},
          preset, {k: int(v) for k, v in sharded_only.items()})


def main(cases):
  refs = {}
  for backend, batch, axes, preset, sharded_only in map(parse_case, cases):
    # The fewest layers that still cover every layer kind: one dense and one MoE layer for `tiny`,
    # one linear-attention and one full-attention layer (each with MoE) for `tiny_hybrid`. The
    # layers are unrolled, so every extra layer is compiled again (twice: reference and sharded).
    if preset == "tiny":
      extra = dict(mlp_only_layers=(0,), num_hidden_layers=2)
    elif preset == "tiny_hybrid":
      extra = dict(num_hidden_layers=2, full_attention_interval=2)
    else:
      extra = {}
    cfg = get_preset(preset, moe_backend=backend, capacity_factor=8.0, **extra)
    tokens = jax.random.randint(jax.random.key(3), (batch, 24), 0, cfg.vocab_size)
    seg = jnp.concatenate([jnp.ones((batch, 10), jnp.int32), 2 * jnp.ones((batch, 14), jnp.int32)],
                          axis=1)
    key = (backend, batch, preset)
    if key not in refs:
      refs[key] = run(Transformer(cfg, rngs=nnx.Rngs(0)), tokens, seg)
    ref = refs[key]
    mesh = sharding.make_mesh(**axes)
    model = Transformer(cfg.replace(**sharded_only), rngs=nnx.Rngs(0))
    with jax.set_mesh(mesh):
      sharding.shard_model(model, mesh)
      spec = jax.NamedSharding(mesh, sharding.batch_spec(batch, mesh))
      got = run(model, jax.device_put(tokens, spec), jax.device_put(seg, spec))
    gdiff = max(float(np.max(np.abs(a - b))) for a, b in zip(
        jax.tree_util.tree_leaves(ref[3]), jax.tree_util.tree_leaves(got[3])))
    print(json.dumps({"mesh": axes, "backend": backend, "batch": batch, "preset": preset,
                      "sharded_only": sharded_only,
                      "loss": float(abs(ref[0] - got[0])),
                      "logits": float(np.max(np.abs(ref[1] - got[1]))),
                      "aux": float(abs(ref[2] - got[2])), "grads": gdiff}), flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
