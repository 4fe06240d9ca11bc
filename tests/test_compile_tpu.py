"""Ahead-of-time compilation for TPU topologies (lwm_jax/compile.py, launch/compile.py).

The HLO accounting and the target-platform choices are checked everywhere; the compile of a
tiny preset for a v5e:2x2 slice needs libtpu (`make test-tpu` builds .venv-tpu with the `.[tpu]`
extra and runs this file) and is skipped, with the install command, where it is absent.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from lwm_jax import compile as aot
from lwm_jax.model import platform
from lwm_jax.model.moe import grouped_ffn, resolve_backend
from lwm_jax.train import optimizer as opt_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A hand-written optimized-HLO module: a loop of 6 trips holding an all-gather (4 devices per
# group) and an all-to-all, and a reduce-scatter and an all-reduce at the top level.
HLO = """HloModule m

%cond (p: (s32[], bf16[8,256])) -> pred[] {
  %p = (s32[], bf16[8,256]) parameter(0)
  %c = s32[] constant(6)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%body (p: (s32[], bf16[8,256])) -> (s32[], bf16[8,256]) {
  %p = (s32[], bf16[8,256]) parameter(0)
  %x = bf16[8,256]{1,0} get-tuple-element(%p), index=1
  %ag = bf16[32,256]{1,0} all-gather(%x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}
  %w = bf16[256,256]{1,0} constant({...})
  %d = bf16[32,256]{1,0} dot(%ag, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %a2a = bf16[8,256]{1,0} all-to-all(%x), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}
  ROOT %t = (s32[], bf16[8,256]) tuple(%i, %a2a)
}

ENTRY %main (a: bf16[8,256], g: f32[64,128]) -> f32[8,128] {
  %a = bf16[8,256]{1,0} parameter(0)
  %g = f32[64,128]{1,0} parameter(1)
  %w0 = (s32[], bf16[8,256]) tuple(%z, %a)
  %loop = (s32[], bf16[8,256]) while(%w0), condition=%cond, body=%body
  %rs = f32[8,128]{1,0} reduce-scatter(%g), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}, to_apply=%add
  ROOT %ar = f32[8,128]{1,0} all-reduce(%rs), channel_id=4, replica_groups=[2,4]<=[4,2]T(1,0), to_apply=%add
}
"""


def test_hlo_collectives_counted_per_step_with_loop_trips():
  r = aot.analyze_hlo(HLO, devices_per_slice=4)
  c = r["collectives"]
  assert r["loops"] == [6]
  ag = 32 * 256 * 2  # output bytes
  assert (c["all-gather"]["static"], c["all-gather"]["count"]) == (1, 6)
  assert c["all-gather"]["bytes"] == pytest.approx(6 * ag * 3 / 4)
  assert c["all-to-all"]["count"] == 6 and c["all-to-all"]["max_group"] == 2
  assert c["all-to-all"]["bytes"] == pytest.approx(6 * 8 * 256 * 2 / 2)
  # reduce-scatter: a chip sends (n - 1) shards of its output's size
  assert c["reduce-scatter"]["bytes"] == pytest.approx(8 * 128 * 4 * 7)
  assert c["all-reduce"]["bytes"] == pytest.approx(2 * 8 * 128 * 4 * 3 / 4)
  # the matmul in the loop body: 2 x 32 x 256 x 256 per trip
  assert r["dot_flops"] == pytest.approx(6 * 2 * 32 * 256 * 256)
  # groups [0..3] and [4..7] stay in a slice of 4; the reduce-scatter over all 8 and the
  # transposed all-reduce groups ({0,2,4,6}, {1,3,5,7}) cross slices
  assert r["cross_slice_bytes"] == pytest.approx(c["reduce-scatter"]["bytes"]
                                                 + c["all-reduce"]["bytes"])


# A loop of 6 trips that reads one layer of a stacked [6, 256, 256] weight (a dynamic-slice
# fusion) and writes one [1, 8, 256] row block of a [6, 8, 256] buffer in place (a fusion whose
# root is a dynamic-update-slice), beside a top-level add of two [64, 128] f32 arrays.
HLO_BYTES = """HloModule m

%fds (p0: bf16[6,256,256], p1: s32[]) -> bf16[1,256,256] {
  %p0 = bf16[6,256,256]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z1 = s32[] constant(0)
  ROOT %ds = bf16[1,256,256]{2,1,0} dynamic-slice(%p0, %p1, %z1, %z1), dynamic_slice_sizes={1,256,256}
}

