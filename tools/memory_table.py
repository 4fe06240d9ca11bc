"""Per-device memory of parameters, gradients and AdamW state for a preset on an abstract mesh.

  python tools/memory_table.py --preset=qwen35_397b_a17b --mesh=fsdp=32,expert=8
No devices are needed: shapes come from `nnx.eval_shape` and shardings from the logical-axis rules.
"""
from absl import app, flags

from lwm_jax.model import sizes
from lwm_jax.model.config import get_preset

FLAGS = flags.FLAGS
flags.DEFINE_list("preset", ["qwen35_35b_a3b", "qwen35_397b_a17b", "qwen3_30b_a3b"], "presets")
flags.DEFINE_list("mesh", ["fsdp=32,expert=8"], "meshes as axis=size pairs joined by commas; "
                  "separate several meshes with ';'")
flags.DEFINE_string("param_dtype", "float32", "parameter dtype (float32 or bfloat16)")


def main(_):
  meshes = [dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in m.split("+"))
            for m in ",".join(FLAGS.mesh).replace(";", " ").split()
            for m in [m.replace(",", "+")]]
  gib = 1024 ** 3
  print("| preset | total params | active/token | mesh | devices | params GiB/dev | grads GiB/dev "
        "| AdamW GiB/dev | total GiB/dev |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name in FLAGS.preset:
    cfg = get_preset(name, param_dtype=FLAGS.param_dtype)
    s = sizes.count(cfg)
    for mesh in meshes:
      n = 1
      for v in mesh.values():
        n *= v
      b = sizes.per_device_bytes(cfg, mesh)
      print(f"| {name} | {s.total_params / 1e9:.2f}B | {s.active_with_embedding / 1e9:.2f}B | "
            f"{','.join(f'{k}={v}' for k, v in mesh.items())} | {n} | {b['params'] / gib:.2f} | "
            f"{b['grads'] / gib:.2f} | {b['adam'] / gib:.2f} | {b['total'] / gib:.2f} |")


if __name__ == "__main__":
  app.run(main)
