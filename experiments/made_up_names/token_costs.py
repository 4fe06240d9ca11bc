"""Token costs: the NLL of every target token of the first few held-out listing turns (the
listing probe's made-up worlds, seed 22), teacher-forced, as `piece:nats`. A model that copies
names from the initial state pays for the first piece of a name at most; one that does not pays
for every piece.

  python experiments/made_up_names/token_costs.py data/world_model [--turns=3] [--naming=made_up]
"""
import argparse

import jax
import numpy as np

from configs import stages
from listing_probe import HELD_OUT, is_listing  # this folder (the script's own, on the path)
from lwm_jax import hf
from lwm_jax.checkpoints import recorded_thinking
from lwm_jax.data import corpus as corpus_lib
from lwm_jax.data import schema
from lwm_jax.data.drill_sources import sft_row as render
from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.eval.row_nll import pad, score


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("model")
  ap.add_argument("--turns", type=int, default=3)
  ap.add_argument("--naming", choices=sorted(HELD_OUT), default="made_up")
  ap.add_argument("--seq_len", type=int, default=1024)
  args = ap.parse_args()
  start, sp, _, _ = corpus_lib.given_start(args.model)
  tok = load_tokenizer(sp)
  cfg = stages.STAGE_CONFIGS["sft"].get_config("demo").data.pipeline
  cfg.seq_len, cfg.thinking = args.seq_len, recorded_thinking(start)
  model = hf.load_pretrained(start, dtype="float32")
  shown = 0
  for traj in schema.read_jsonl(HELD_OUT[args.naming]):
    for k, turn in enumerate(traj.turns[:6]):
      if shown == args.turns or not is_listing(turn.action):
        continue
      shown += 1
      toks, wts = pad([render(traj, k, tok, cfg)], args.seq_len)
      nll, _ = jax.device_get(score(model, toks))
      where = np.nonzero(np.asarray(wts)[0, 1:])[0]
      print(f"{traj.id} turn {k}: {turn.action}\n{traj.initial_state}")
      print(" ".join(f"{tok.decode([int(toks[0, i + 1])])!r}:{nll[0, i]:.1f}" for i in where))
      print()


if __name__ == "__main__":
  main()
