"""The shipped world model's recipe (data/world_model/): one preset per stage, run in order by
`launch/world_model.py` (`make world-model`, about 7 h 30 min on 2 idle CPU cores).

  python launch/world_model.py                                # every stage, in order
  python launch/world_model.py --stages=cs1 --config.cs1.config.train.num_steps=80
  python launch/world_model.py --plan_only                    # the commands, nothing run

`get_config()` is the whole recipe (`order` and one section per stage); `get_config("cs1")` the
same with `order` = that stage only. Every stage has a `kind`, an `init_from` (the model it
starts from: "" for random initialisation, else an earlier stage's `output`) and an `output`:

  reproduce  launch/reproduce.py on configs/reproduce.py:`variant` with `args` (fields of that
             config, given as --config.FIELD=VALUE), `cpt_from=init_from` and `ship=output`:
             CPT then SFT, every model evaluated free-running, shipped with its provenance.json
  collect    launch/collect.py with `args`, `--out=output`: episodes of a real environment
  train      the one trainer (lwm_jax/train/trainer.py) on `config`, a training config whose
             data is a drill mixture (`data.source = "drills"`, lwm_jax/data/drill_sources.py):
             listing turns of the tours, ordinary SFT rows of the corpus and synthetic copy rows;
             `output` is its workdir, the model `output`/hf (with provenance.json)

A stage's learning rate is set once, here (reproduce: `cpt_lr` / `sft_lr`, one per trained
stage; train: `config.optim.lr`).

Stages (the measurements: experiments/reproduce_cpt2000 .. reproduce_more_worlds,
experiments/made_up_names, experiments/reproduce_copy):
  cpt2000      2000 CPT steps from scratch, 300 SFT                      runs/world_model_2000
  cpt4000      2000 more CPT steps, 300 SFT                              runs/world_model_4000
  cpt6000      2000 more at CPT peak 1e-3 and SFT 3e-4                   data/world_model
  cpt8000      the same once more, shipped over it                       data/world_model
  more_worlds  once more with the 10,500 episodes of `make more-worlds`  data/world_model
  tour_usual / tour_madeup   terminal tours, usual and made-up names (2000 episodes each)
  cs1          listing drill with packed copy rows of 64 pieces, 1200 steps   runs/cs1/hf
  cs2          the same with packed rows of 512, 700 steps                    runs/cs2/hf
  cs3          the same with far rows of 1024, 500 steps                      runs/cs3/hf
  copy         800 CPT steps with far copy rows in the batches, 300 SFT       data/world_model
"""
from __future__ import annotations

import os

import ml_collections

from configs import ConfigError, close_matches, reproduce, sft

TOURS = ("runs/listing_usual_tour/terminal_train.jsonl.gz",
         "runs/listing_madeup_tour/terminal_train.jsonl.gz")
REPRODUCE = "configs/reproduce.py"
FULL = dict(cpt_steps=2000)  # the `full` variant with 2000 CPT steps


def _reproduce(init_from: str, output: str, workdir: str, *, cpt_lr: float, sft_lr: float,
               **args) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      kind="reproduce", init_from=init_from, output=output, variant="full",
      args=dict(FULL, cpt_lr=cpt_lr, sft_lr=sft_lr, workdir=workdir, **args)))


def _collect(output: str, **args) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      kind="collect", init_from="", output=output,
      args=dict(env="terminal", episodes=2000, workers=1, task="tour", **args)))


def listing_drill(init_from: str, output: str, *, steps: int, lr: float, copy_short: int = 0,
                  batch: int = 8, seq_len: int = 1024, mix_share: float = 0.25,
                  copy_share: float = 0.5) -> ml_collections.ConfigDict:
  """A listing-drill stage: the SFT demo config (its optimizer: AdamW, warm-up, cosine decay
  over `steps`) at peak `lr`, from `init_from`, on the listing turns of the tours (the first 12
  turns of each episode), a share `mix_share` of each batch of ordinary SFT rows of the bundled
  corpus and `copy_share` of copy rows (packed induction rows of `copy_short` word pieces, or far
  rows of the whole row with `copy_short` 0)."""
  c = sft.get_config("demo")
  c.seed = 0
  c.train.update(num_steps=steps, batch_size=batch, seq_len=seq_len, log_every=10,
                 eval_every=0)
  c.optim.lr = lr
  c.checkpoint.update(every=100, keep=1)
  c.data.source = "drills"
  c.data.tokenizer = os.path.join(init_from, "tokenizer.model")
  c.data.drills = _drill_defaults()
  c.data.drills.update(kind="listing", listing=",".join(TOURS), max_turn=12, mix="data/corpus",
                       mix_share=mix_share, copy_share=copy_share, copy_short=copy_short)
  c.init_from_hf = init_from
  c.export_hf = True
  return ml_collections.ConfigDict(dict(kind="train", init_from=init_from, output=output,
                                        config=c))


