"""The shipped world model's recipe as presets (configs/world_model.py): every stage starts from
an earlier stage's model, sets its learning rate once, and asks for what the Makefile's eleven
command lines asked for before (commit e7b63f9, quoted below as the reference); `make
world-model` names no experiment file."""
import os
import re
import shlex

import pytest

from configs import ConfigError, cpt, sft, world_model
from lwm_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = ("runs/listing_usual_tour/terminal_train.jsonl.gz,"
     "runs/listing_madeup_tour/terminal_train.jsonl.gz")
# the `world-model` target's lines at e7b63f9 (LISTING_TOURS expanded to T)
OLD_MAKEFILE = f"""
launch/reproduce.py --budget=full --cpt_steps=2000 --workdir=runs/reproduce_ship --ship=runs/world_model_2000
launch/reproduce.py --budget=full --cpt_steps=2000 --cpt_from=runs/world_model_2000 --workdir=runs/reproduce_ship_more --ship=runs/world_model_4000
launch/reproduce.py --budget=full --cpt_steps=2000 --cpt_from=runs/world_model_4000 --cpt_lr=1e-3 --sft_lr=3e-4 --workdir=runs/reproduce_ship_more_lr1e-3 --ship=data/world_model
launch/reproduce.py --budget=full --cpt_steps=2000 --cpt_from=data/world_model --cpt_lr=1e-3 --sft_lr=3e-4 --workdir=runs/reproduce_ship_8000 --ship=data/world_model
launch/reproduce.py --budget=full --cpt_steps=2000 --cpt_from=data/world_model --cpt_lr=1e-3 --sft_lr=3e-4 --more_worlds=runs/more_worlds --workdir=runs/reproduce_ship_worlds --ship=data/world_model
launch/collect.py --env=terminal --episodes=2000 --seed=31 --workers=1 --task=tour --out=runs/listing_usual_tour/terminal_train.jsonl.gz
launch/collect.py --env=terminal --episodes=2000 --seed=33 --workers=1 --names=made_up --task=tour --out=runs/listing_madeup_tour/terminal_train.jsonl.gz
experiments/made_up_names/listing_drill.py --train={T} --batch=8 --out=runs/cs1 --steps=1200 --every=100 --lr=1e-3 --mix_share=0.25 --copy_share=0.5 --copy_short=64
experiments/made_up_names/listing_drill.py --start=runs/cs1/hf --train={T} --batch=8 --out=runs/cs2 --steps=700 --every=100 --lr=1e-3 --mix_share=0.25 --copy_share=0.5 --copy_short=512
experiments/made_up_names/listing_drill.py --start=runs/cs2/hf --train={T} --batch=8 --out=runs/cs3 --steps=500 --every=100 --lr=1e-3 --mix_share=0.25 --copy_share=0.5
launch/reproduce.py --budget=full --cpt_steps=800 --cpt_from=runs/cs3/hf --cpt_lr=1e-3 --sft_lr=3e-4 --more_worlds=runs/more_worlds --drill_share=0.125 --drill_rows=far1024 --workdir=runs/reproduce_ship_copy --ship=data/world_model
"""


def _flags(argv):
  return dict(a[2:].split("=", 1) for a in argv)


