"""Compile a preset's stages for a TPU topology on this (CPU) host and report memory, FLOPs,
collectives and a roofline estimate (lwm_jax/compile.py; docs/pods.md).

  python launch/compile.py --preset=qwen3_30b_a3b --stages=cpt --topology=v5p:4x4x4
  python launch/compile.py --preset=tiny --stages=cpt,decode --topology=v5e:2x2 \
      --set=mesh.fsdp=2 --set=mesh.expert=2 --out=/tmp/tiny

Needs libtpu (`pip install "jax[tpu]==<our jax>"` or `make test-tpu`, which builds .venv-tpu);
without it, one line on stderr says so, exit status 2.
"""
import json
import os
import sys

from absl import app, flags


flags.DEFINE_string("preset", "tiny", "configs preset (tiny, small, qwen3_30b_a3b, ...)")
flags.DEFINE_list("stages", ["cpt"], "cpt, sft, gspo, logprobs, agent-rl, prefill, decode (the "
                  "continuous engine), decode-static")
flags.DEFINE_string("topology", "", "chip:shape, e.g. v5p:4x4x8, v5e:16x16, v6e:16x16 (default: "
                    "the topology the preset was sized for, its config's `topology`; v5e:2x2 for "
                    "a preset without one)")
flags.DEFINE_integer("slices", 1, "slices over DCN (multi-slice)")
flags.DEFINE_multi_string("set", [], "config override KEY=VALUE (e.g. train.micro_batches=8)")
flags.DEFINE_integer("layers", 0, "cut the model to this many layers (0: the preset's depth)")
flags.DEFINE_bool("scan_layers", True, "model.scan_layers (one scanned layer body)")
flags.DEFINE_string("out", "benchmarks/results/pods", "report path without extension (.json, .md);"
                    " rows merge into an existing JSON")
flags.DEFINE_string("dump_hlo", "", "folder for the optimized HLO text of each stage")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from lwm_jax import compile as aot  # pylint: disable=import-outside-toplevel
  problem = aot.libtpu_problem()
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    sys.exit(2)
  overrides = {}
  for item in FLAGS.set:
    if "=" not in item:
      print(f"error: --set '{item}' is not KEY=VALUE", file=sys.stderr)
      sys.exit(2)
    k, v = item.split("=", 1)
    try:
      overrides[k] = json.loads(v)
    except ValueError:
      overrides[k] = v
  if FLAGS.layers:
    overrides["model.num_hidden_layers"] = FLAGS.layers
  overrides.setdefault("model.scan_layers", FLAGS.scan_layers)
  rows = []
  for stage in FLAGS.stages:
    c = aot.stage_config(stage, FLAGS.preset, overrides)
    hlo = os.path.join(FLAGS.dump_hlo, f"{FLAGS.preset}_{stage}.hlo.txt") if FLAGS.dump_hlo else ""
    if hlo:
      os.makedirs(FLAGS.dump_hlo, exist_ok=True)
    topology = FLAGS.topology or c.get("topology") or "v5e:2x2"
    row = aot.compile_stage(c, stage, topology, FLAGS.slices, preset=FLAGS.preset,
                            dump_hlo=hlo)
    if overrides:
      row["overrides"] = {k: v for k, v in overrides.items()}
    rows.append(row)
    print(aot.markdown([row]), flush=True)
  aot.write_report(rows, FLAGS.out + ".json", FLAGS.out + ".md")
  print(f"wrote {FLAGS.out}.json and {FLAGS.out}.md")


if __name__ == "__main__":
  app.run(main)
