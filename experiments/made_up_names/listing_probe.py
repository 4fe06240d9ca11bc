"""Listing probe: a world model plays the first six turns of 40 held-out terminal episodes
(greedy, its own answers as history), each recorded twice in the same world: once under the
usual directory and file names, once under made-up ones (`launch/collect.py --names=made_up`).
Seed 22; training used seeds 0, 1 and 21, so none of these worlds was seen. Prints the mean edit
similarity of listing turns (`ls ...`, answered from the initial state's file list) and of the
other turns, per naming, and writes every played turn to OUT_DIR/listing_probe_<model>.json.

  python launch/collect.py --env=terminal --episodes=40 --seed=22 --workers=1 \
      --out=runs/terminal_usual_heldout/terminal_test.jsonl.gz
  python launch/collect.py --env=terminal --episodes=40 --seed=22 --workers=1 --names=made_up \
      --out=runs/terminal_made_up_heldout/terminal_test.jsonl.gz
  python experiments/made_up_names/listing_probe.py OUT_DIR MODEL_DIR [MODEL_DIR ...]
"""
import json
import os
import sys

import numpy as np

from lwm_jax.eval import episodes as episodes_lib
from lwm_jax.data import drills, schema  # noqa: E402
from lwm_jax.sampling import Sampler  # noqa: E402

HELD_OUT = {"usual": "runs/terminal_usual_heldout/terminal_test.jsonl.gz",
            "made_up": "runs/terminal_made_up_heldout/terminal_test.jsonl.gz"}


is_listing = drills.is_listing  # an `ls` command, answered from the initial state's file list


def main(out_dir: str, models: list[str]) -> None:
  episodes = {k: list(schema.read_jsonl(p)) for k, p in HELD_OUT.items()}
  for path in models:
    sampler = Sampler.from_checkpoint(path)
    rows, played_all = [], {}
    for names, eps in episodes.items():
      played = played_all[names] = episodes_lib.play_episodes(sampler, eps, turns=6, max_new_tokens=320)
      sims = {"listing": [], "other": []}
      for p in played:
        for action, sim in zip(p["actions"], p["edit_similarity"]):
          sims["listing" if is_listing(action) else "other"].append(sim)
      rows.append(f"{names:8s} listing turns {np.mean(sims['listing']):.3f} "
                  f"({len(sims['listing'])}), other turns {np.mean(sims['other']):.3f} "
                  f"({len(sims['other'])})")
    print(path)
    print("\n".join("  " + r for r in rows), flush=True)
    name = os.path.basename(os.path.normpath(path))
    with open(os.path.join(out_dir, f"listing_probe_{name}.json"), "w") as f:
      json.dump(played_all, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
