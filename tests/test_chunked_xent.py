"""Token-chunked cross-entropy (custom VJP, gradients made in the forward pass, no [T, V] logits
kept) against the plain loss."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lwm_jax.train import losses
from tests.test_train_xent_chunk import jaxpr_shapes


def _inputs(b=3, s=9, d=16, v=103, seed=0):
  ks = jax.random.split(jax.random.key(seed), 4)
  h = jax.random.normal(ks[0], (b, s, d))
  head = jax.random.normal(ks[1], (d, v)) * 0.5
  tokens = jax.random.randint(ks[2], (b, s), 0, v)
  # Every other target is the argmax prediction, so that the hit count is exercised.
  best = jnp.argmax(jnp.einsum("bsd,dv->bsv", h, head), axis=-1)
  tokens = tokens.at[:, 1::2].set(best[:, 0:-1:2])
  seg = jnp.array([[1] * s, [1] * 5 + [2] * (s - 5), [1] * 4 + [0] * (s - 4)])[:b]
  lw = jax.random.uniform(ks[3], (b, s)) * (jnp.arange(s) % 3 != 0)  # some zero weights
  return h, head, tokens, seg, lw


@pytest.mark.parametrize("chunk,z_coef", [(8, 0.0), (27, 1e-2), (5, 0.3), (100, 0.0)])
def test_chunked_matches_plain_value_and_gradient(chunk, z_coef):
  h, head, tokens, seg, lw = _inputs()

  def plain(h, head):
    s = losses.cross_entropy_sums(jnp.einsum("bsd,dv->bsv", h, head), tokens, seg, lw, z_coef)
    return s["nll"] + z_coef * s["z"], s

  def chunked(h, head):
    s = losses.chunked_cross_entropy_sums(h, head, tokens, seg, lw, z_coef, chunk=chunk)
    return s["loss"], s

  (l_p, s_p), (gh_p, gw_p) = jax.jit(jax.value_and_grad(plain, argnums=(0, 1), has_aux=True))(h, head)
  (l_c, s_c), (gh_c, gw_c) = jax.jit(
      jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True))(h, head)
  np.testing.assert_allclose(l_c, l_p, rtol=1e-5)
  for k in ("nll", "weight", "correct", "tokens", "z"):
    np.testing.assert_allclose(s_c[k], s_p[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert float(s_p["correct"]) > 0  # the argmax comparison is exercised
  np.testing.assert_allclose(gh_c, gh_p, atol=1e-5)
  np.testing.assert_allclose(gw_c, gw_p, atol=1e-5)
  # The last position of each row predicts nothing: its hidden state gets no gradient.
  assert float(jnp.abs(gh_c[:, -1]).max()) == 0.0


def test_chunked_never_materialises_full_logits():
  h, head, tokens, seg, lw = _inputs(b=2, s=33, d=8, v=1000)
  f = lambda h, w: losses.chunked_cross_entropy_sums(h, w, tokens[:2], seg[:2], lw[:2],
                                                     chunk=16)["loss"]
  jaxpr = jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(h, head)
  rows = 2 * 32

  big = [s for s in jaxpr_shapes(jaxpr.jaxpr) if len(s) >= 2 and rows in s and 1000 in s]
  assert not big, big
  assert any(s == (16, 1000) for s in jaxpr_shapes(jaxpr.jaxpr))


def test_chunk_must_be_positive():
  h, head, tokens, seg, lw = _inputs()
  with pytest.raises(ValueError, match="chunk=0"):
    losses.chunked_cross_entropy_sums(h, head, tokens, seg, lw, chunk=0)


_SHARDED = r'''
import jax, jax.numpy as jnp, numpy as np
from lwm_jax import sharding as shd
from lwm_jax.train import losses
from tests.test_chunked_xent import _inputs
from tests.test_train_xent_chunk import jaxpr_shapes
h, head, tokens, seg, lw = _inputs(b=3, s=17, d=16, v=101)
rep = lambda x: jnp.concatenate([x] * 4)[:8]   # 8 rows
h, tokens, seg, lw = rep(h), rep(tokens), rep(seg), rep(lw)
f = lambda h, w: losses.chunked_cross_entropy_sums(h, w, tokens, seg, lw, chunk=4)["loss"]
plain = lambda h, w: losses.cross_entropy_sums(jnp.einsum("bsd,dv->bsv", h, w), tokens, seg,
                                               lw)["nll"]
slices = lambda jaxpr: {s for s in jaxpr_shapes(jaxpr.jaxpr) if len(s) == 2 and s[1] == 101
                       and s[0] != 16}   # [tokens, V] logits, not the [16, V] head
alone = slices(jax.make_jaxpr(f)(h, head))
for sizes in [dict(fsdp=2, expert=4), dict(data=2, fsdp=4)]:
  mesh = shd.make_mesh(**sizes)
  with jax.set_mesh(mesh):
    shapes = slices(jax.make_jaxpr(f)(h, head))
    hs = jax.device_put(h, jax.sharding.NamedSharding(mesh, shd.batch_spec(8, mesh, 3)))
    ws = jax.device_put(head, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp")))
    got = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(hs, ws)
  want = jax.jit(jax.value_and_grad(plain, argnums=(0, 1)))(h, head)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)
  print(sizes, sorted(shapes))
print("alone", sorted(alone))
'''


def test_chunk_counts_tokens_per_device_under_a_mesh():
  """`chunk` tokens on each device the batch splits over: 8 rows over 8 devices with chunk 4 take
  4 positions of each device's one row a slice ([4, V] logits a device), where one device alone
  takes one position of all 8 rows ([8, V]); the loss and gradients stay the plain loss's on
  meshes with and without an expert axis, the head split over fsdp (gathered inside, its gradient
  scattered back)."""
  import os  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from conftest import xla_env  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  res = subprocess.run([sys.executable, "-c", _SHARDED], env=xla_env(8), cwd=root,
                       capture_output=True, text=True, timeout=300, check=False)
  assert res.returncode == 0, res.stderr[-3000:]
  lines = dict(line.split(" ", 1) if line.startswith("alone") else line.split("} ", 1)
               for line in res.stdout.strip().splitlines())
  assert lines["alone"] == "[(8, 101)]", res.stdout
  assert lines["{'fsdp': 2, 'expert': 4"] == "[(4, 101)]", res.stdout
  assert lines["{'data': 2, 'fsdp': 4"] == "[(4, 101)]", res.stdout


@pytest.mark.parametrize("positions", [1, 4, 7, 100])
def test_sliced_token_logprobs_equal_the_full_logits(positions):
  h, head, tokens, _, _ = _inputs(b=3, s=9)
  want, _ = losses.token_logprobs(jnp.einsum("bsd,dv->bsv", h, head), tokens)
  got = losses.sliced_token_logprobs(h, head, tokens, positions)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