def _drill_defaults() -> ml_collections.ConfigDict:
  from lwm_jax.data import drill_sources  # pylint: disable=import-outside-toplevel
  return drill_sources.default_config()


def stages() -> dict[str, ml_collections.ConfigDict]:
  """Every stage of the recipe, in the order they run."""
  ship, worlds = "data/world_model", "runs/more_worlds"
  return {
      "cpt2000": _reproduce("", "runs/world_model_2000", "runs/reproduce_ship",
                            cpt_lr=3e-3, sft_lr=1e-3),
      "cpt4000": _reproduce("runs/world_model_2000", "runs/world_model_4000",
                            "runs/reproduce_ship_more", cpt_lr=3e-3, sft_lr=1e-3),
      "cpt6000": _reproduce("runs/world_model_4000", ship, "runs/reproduce_ship_more_lr1e-3",
                            cpt_lr=1e-3, sft_lr=3e-4),
      "cpt8000": _reproduce(ship, ship, "runs/reproduce_ship_8000", cpt_lr=1e-3, sft_lr=3e-4),
      "more_worlds": _reproduce(ship, ship, "runs/reproduce_ship_worlds", cpt_lr=1e-3,
                                sft_lr=3e-4, more_worlds=worlds),
      "tour_usual": _collect(TOURS[0], seed=31),
      "tour_madeup": _collect(TOURS[1], seed=33, names="made_up"),
      "cs1": listing_drill(ship, "runs/cs1", steps=1200, lr=1e-3, copy_short=64),
      "cs2": listing_drill("runs/cs1/hf", "runs/cs2", steps=700, lr=1e-3, copy_short=512),
      "cs3": listing_drill("runs/cs2/hf", "runs/cs3", steps=500, lr=1e-3),
      "copy": _reproduce("runs/cs3/hf", ship, "runs/reproduce_ship_copy", cpt_lr=1e-3,
                         sft_lr=3e-4, cpt_steps=800, more_worlds=worlds, drill_share=0.125,
                         drill_rows="far1024"),
  }


def model_of(stage: ml_collections.ConfigDict) -> str:
  """The folder of the model a stage leaves (a train stage: its workdir's hf/ export)."""
  return os.path.join(stage.output, "hf") if stage.kind == "train" else stage.output


def command(stage: ml_collections.ConfigDict) -> list[str]:
  """The launch script and flags of a reproduce or collect stage (relative to the repository
  root): configs/reproduce.py:`variant` with each of its `args`, `cpt_from=init_from` (when it
  has one) and `ship=output` as a --config.FIELD override, or `args` as flags with
  `--out=output`. A reproduce arg that is no field of that config is a ConfigError naming it."""
  args = dict(stage.args)
  if stage.kind == "reproduce":
    if stage.init_from:
      args["cpt_from"] = stage.init_from
    args["ship"] = stage.output
    fields = reproduce.get_config(stage.variant)
    for k in args:
      if k not in fields:
        raise ConfigError(f"a reproduce stage's args.{k}: configs/reproduce.py has no field "
                          f"'{k}'{close_matches(k, list(fields))}")
    return (["launch/reproduce.py", f"--config={REPRODUCE}:{stage.variant}"]
            + [f"--config.{k}={v}" for k, v in args.items()])
  if stage.kind == "collect":
    args["out"] = stage.output
    return ["launch/collect.py"] + [f"--{k}={v}" for k, v in args.items()]
  raise ValueError(f"a {stage.kind} stage runs in the trainer, not as a command")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  all_stages = stages()
  if arg is not None and arg not in all_stages:
    raise ConfigError(f"no stage '{arg}'{close_matches(arg, list(all_stages))}; stages: "
                      f"{', '.join(all_stages)}")
  c = ml_collections.ConfigDict(all_stages)
  c.order = arg or ",".join(all_stages)
  return c
