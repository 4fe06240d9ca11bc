"""Collect scripted-agent trajectories from a real local environment into a JSONL(.gz) file.

  python launch/collect.py --env=terminal --episodes=50 --seed=0 --out=/tmp/terminal.jsonl.gz
  python launch/collect.py --env=search --episodes=20 --perturb="page_size:size=2; errors:rate=0.2" \
      --out=/tmp/search_perturbed.jsonl

`--perturb=SPEC` makes the real environment misbehave as the perturbation catalogue says (mcp,
search and web implement perturbations; see docs/perturbations.md); each trajectory records the
spec in `meta["perturb"]` and its instruction text in `simulation_instruction`.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from lwm_jax.envs import base, collect
from lwm_jax.data import schema

FLAGS = flags.DEFINE_enum("env", None, list(base.env_names()), "environment to run")
EPISODES = flags.DEFINE_integer("episodes", 10, "number of episodes")
SEED = flags.DEFINE_integer("seed", 0, "base seed; episode i uses a seed derived from (seed, i)")
OUT = flags.DEFINE_string("out", None, "output JSONL file (.gz for gzip)")
WORKERS = flags.DEFINE_integer("workers", 2, "parallel worker processes")
MAX_TURNS = flags.DEFINE_integer("max_turns", 30, "turn limit per episode")
PERTURB = flags.DEFINE_string("perturb", "", "perturbation spec applied to every episode, e.g. "
                              "'errors:rate=0.2,kind=timeout; page_size:size=3'")
NAMES = flags.DEFINE_enum("names", "usual", ["usual", "made_up"], "terminal only: how the worlds "
                          "name their directories and files (made_up: made-up words, read off the "
                          "file listing; lwm_jax/envs/terminal/worlds.py)")
TASK = flags.DEFINE_string("task", "", "terminal only: every episode's task kind (e.g. tour: list "
                           "every directory); empty: drawn per episode as in the corpus")
flags.mark_flags_as_required(["env", "out"])


def main(argv: list[str]) -> None:
  del argv
  options = {k: v for k, v in (("names", NAMES.value), ("task", TASK.value))
             if v not in ("", "usual")}
  if options and FLAGS.value != "terminal":
    print(f"error: --{next(iter(options))} is an option of the terminal environment, not of "
          f"'{FLAGS.value}'", file=sys.stderr)
    sys.exit(2)
  bad = [f"--{n} must be at least 1, got {v}" for n, v in
         (("episodes", EPISODES.value), ("workers", WORKERS.value), ("max_turns", MAX_TURNS.value))
         if v < 1]
  out = os.path.abspath(OUT.value)
  parent = os.path.dirname(out)
  while parent and not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if os.path.isdir(out):
    bad.append(f"--out={OUT.value} is a folder; give a JSONL file name (e.g. DIR/episodes.jsonl.gz)")
  elif not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
    bad.append(f"--out={OUT.value}: {parent} is not a writable folder")
  if bad:  # before any episode is collected
    print(f"error: {bad[0]}", file=sys.stderr)
    sys.exit(2)
  try:
    trajs, stats = collect.collect(FLAGS.value, EPISODES.value, SEED.value, WORKERS.value,
                                   MAX_TURNS.value, perturb=PERTURB.value, env_options=options)
  except ValueError as e:  # a bad or unsupported --perturb: one clear line
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  os.makedirs(os.path.dirname(os.path.abspath(OUT.value)), exist_ok=True)
  n = schema.write_jsonl(OUT.value, trajs)
  print(json.dumps({**stats, "dropped": len(stats["dropped"]), "written": n, "out": OUT.value}))
  for tid, why in stats["dropped"].items():
    print(f"dropped {tid}: {why}", file=sys.stderr)


if __name__ == "__main__":
  app.run(main)