def _flatten(d, prefix=""):
  for k, v in d.items():
    if isinstance(v, dict):
      yield from _flatten(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


@pytest.fixture(scope="module")
def recipe():
  return world_model.get_config()


def test_every_stage_starts_from_an_earlier_stage(recipe):
  order = recipe.order.split(",")
  assert len(order) == 11 and order == list(world_model.stages())
  made = set()
  for name in order:
    stage = recipe[name]
    if stage.kind == "reproduce" and name != order[0]:
      assert stage.init_from in made, f"{name} starts from {stage.init_from!r}"
    if stage.kind == "train":
      assert stage.init_from in made and stage.config.init_from_hf == stage.init_from
      assert stage.config.data.tokenizer == os.path.join(stage.init_from, "tokenizer.model")
    made.add(world_model.model_of(stage))
  assert recipe[order[0]].init_from == ""
  assert world_model.model_of(recipe[order[-1]]) == "data/world_model"


def test_one_learning_rate_per_trained_stage(recipe):
  for name in recipe.order.split(","):
    stage = recipe[name]
    lrs = {k: v for k, v in _flatten(stage.to_dict()) if re.search(r"(^|[._])(cpt_|sft_)?lr$", k)}
    if stage.kind == "reproduce":  # a CPT run and an SFT run, each its one rate
      assert set(lrs) == {"args.cpt_lr", "args.sft_lr"} and min(lrs.values()) > 0, (name, lrs)
    elif stage.kind == "train":
      assert set(lrs) == {"config.optim.lr"}, (name, lrs)
    else:
      assert not lrs


def test_stages_ask_for_what_the_old_makefile_did(recipe):
  old = [shlex.split(line) for line in OLD_MAKEFILE.strip().splitlines()]
  defaults = {"cpt_lr": cpt.get_config("demo").optim.lr, "sft_lr": sft.get_config("demo").optim.lr}
  for name, line in zip(recipe.order.split(","), old):
    stage = recipe[name]
    want = _flags(line[1:])
    if stage.kind != "train":
      assert world_model.command(stage)[0] == line[0]
      got = _flags(world_model.command(stage)[1:])
      if line[0].endswith("reproduce.py"):
        for k, v in defaults.items():  # the old lines left the first two stages at the defaults
          want.setdefault(k, str(v))
        # the old flags are fields of configs/reproduce.py now: --budget=B is its variant B
        want = {("config" if k == "budget" else f"config.{k}"):
                (f"configs/reproduce.py:{v}" if k == "budget" else v) for k, v in want.items()}
      assert {k: float(v) if k.endswith("lr") else v for k, v in got.items()} == \
          {k: float(v) if k.endswith("lr") else v for k, v in want.items()}, name
      continue
    c = stage.config
    assert stage.init_from == want.get("start", "data/world_model")  # the script's default start
    assert stage.output == want["out"]
    d = c.data.drills
    assert (d.listing, d.mix, d.max_turn, d.kind) == (want["train"], "data/corpus", 12, "listing")
    assert (c.train.num_steps, c.train.batch_size, c.train.seq_len) == \
        (int(want["steps"]), int(want["batch"]), 1024)
    assert (c.optim.lr, d.mix_share, d.copy_share, d.copy_short) == \
        (float(want["lr"]), float(want["mix_share"]), float(want["copy_share"]),
         int(want.get("copy_short", 0)))
    # the old script's optimizer: the SFT demo config's, at the stage's peak rate
    base = sft.get_config("demo").optim.to_dict()
    assert dict(c.optim.to_dict(), lr=base["lr"]) == base


def test_reproduce_commands_parse_and_resolve(recipe):
  """Each reproduce stage's command is a valid command line of launch/reproduce.py: its variant
  exists, every --config.FIELD names a field, and the values pass the run's own check."""
  import configs
  from absl import flags
  from ml_collections import config_flags
  from lwm_jax.recipe import reproduce
  here = os.getcwd()
  os.chdir(ROOT)  # the commands' paths are relative to the repository root
  try:
    for name in recipe.order.split(","):
      if recipe[name].kind != "reproduce":
        continue
      cmd = world_model.command(recipe[name])
      configs.check_command_line(cmd)
      fv = flags.FlagValues()
      config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                      sys_argv=cmd)
      fv(cmd)
      s = reproduce.resolve(fv.config)
      assert (s.budget, s.ship) == ("full", recipe[name].output), name
      assert (s.cpt_lr, s.sft_lr) == (recipe[name].args.cpt_lr, recipe[name].args.sft_lr)
  finally:
    os.chdir(here)
  bad = world_model.get_config("cpt2000").cpt2000
  bad.args.cpt_stpes = 3
  with pytest.raises(ConfigError, match="args.cpt_stpes: configs/reproduce.py has no field "
                                        r"'cpt_stpes' \(close matches: cpt_steps"):
    world_model.command(bad)


def test_first_drill_stage_is_a_valid_training_config(recipe):
  c = recipe.cs1.config
  here = os.getcwd()
  os.chdir(ROOT)  # the recipe's paths are relative to the repository root
  try:
    trainer.validate_config(c)
  finally:
    os.chdir(here)
  assert c.data.source == "drills" and c.export_hf


def test_make_world_model_names_no_experiment_file():
  with open(os.path.join(ROOT, "Makefile")) as f:
    text = f.read()
  body = re.search(r"^world-model:.*?\n((?:\t.*\n)+)", text, re.M).group(1)
  assert "experiments/" not in body and "launch/world_model.py" in body


def test_unknown_stage_is_named():
  with pytest.raises(ConfigError, match="no stage 'cs4'.*close matches"):
    world_model.get_config("cs4")
  assert world_model.get_config("cs2").order == "cs2"


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_runner_plans_the_stages_it_is_given():
  import subprocess
  import sys
  run = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "world_model.py"),
                        "--plan_only", "--stages=cpt6000,tour_usual,cs3"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert run.returncode == 0, run.stderr[-2000:]
  lines = [l for l in run.stdout.splitlines() if l.startswith(("===", "launch/"))]
  assert lines[0] == "=== cpt6000 (reproduce): runs/world_model_4000 -> data/world_model"
  assert lines[1].startswith("launch/reproduce.py ") and "--config.cpt_lr=0.001" in lines[1]
  assert lines[3].startswith("launch/collect.py ") and "--seed=31" in lines[3]
  assert lines[4] == "=== cs3 (train): runs/cs2/hf -> runs/cs3/hf"
  bad = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "world_model.py"),
                        "--plan_only", "--stages=cs9"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
  assert bad.returncode != 0 and "no stage 'cs9'" in bad.stderr
