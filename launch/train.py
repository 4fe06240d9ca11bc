"""Training entry point for every stage and every machine size.

  python launch/train.py --config=configs/cpt.py:tiny --workdir=/tmp/cpt
  python launch/train.py --config=configs/sft.py:small --workdir=DIR --config.train.num_steps=50
  python launch/train.py --config=configs/rl.py:tiny --workdir=DIR --config.rl.algo=gspo_token
  python launch/train.py --config=configs/rl.py:demo --workdir=DIR --config.data.tokenizer=SP \
      --config.data.pipeline.jsonl='data/corpus/*_train.jsonl.gz' --config.init_from_hf=SFT_HF

Multi-host: on TPU pods / SLURM pass `--config.dist.auto=true` (jax.distributed auto-detection), or
`--config.dist.coordinator_address=HOST:PORT --config.dist.num_processes=N --config.dist.process_id=I`
(e.g. CPU processes on loopback with `--config.dist.cpu_collectives=gloo`).

A config file, preset or field that does not exist, or a value of the wrong type, is one line on
stderr naming it (with close matches) and exit status 2.
"""
import json
import logging
import sys

from absl import app, flags
from absl import logging as absl_logging

import configs  # pylint: disable=wrong-import-position

flags.DEFINE_string("workdir", None, "output folder (checkpoints, metrics, config.json)")
flags.mark_flags_as_required(["workdir"])


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def main(argv):
  del argv
  from lwm_jax import stages  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  logging.getLogger().setLevel(logging.INFO)
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax is chatty at INFO
  config = flags.FLAGS.config
  try:
    summary = trainer.train(config, flags.FLAGS.workdir, source=stages.rollout_source(config))
  except (ValueError, OSError, trainer.TrainingDiverged) as e:  # OSError: a missing data file
    _fail(str(e))
  losses = summary.pop("losses")
  summary["first_loss"] = losses[0] if losses else None
  summary["last_loss"] = losses[-1] if losses else None
  print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, dict)}, default=str))


if __name__ == "__main__":
  app.run(main, flags_parser=configs.flags_parser(None, "configs/<stage>.py:<preset>"))
