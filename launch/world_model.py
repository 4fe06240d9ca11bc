"""Runs the shipped world model's recipe, configs/world_model.py, stage by stage (`make world-model`).

  python launch/world_model.py                                   # every stage, in order
  python launch/world_model.py --stages=cs1,cs2                  # some stages
  python launch/world_model.py --stages=cs1 --config.cs1.config.train.num_steps=80
  python launch/world_model.py --plan_only                       # print the plan, run nothing

A reproduce or collect stage runs its launch script as a command; a train stage runs the one
trainer in this process and writes provenance.json beside its Hugging Face export (the command,
the stage's reply mode and the start's own provenance, so the chain stays traceable). Paths are relative to the
repository root. A train stage whose workdir holds checkpoints resumes from the latest.
"""
import json
import os
import subprocess
import sys

from absl import app, flags
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from configs import world_model as recipe  # pylint: disable=wrong-import-position

config_flags.DEFINE_config_file("config", os.path.join(ROOT, "configs", "world_model.py"),
                                "the recipe: configs/world_model.py[:STAGE]", lock_config=True)
flags.DEFINE_string("stages", "", "comma list of the stages to run (default: the config's order)")
flags.DEFINE_bool("plan_only", False, "print each stage's command or config and stop")


def plan(config) -> list[str]:
  """The stages to run, checked: each exists and starts from nothing or an earlier output."""
  order = [s for s in (flags.FLAGS.stages or config.order).split(",") if s]
  known = recipe.stages()
  for name in order:
    if name not in known:
      raise app.UsageError(f"--stages: no stage '{name}' (stages: {', '.join(known)})")
  return order


def train(name: str, stage) -> dict:
  """A train stage: the trainer on the stage's config, then OUTPUT/hf/provenance.json."""
  from lwm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  summary = trainer.train(stage.config, stage.output)
  hf_dir = summary["export_hf"]
  drill = stage.config.data.drills
  thinking = (checkpoints.recorded_thinking(stage.init_from) if drill.thinking == "auto"
              else drill.thinking == "on")
  prov = {"made_by": " ".join(["launch/world_model.py"] + sys.argv[1:]),
          "stage": f"configs/world_model.py:{name}", "start": stage.init_from,
          "config": summary["config_file"],
          "settings": {"thinking": "on" if thinking else "off"},
          "last_loss": summary["losses"][-1] if summary["losses"] else None}
  earlier = checkpoints.read_provenance(stage.init_from)
  if earlier is not None:
    prov["start_provenance"] = earlier
  with open(os.path.join(hf_dir, "provenance.json"), "w") as f:
    json.dump(prov, f, indent=1)
  return {"stage": name, "model": hf_dir, "steps": summary["final_step"],
          "last_loss": prov["last_loss"]}


def main(argv):
  del argv
  os.chdir(ROOT)  # the recipe's paths are relative to the repository root
  config = flags.FLAGS.config
  for name in plan(config):
    stage = config[name]
    print(f"=== {name} ({stage.kind}): {stage.init_from or 'scratch'} -> "
          f"{recipe.model_of(stage)}", flush=True)
    if stage.kind == "train":
      if flags.FLAGS.plan_only:
        print(stage.config)
        continue
      print(json.dumps(train(name, stage)), flush=True)
      continue
    cmd = recipe.command(stage)
    print(" ".join(cmd), flush=True)
    if not flags.FLAGS.plan_only:
      subprocess.run([sys.executable] + cmd, check=True, cwd=ROOT)


if __name__ == "__main__":
  app.run(main)