%fdus (q0: bf16[6,8,256], q1: bf16[1,8,256], q2: s32[]) -> bf16[6,8,256] {
  %q0 = bf16[6,8,256]{2,1,0} parameter(0)
  %q1 = bf16[1,8,256]{2,1,0} parameter(1)
  %q2 = s32[] parameter(2)
  %z2 = s32[] constant(0)
  ROOT %u = bf16[6,8,256]{2,1,0} dynamic-update-slice(%q0, %q1, %q2, %z2, %z2)
}

%cond (p: (s32[], bf16[6,256,256], bf16[6,8,256], bf16[1,8,256])) -> pred[] {
  %pc = (s32[], bf16[6,256,256], bf16[6,8,256], bf16[1,8,256]) parameter(0)
  %six = s32[] constant(6)
  %ic = s32[] get-tuple-element(%pc), index=0
  ROOT %lt = pred[] compare(%ic, %six), direction=LT
}

%body (p: (s32[], bf16[6,256,256], bf16[6,8,256], bf16[1,8,256])) -> (s32[], bf16[6,256,256], bf16[6,8,256], bf16[1,8,256]) {
  %p = (s32[], bf16[6,256,256], bf16[6,8,256], bf16[1,8,256]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %stack = bf16[6,256,256]{2,1,0} get-tuple-element(%p), index=1
  %buf = bf16[6,8,256]{2,1,0} get-tuple-element(%p), index=2
  %upd = bf16[1,8,256]{2,1,0} get-tuple-element(%p), index=3
  %w = bf16[1,256,256]{2,1,0} fusion(%stack, %i), kind=kLoop, calls=%fds
  %nb = bf16[6,8,256]{2,1,0} fusion(%buf, %upd, %i), kind=kLoop, calls=%fdus
  ROOT %t = (s32[], bf16[6,256,256], bf16[6,8,256], bf16[1,8,256]) tuple(%i, %stack, %nb, %upd)
}

ENTRY %main (a: bf16[6,256,256], b: bf16[6,8,256], c: bf16[1,8,256], g: f32[64,128]) -> f32[64,128] {
  %a = bf16[6,256,256]{2,1,0} parameter(0)
  %b = bf16[6,8,256]{2,1,0} parameter(1)
  %c = bf16[1,8,256]{2,1,0} parameter(2)
  %g = f32[64,128]{1,0} parameter(3)
  %zero = s32[] constant(0)
  %w0 = (s32[], bf16[6,256,256], bf16[6,8,256], bf16[1,8,256]) tuple(%zero, %a, %b, %c)
  %loop = (s32[], bf16[6,256,256], bf16[6,8,256], bf16[1,8,256]) while(%w0), condition=%cond, body=%body
  ROOT %s = f32[64,128]{1,0} add(%g, %g)
}
"""


def test_hbm_bytes_counted_per_loop_trip_with_slices_and_in_place_updates():
  r = aot.analyze_hlo(HLO_BYTES)
  layer, rows = 256 * 256 * 2, 8 * 256 * 2
  per_trip = (layer + layer + 4) + (2 * rows + 4)  # slice out + slice read + index; update r/w
  top_level = 3 * 64 * 128 * 4
  cond = 4 + 4 + 1  # the loop condition's compare, counted once like its FLOP-free siblings
  assert r["hbm_bytes_static"] == pytest.approx(per_trip + top_level + cond)
  assert r["hbm_bytes"] == pytest.approx(6 * per_trip + top_level + cond)
  # the fusion bodies themselves (fds, fdus) are not counted again
  assert {t["name"] for t in r["top_hbm"]} == {"w", "nb", "s", "lt"}
  assert r["top_hbm"][0]["name"] == "w"
  assert sum(r["hbm_by_op"].values()) * aot.GIB == pytest.approx(r["hbm_bytes"])


def test_roofline_from_figures():
  chip = aot.CHIPS["v5p"]
  coll = {"collectives": {"all-gather": {"bytes": 1.2e9}}, "cross_slice_bytes": 0.0}
  r = aot.roofline(chip, flops=459e12, bytes_accessed=2765e9 / 2, coll=coll,
                   model_flops=459e12 * 4 * 0.5, tokens=4000, chips=4)
  assert r["compute_s"] == pytest.approx(1.0) and r["hbm_s"] == pytest.approx(0.5)
  assert r["ici_s"] == pytest.approx(1e-3) and r["bound"] == "compute"
  assert r["est_mfu"] == pytest.approx(0.5) and r["tokens_per_s_per_chip"] == pytest.approx(1000)


def test_report_merges_rows_and_keeps_the_notes_written_by_hand(tmp_path):
  with open(os.path.join(ROOT, "benchmarks", "results", "pods.json"), encoding="utf-8") as f:
    rows = json.load(f)["rows"][:2]  # two real report rows (the tiny smoke rows)
  out_json, out_md = str(tmp_path / "pods.json"), str(tmp_path / "pods.md")
  aot.write_report(rows[:1], out_json, out_md)
  text = open(out_md, encoding="utf-8").read()
  table = text.index("| preset |")
  with open(out_md, "w", encoding="utf-8") as f:  # a note on the rows, written by hand
    f.write(text[:table] + "**Notes.** Compiled on a busy host.\n\n" + text[table:])
  again = dict(rows[1], preset=rows[0]["preset"], stage=rows[0]["stage"])  # same key: replaces
  aot.write_report([again, rows[1]], out_json, out_md)
  text = open(out_md, encoding="utf-8").read()
  assert "**Notes.** Compiled on a busy host." in text
  assert text.index("**Notes.**") < text.index("| preset |")
  assert len(json.load(open(out_json, encoding="utf-8"))["rows"]) == 2
  assert text.count("\n| " + rows[0]["preset"] + " |") == 1


def test_topology_names_are_checked():
  assert aot.parse_topology("v5p:4x4x8")[2] == 128
  assert aot.parse_topology("v6e:16x16")[2] == 256
  with pytest.raises(ValueError, match="v7x:2x2"):
    aot.parse_topology("v7x:2x2")


@pytest.mark.parametrize("stage", ["cpt", "sft", "rl", "agent_rl"])
def test_every_pod_preset_gives_each_chip_of_its_topology_one_row_a_micro_batch(stage):
  # fewer rows than chips leave the rows replicated over part of the mesh (the MoE then runs
  # without its expert dispatch); more than one row a chip was what did not fit
  import importlib  # pylint: disable=import-outside-toplevel
  from configs import common  # pylint: disable=import-outside-toplevel
  mod = importlib.import_module(f"configs.{stage}")
  pods = [p for p in common.PRESETS if p.startswith("qwen")]
  assert len(pods) == 3
  for preset in pods:
    c = mod.get_config(preset)
    chips = aot.parse_topology(c.topology)[2]
    assert c.train.batch_size // c.train.micro_batches == chips, (preset, stage)
    assert c.train.batch_size % c.train.micro_batches == 0


def test_choices_follow_the_target_platform_not_the_host():
  host = jax.default_backend()
  assert resolve_backend("auto") == ("tiled" if host == "cpu" else resolve_backend("auto"))
  with platform.target("tpu"):
    assert platform.target_platform() == "tpu"
    assert resolve_backend("auto") == "gmm"
    assert opt_lib.compute_dtype("auto") == "bfloat16"
  with platform.target("cuda"):
    assert resolve_backend("auto") == "ragged_dot"
  with platform.target("cpu"):
    assert resolve_backend("auto") == "tiled"
    assert opt_lib.compute_dtype("auto") == "float32"
  assert resolve_backend("sorted") == "sorted"


@pytest.mark.slow  # the kernel in interpret mode: ~10 s on idle cores (`make test-tpu` runs it)
def test_gmm_backend_matches_ragged_dot_values_and_gradients():
  """The Pallas grouped matmul (interpret mode off TPU) against XLA's ragged_dot, with invalid
  rows (which the kernel leaves unwritten) in the batch."""
  k = jax.random.split(jax.random.PRNGKey(0), 5)
  n, d, i, e = 40, 128, 128, 4
  x = jax.random.normal(k[0], (n, d))
  ex = jax.random.randint(k[1], (n,), 0, e)
  valid = jax.random.uniform(k[2], (n,)) > 0.2
  wg, wu = jax.random.normal(k[3], (2, e, d, i)) * 0.1
  wd = jax.random.normal(k[4], (e, i, d)) * 0.1

  def loss(backend):
    return lambda *a: jnp.sum(grouped_ffn(a[0], ex, valid, *a[1:], backend) ** 2)
  ref, gref = jax.value_and_grad(loss("ragged_dot"), argnums=(0, 1, 2, 3))(x, wg, wu, wd)
  got, ggot = jax.value_and_grad(loss("gmm"), argnums=(0, 1, 2, 3))(x, wg, wu, wd)
  assert float(got) == pytest.approx(float(ref), rel=1e-5)
  for a, b in zip(gref, ggot):
    assert bool(jnp.all(jnp.isfinite(b)))
    assert float(jnp.max(jnp.abs(a - b))) <= 1e-4 * float(jnp.max(jnp.abs(a))) + 1e-6


def _compile(tmp_path, stages: str, *extra: str) -> list[dict]:
  problem = aot.libtpu_problem()
  if problem:
    pytest.skip(problem)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the suite's CPU-only flags
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  out = str(tmp_path / "report")
  cmd = [sys.executable, os.path.join(ROOT, "launch", "compile.py"), "--preset=tiny",
         f"--stages={stages}", "--topology=v5e:2x2", "--set=mesh.data=1", "--set=mesh.fsdp=2",
         "--set=mesh.expert=2", "--set=model.hidden_size=128",
         "--set=model.moe_intermediate_size=128", f"--out={out}", *extra]
  p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
  assert p.returncode == 0, p.stderr[-3000:]
  with open(out + ".json", encoding="utf-8") as f:
    rows = json.load(f)["rows"]
  assert os.path.exists(out + ".md")
  return rows


def test_tiny_cpt_compiles_for_v5e_2x2(tmp_path):
  (row,) = _compile(tmp_path, "cpt", "--layers=4")
  assert row["chips"] == 4 and row["mesh"]["fsdp"] == 2 and row["mesh"]["expert"] == 2
  assert row["moe_backend"] == "gmm" and row["model_dtype"] == "bfloat16"
  assert row["fits"] and 0 < row["hbm_gib_per_chip"] < row["hbm_capacity_gib"]
  assert row["loop_trip_counts"] and 4 in row["loop_trip_counts"]  # the scanned layers
  coll = row["collectives"]
  # expert parallelism exchanges tokens; FSDP gathers its parameters
  assert coll["all-to-all"]["count"] >= 4 and coll["all-gather"]["count"] > 0
  assert row["flops_per_chip"] >= row["flops_per_chip_xla"] > 0
  assert 0 < row["est_mfu"] < 1 and row["est_step_s"] > 0


def test_missing_libtpu_is_one_clear_line(tmp_path):
  if aot.libtpu_problem() is None:
    pytest.skip("libtpu is installed here")
  p = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "compile.py"),
                      f"--out={tmp_path / 'r'}"], capture_output=True, text=True, timeout=120,
                     env=dict(os.environ, PYTHONPATH=ROOT), check=False)
  assert p.returncode == 2
  assert "pip install \"jax[tpu]==" in p.stderr and "libtpu" in p.stderr


_LOWER_SAMPLER = """
import json, jax
from lwm_jax import compile as aot
out = {}
for stage in ("prefill", "decode", "decode-static"):
  c = aot.stage_config(stage, "tiny", {"mesh.data": 1, "mesh.fsdp": 2, "mesh.expert": 2,
                                       "model.num_hidden_layers": 2})
  lowered, info = aot.build_lowered(c, stage, jax.devices()[:4], platform_name="cpu")
  out[stage] = dict(info, text=len(lowered.as_text()))
print(json.dumps(out))
"""


@pytest.mark.slow  # a subprocess on 4 host devices: `make test-slow`
def test_sampler_stages_lower_on_host_devices():
  # The report lowers the engines' own jitted functions from abstract arguments, so a field added
  # to an engine's inputs must reach it too (checked here without libtpu, on 4 host devices).
  from tests.conftest import xla_env  # pylint: disable=import-outside-toplevel
  env = xla_env(4, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  p = subprocess.run([sys.executable, "-c", _LOWER_SAMPLER], env=env, capture_output=True,
                     text=True, timeout=600, check=False, cwd=ROOT)
  assert p.returncode == 0, p.stderr[-3000:]
  got = json.loads(p.stdout.strip().splitlines()[-1])
  for stage, info in got.items():
    assert info["text"] > 0 and info["tokens"] > 0
    assert info["mesh"]["fsdp"] == 2 and info["mesh"]["expert"] == 2
  assert got["decode"]["engine"] == "continuous" and got["decode-static"]["engine"] == "static"


def test_tiny_sampler_steps_compile_for_v5e_2x2(tmp_path):
  rows = {r["stage"]: r for r in _compile(tmp_path, "prefill,decode", "--layers=2")}
  assert rows["decode"]["engine"] == "continuous" and rows["decode"]["decode_steps"] > 0
  for r in rows.values():
    assert r["fits"] and r["chips"] == 4 and r["est_step_s"] > 0
    assert r["collectives"]["all-to-all"]["count"] > 0  # tokens exchanged between experts
