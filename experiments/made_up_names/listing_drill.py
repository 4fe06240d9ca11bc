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
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments", "perturb_vs_plain"))
from lwm_jax.data import corpus as corpus_lib
from lwm_jax.eval import episodes as episodes_lib
from configs import stages
from departure_drill import pad, render, save, score, train_step, trainable  # noqa: E402
from listing_probe import HELD_OUT, is_listing  # noqa: E402
from lwm_jax.checkpoints import recorded_thinking  # noqa: E402
from lwm_jax.data import drills, schema  # noqa: E402
from lwm_jax.data.tokenizer import load_tokenizer  # noqa: E402


def listing_turns(paths, max_turn: int) -> list[tuple[schema.Trajectory, int]]:
  """(episode, turn) for every listing turn among the first `max_turn` turns of each episode."""
  out = []
  for path in paths:
    n = 0
    for traj in schema.read_jsonl(path):
      for k, turn in enumerate(traj.turns[:max_turn]):
        if is_listing(turn.action):
          out.append((traj, k))
          n += 1
    print(f"{path}: {n} listing turns", flush=True)
  return out


def word_pieces(sp_path: str) -> np.ndarray:
  """Ids of the tokenizer's plain word pieces (letters and digits, with or without the leading
  space mark): what the synthetic copy rows are drawn from."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  sp = spm.SentencePieceProcessor(model_file=sp_path)
  return np.array([i for i in range(sp.get_piece_size())
                   if re.fullmatch(r"\u2581?[A-Za-z0-9]+", sp.id_to_piece(i))], np.int32)


def copy_row(rng, pieces: np.ndarray, seq_len: int, short: int = 0) -> tuple:
  """(ids, weights) of a copy row of random word pieces, the loss on the targets
  only copying predicts: the lookup an `ls` answer needs, on its own. `short` 0: one far row of
  the induction drill (`drills.far_rows`: segments over the first half, the same segments in a
  shuffled order over the second); else seq_len // short induction rows of `short` pieces
  (`drills.induction_rows`: each segment written twice at once), packed as documents of their
  own (positions from 0, attention inside each only; their segment ids come third): the short
  rows that lead a model off the copy plateau (experiments/copy_drills_random/README.md, "Short
  rows first")."""
  if not short:
    pos, copied = drills.far_rows(rng, 1, seq_len, len(pieces), first_id=0)
    return pieces[pos[0]].tolist(), copied[0].astype(np.float32).tolist()
  n = seq_len // short
  pos, copied = drills.induction_rows(rng, n, short, len(pieces), drills.segment_range(short),
                                      first_id=0)
  return (pieces[pos.reshape(-1)].tolist(), copied.reshape(-1).astype(np.float32).tolist(),
          np.repeat(np.arange(1, n + 1), short))


def pad_segments(rows, seq_len: int):
  """Segment ids [B, seq_len] for `pad`'s batch of rows: a row's third item where it has one
  (a packed copy row), else 1 (one document); 0 on padding."""
  segs = np.zeros((len(rows), seq_len), np.int32)
  for r, row in enumerate(rows):
    segs[r, :len(row[0])] = row[2][:len(row[0])] if len(row) == 3 else 1
  return jnp.asarray(segs)


def held_out_nll(model, rows, seq_len: int, batch: int) -> float:
  """Mean NLL a target token over `rows` ((ids, weights) pairs)."""
  total, count = 0.0, 0.0
  for s in range(0, len(rows), batch):
    chunk = rows[s:s + batch]
    toks, wts = pad(chunk + [chunk[-1]] * (batch - len(chunk)), seq_len)
    nll, _ = jax.device_get(score(model, toks))
    w = np.asarray(wts)[:len(chunk), 1:]
    total += float((nll[:len(chunk)] * w).sum())
    count += float(w.sum())
  return total / max(count, 1.0)


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
  model, opt = trainable(start, c, args.lr, args.steps)
  rng = np.random.default_rng(0)
  n_mix = int(round(args.batch * args.mix_share))
  n_copy = int(round(args.batch * args.copy_share))
  if n_mix + n_copy > args.batch:
    raise SystemExit(f"--mix_share {args.mix_share} and --copy_share {args.copy_share} "
                     f"together exceed one batch of {args.batch}")
  os.makedirs(args.out, exist_ok=True)
  log = open(os.path.join(args.out, "log.jsonl"), "w")
  for step in range(args.steps + 1):
    if step % args.every == 0 or step == args.steps:
      rec = {"step": step, "seconds": round(time.time() - t0, 1),
             **{f"held_out_{k}": round(held_out_nll(model, v, args.seq_len, args.batch), 4)
                for k, v in held.items()}}
      print(json.dumps(rec), flush=True)
      log.write(json.dumps(rec) + "\n")
      log.flush()
    if step == args.steps:
      break
    take = ([listing[i] for i in rng.integers(0, len(listing), args.batch - n_mix - n_copy)] +
            [ordinary[i] for i in rng.integers(0, len(ordinary), n_mix)])
    rows = ([render(t, k, tok, cfg) for t, k in take] +
            [copy_row(rng, pieces, args.seq_len, args.copy_short) for _ in range(n_copy)])
    toks, wts = pad([r[:2] for r in rows], args.seq_len)
    # the packed short rows need their segments; other rows are one document each
    segs = pad_segments(rows, args.seq_len) if args.copy_short else None
    loss = train_step(model, opt, toks, wts, segs)
    if step % 10 == 0:
      print(f"step {step} loss {float(loss):.4f} ({time.time() - t0:.0f} s)", flush=True)
  hf_dir = save(model, args.out, start, sp, cfg.thinking)
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
