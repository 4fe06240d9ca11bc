"""How high can any model score on the demo's terminal episode (`terminal-s0-00002`)?

The log the episode reads is drawn at random by the terminal world generator
(lwm_jax/envs/terminal/worlds.py): 14-40 lines with random times, levels, users and messages, in
one of two formats picked per world, and nothing in the initial state shows which. So a
simulator can at best write *a* log of the right shape, not this one. This script scores such
an "oracle" of the generator against the real observations with the episode's metric
(`lwm_jax.textsim.edit_similarity`): for each of 100 seeds it draws a log with the
generator's own function, in each format, with this world's user names (read off the real log,
more than a model could know), and builds what `tail -f` (last ten lines, then the sandbox's
kill message, taken from the real observation) and `head -n 5` would show. The middle turn,
`ls logs/gateway data`, follows from the file list in the initial state, so the oracle gets it
exactly (1.0).

    python experiments/reproduce_cpt2000/episode_ceiling.py
"""
from __future__ import annotations

import gzip
import json
import random
import re
import statistics
from pathlib import Path

from lwm_jax.envs.terminal import worlds as terminal_worlds
from lwm_jax.textsim import edit_similarity

ROOT = Path(__file__).resolve().parents[2]
EPISODE = "terminal-s0-00002"
PROMPT = "root@sandbox:~# "


def main() -> None:
  with gzip.open(ROOT / "data/corpus/terminal_test.jsonl.gz", "rt") as f:
    traj = next(t for t in map(json.loads, f) if t["id"] == EPISODE)
  tail_obs, _, head_obs = (t["observation"] for t in traj["turns"][:3])
  users = sorted(set(re.findall(r"\[(\w+)\]", tail_obs + head_obs)))
  kill = "\n".join(tail_obs.splitlines()[10:])       # what follows the ten log lines
  for fmt in ("bracket", "keyvalue"):
    tails, heads = [], []
    for seed in range(100):
      lines = terminal_worlds._log(random.Random(seed), users, fmt).splitlines()
      tails.append(edit_similarity("\n".join(lines[-10:] + [kill]), tail_obs))
      heads.append(edit_similarity("\n".join(lines[:5]) + "\n" + PROMPT, head_obs))
    t, h = statistics.mean(tails), statistics.mean(heads)
    print(f"oracle in the {fmt} format: tail -f {t:.3f}, ls 1.000, head {h:.3f}; "
          f"mean over the three turns {(t + 1.0 + h) / 3:.3f}")


if __name__ == "__main__":
  main()
