"""Listing drill: fine-tune a world model on the listing turns (`ls ...`) of terminal episodes, the
loss on nothing else, beside a share of ordinary SFT rows that keep the rest of what it knows.

Every earlier attempt at the demo's episode (`ls notes`, `ls -R`, `ls`, answered from the file
list of the initial state) mixed listing episodes into long CPT runs, where a listing answer is a
few percent of the tokens. The flag drill found that a model pre-trained on the corpus learns to
read a flag 500 tokens back within 100 steps when the loss falls on the deciding tokens only
(experiments/perturb_vs_plain/README.md); this is the same concentration for the lookup of names.

  python experiments/made_up_names/listing_drill.py --out=runs/listing_drill \
      --train=runs/listing_usual_tour/terminal_train.jsonl.gz,runs/listing_madeup_tour/terminal_train.jsonl.gz

--copy_share puts synthetic copy rows of random word pieces in every batch (`copy_row`: far rows,
or with --copy_short packed short induction rows), to teach the copying an `ls` of made-up names
needs beside the listings.

Every EVERY steps: the mean NLL a target token of the held-out listing turns (the listing probe's
episodes, seed 22: worlds never trained on), usual and made-up names apart, and of held-out copy
rows. At the end the model is written as a Hugging Face folder and plays the demo's episode and
the first three turns of every held-out terminal episode of the bundled corpus (as `make demo`
part 6 does).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from configs import stages
from configs import world_model as recipe
from listing_probe import HELD_OUT  # this folder (the script's own, first on the import path)
from lwm_jax import hf
from lwm_jax.checkpoints import recorded_thinking
from lwm_jax.data import corpus as corpus_lib
from lwm_jax.data import drill_sources, drills
from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.eval import episodes as episodes_lib
from lwm_jax.eval import row_nll
from lwm_jax.train import scored_run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
render = drill_sources.sft_row


# the drill's rows are the library's (lwm_jax/data/drill_sources.py; the recipe's stages in
# configs/world_model.py train the same mixture with the one trainer)
listing_turns = drill_sources.listing_turns
word_pieces = drills.word_piece_ids


def copy_row(rng, pieces: np.ndarray, seq_len: int, short: int = 0) -> tuple:
  """`drills.copy_row` without the segment ids of a far row (one document)."""
  row = drills.copy_row(rng, pieces, seq_len, short)
  return row if row[2] is not None else row[:2]


held_out_nll = row_nll.weighted_nll


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--start", default=os.path.join(ROOT, "data", "world_model"))
  ap.add_argument("--train", required=True, help="comma list of terminal episode files "
                  "(launch/collect.py output) whose listing turns are trained on")
  ap.add_argument("--mix", default=os.path.join(ROOT, "data", "corpus"), help="corpus folder "
                  "whose training split gives the ordinary SFT rows (every domain, every turn)")
  ap.add_argument("--mix_share", type=float, default=0.5, help="share of each batch drawn from "
                  "the ordinary rows")
  ap.add_argument("--copy_share", type=float, default=0.0, help="share of each batch that is "
                  "synthetic copy rows (`copy_row`), taken from the listing rows' share")
  ap.add_argument("--copy_short", type=int, default=0, help="copy rows made of packed induction "
                  "rows of this many pieces (0: one far row each)")
  ap.add_argument("--max_turn", type=int, default=12, help="listing turns among an episode's "
                  "first this many turns")
  ap.add_argument("--out", required=True)
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq_len", type=int, default=1024)
  ap.add_argument("--lr", type=float, default=1e-3)
  ap.add_argument("--every", type=int, default=50)
  ap.add_argument("--held_out", type=int, default=96, help="held-out listing turns a naming")
  args = ap.parse_args()
  t0 = time.time()
  start, sp, _, _ = corpus_lib.given_start(args.start)
  tok = load_tokenizer(sp)
  c = stages.STAGE_CONFIGS["sft"].get_config("demo")
  cfg = c.data.pipeline
  cfg.seq_len, cfg.thinking = args.seq_len, recorded_thinking(start)
  listing = listing_turns(args.train.split(","), args.max_turn)
  corpus = corpus_lib.load_corpus(args.mix)
  ordinary = [(t, k) for t in corpus.train for k in range(len(t.turns))]
  held = {names: [render(t, k, tok, cfg) for t, k in listing_turns([path], 6)[:args.held_out]]
          for names, path in HELD_OUT.items()}
  pieces = word_pieces(sp)
  held["copy"] = [copy_row(np.random.default_rng(10_000 + i), pieces, args.seq_len)
                  for i in range(16)]
  if args.copy_short:  # one short row alone (padding after it is never attended to)
    held["copy_short"] = [copy_row(np.random.default_rng(20_000 + i), pieces, args.copy_short,
                                   args.copy_short)[:2] for i in range(16)]
  print(f"{len(listing)} listing turns, {len(ordinary)} ordinary turns; held out "
        f"{ {k: len(v) for k, v in held.items()} } ({time.time() - t0:.0f} s)", flush=True)
  c = recipe.listing_drill(start, args.out, steps=args.steps, lr=args.lr,
                           copy_short=args.copy_short, batch=args.batch, seq_len=args.seq_len,
                           mix_share=args.mix_share, copy_share=args.copy_share).config
  c.data.drills.update(listing=args.train, mix=args.mix, max_turn=args.max_turn)
  c.data.tokenizer = sp
  c.checkpoint.update(every=args.every, keep=args.steps // args.every + 2)
  hf_dir = c.export_hf_dir = os.path.join(args.out, "hf")
  os.makedirs(args.out, exist_ok=True)

  def scores(model) -> dict:
    return {f"held_out_{k}": round(held_out_nll(model, v, args.seq_len, args.batch), 4)
            for k, v in held.items()}

  with open(os.path.join(args.out, "log.jsonl"), "w") as log_file:
    def log(rec):
      print(json.dumps(rec), flush=True)
      log_file.write(json.dumps(rec) + "\n")
      log_file.flush()
    log({"step": 0, "seconds": round(time.time() - t0, 1),
         **scores(hf.load_pretrained(start, dtype="float32"))})
    try:
      summary = scored_run.train_and_score(c, os.path.join(args.out, "run"), scores, log)
    except ValueError as e:
      raise SystemExit(str(e)) from None
  del summary
  with open(os.path.join(hf_dir, "provenance.json"), "w") as f:  # the reply mode, for the evals
    json.dump({"made_by": " ".join(["python"] + sys.argv), "start": start,
               "settings": {"thinking": "on" if cfg.thinking else "off"}}, f, indent=1)
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  sim = episodes_lib.simulated_terminal_episodes(Sampler.from_checkpoint(hf_dir), corpus.test,
                                           max_new_tokens=320)
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump({"command": " ".join(["python"] + sys.argv), "listing_turns": len(listing),
               "seconds": round(time.time() - t0, 1), "args": vars(args),
               "demo_episode": sim.get("mean_edit_similarity"),
               "terminal_episodes": {k: v for k, v in sim["all_terminal_test_episodes"].items()
                                     if k != "per_episode"}}, f, indent=1)


if __name__ == "__main__":
  main()
