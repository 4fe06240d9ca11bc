"""Concentrated-signal test of instruction following: train only on the turns where a perturbed
episode departs from its plain twin, with the loss weighted onto the departing tokens.

Every earlier run of issue 16 found a world model that ignores the simulation instruction: in
ordinary SFT the few tokens that depend on the instruction (an error where a result would be, the
"2" of "Results 1-2", the missing "email" field) are a sliver of the loss. Here the data are the
pairs of the perturb experiment's `paired` run: the same episode (same world, seed and actions)
recorded under a perturbation and without one. For each turn where the observations differ while
the actions so far agree (a departure), two SFT samples are rendered as the SFT pipeline renders
them: the perturbed one (instruction in the system prompt) and its plain twin (no instruction).
Target tokens outside the token-level diff of the two observations get weight 1, the departing
ones weight K; the model cannot lower the departing tokens' loss on both samples without reading
the instruction.

Arms, same start, rows, steps and schedule:
  paired  the perturbed sample and its twin of each departure (weights 1 / K, as above)
  plain   the twin of each departure and the twin's next (or previous) turn, weight 1 everywhere:
          the same episodes and compute, never a perturbed observation

Every EVERY steps (and at step 0), on held-out departures (the validation splits' pairs), with the
instruction in the system prompt and with it removed: the mean NLL of the departing tokens of the
real perturbed observation (gain = without - with; a model that reads it has gain > 0), the NLL
of the first departing token (the decision) and the share where that token is the argmax. At the
end the model is written as a Hugging Face folder for `evals/fidelity.py`.

  python experiments/perturb_vs_plain/departure_drill.py --arm=paired --steps=1200 \
      --every=100 --held_out=160 --out=runs/departure_paired_1200
  python experiments/perturb_vs_plain/departure_drill.py --arm=paired --eval_only \
      --held_out=400 --start=runs/departure_paired_1200/hf

`--rest_weight=0` puts the whole loss on the departing tokens; on a single perturbation
(`--domains=mcp` with copies made under `--menu='mcp=page_size:size=3'`) that taught the model to
read the instruction, where the menu's 15 behaviours together did not. `--v0_share=0.5` renders
half the episodes in the evaluation template (variant 0, what generation prompts with) instead
of the SFT ones; the held-out scores are given under both (`eval_template`: variant 0).

(how the twin copies are made, the results and the reading:
experiments/perturb_vs_plain/departure_drill/README.md)
"""
import argparse
import dataclasses
import json
import os
import sys
import time
from typing import NamedTuple

import jax

from configs import stages
from lwm_jax import hf
from lwm_jax.checkpoints import read_provenance, recorded_thinking
from lwm_jax.data import corpus as corpus_lib
from lwm_jax.data import drill_sources, drills
from lwm_jax.data.schema import Trajectory
from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.eval import row_nll
from lwm_jax.train import scored_run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOMAINS = ("mcp", "search", "web")


def departures(copies: str, split: str, domains=DOMAINS
               ) -> list[tuple[Trajectory, Trajectory, int]]:
  """(perturbed episode, its plain twin, turn) for every departure of a copies folder
  (`drill_sources.departure_pairs`); a missing copy stops the script naming it."""
  try:
    out = drill_sources.departure_pairs(copies, split, domains)
  except FileNotFoundError as e:
    raise SystemExit(f"{e}: make both copies first (see --copies)") from None
  print(f"{copies} {split}: {len(out)} departures", flush=True)
  return out


# the rows are the library's (the trainer's `data.drills.kind = "departures"` draws the same)
template_of = drill_sources.template_of
render = drill_sources.sft_row
departing = drills.departing
rows_of = drill_sources.departure_rows


class HeldOut(NamedTuple):
  with_ids: list[int]  # the perturbed sample, instruction in the system prompt
  without_ids: list[int]  # the same with the instruction removed
  back: list[int]  # departing positions, counted from the end (the target is both samples' tail)
  turn: int
  kind: str  # the first entry of the episode's menu perturbation, e.g. errors or page_size


def held_out(pairs, tok, cfg, limit: int, variant: int | None = None) -> list[HeldOut]:
  """Per held-out departure: the perturbed sample with and without the instruction and the
  departing positions counted from the end (the target is the sample's tail in both), in
  template `variant` (None: the SFT pipeline's choice per episode)."""
  out = []
  for a, b, k in pairs[:limit]:
    ids_a, w_a = render(a, k, tok, cfg, variant)
    ids_b, w_b = render(b, k, tok, cfg, variant)
    da, _ = departing(ids_a, w_a, ids_b, w_b)
    if not da:
      continue
    bare = dataclasses.replace(a, simulation_instruction="")
    ids_o, _ = render(bare, k, tok, cfg, variant)
    kind = str(a.meta.get("perturb", "")).split(":")[0]
    out.append(HeldOut(ids_a, ids_o, [len(ids_a) - i for i in da], k, kind))
  return out


pad, token_nll, score = row_nll.pad, row_nll.token_nll, row_nll.score


def evaluate(model, items, seq_len: int, batch: int) -> dict:
  """Over all held-out departures, apart over those of an episode's first turn (its observation
  starts some 130-220 tokens after the instruction) and of later turns, and per kind of
  perturbation (the first of an episode's menu entry, e.g. errors or page_size): the mean NLL
  of the departing tokens with / without the instruction; of the first departing token (where the
  observation turns away from its twin) its NLL and argmax hits."""
  per = {"with": [], "without": []}  # per item: (NLL sum, tokens, first-token NLL, first hit)
  for s in range(0, len(items), batch):
    chunk = items[s:s + batch]
    for key in per:
      seqs = [it.with_ids if key == "with" else it.without_ids for it in chunk]
      rows = [(ids, [0.0] * len(ids)) for ids in seqs]
      rows += [rows[-1]] * (batch - len(rows))
      toks, _ = pad(rows, seq_len)
      nll, hit = jax.device_get(score(model, toks))
      for r, (it, ids) in enumerate(zip(chunk, seqs)):
        pos = [len(ids) - back - 1 for back in it.back]  # the logit at i-1 predicts token i
        per[key].append((float(nll[r, pos].sum()), len(pos), float(nll[r, min(pos)]),
                         int(hit[r, min(pos)])))

  def summary(idx: list[int]) -> dict:
    res = {}
    for key, vals in per.items():
      v = [vals[i] for i in idx]
      n = max(len(v), 1)
      res[key] = {"nll": sum(x[0] for x in v) / max(sum(x[1] for x in v), 1),
                  "first_token_nll": sum(x[2] for x in v) / n,
                  "first_token_hits": sum(x[3] for x in v) / n}
    res["gain"] = res["without"]["nll"] - res["with"]["nll"]
    res["first_token_gain"] = res["without"]["first_token_nll"] - res["with"]["first_token_nll"]
    return res

  out = summary(list(range(len(items))))
  for name, keep in (("first_turn", lambda it: it.turn == 0),
                     ("later_turns", lambda it: it.turn > 0)):
    idx = [i for i, it in enumerate(items) if keep(it)]
    if idx:
      out[name] = {"n": len(idx), **summary(idx)}
  out["by_kind"] = {}
  for kind in sorted({it.kind for it in items}):
    idx = [i for i, it in enumerate(items) if it.kind == kind]
    out["by_kind"][kind] = {"n": len(idx), **summary(idx)}
  return out


def drill_config(args, start: str, sp: str):
  """The trainer's config of the drill: the SFT demo config (its optimizer: AdamW, warm-up,
  cosine decay over --steps) at peak --lr, from --start, on the departure rows of --copies
  (`data.drills.kind = "departures"`, the rows this script drew itself before 2026-12-07, the
  same seed giving the same rows), a checkpoint every --every steps for the held-out scores."""
  c = stages.STAGE_CONFIGS["sft"].get_config("demo")
  c.seed = 0
  c.train.update(num_steps=args.steps, batch_size=args.batch, seq_len=args.seq_len,
                 log_every=10, eval_every=0, progress=False)
  c.optim.lr = args.lr
  c.checkpoint.update(every=args.every, keep=args.steps // args.every + 2, use_async=False)
  c.data.source = "drills"
  c.data.tokenizer = sp
  c.data.drills = drill_sources.default_config()
  c.data.drills.update(kind="departures", copies=args.copies, domains=args.domains,
                       arm=args.arm, weight=args.weight, rest_weight=args.rest_weight,
                       v0_share=args.v0_share)
  c.init_from_hf = start
  c.export_hf = True
  c.export_hf_dir = os.path.join(args.out, "hf")
  return c


def write_provenance(hf_dir: str, start: str, thinking: bool) -> None:
  """provenance.json of the trained model: the command, the start's reply mode (where
  evals/fidelity.py --thinking=auto and these scripts look for it) and the start's own
  provenance.json where it has one (a chain of runs stays traceable to its first model)."""
  prov = {"made_by": " ".join(["python"] + sys.argv), "start": start,
          "settings": {"thinking": "on" if thinking else "off"}}
  earlier = read_provenance(start)
  if earlier is not None:
    prov["start_provenance"] = earlier
  with open(os.path.join(hf_dir, "provenance.json"), "w") as f:
    json.dump(prov, f, indent=1)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--arm", choices=("paired", "plain"), required=True)
  ap.add_argument("--start", default=os.path.join(ROOT, "data", "world_model"))
  ap.add_argument("--copies", default=os.path.join(ROOT, "runs", "departure_copies"),
                  help="a folder with corpus_perturbed/ and corpus_plain/: the same episodes "
                  "with and without perturbations (tools/make_corpus.py, same seed, "
                  "--perturb_share=0.5 and 0; or a launch/perturb_experiment.py workdir); several "
                  "folders separated by commas are drilled together, the held-out departures "
                  "drawn evenly from each (a folder named twice weighs twice in training)")
  ap.add_argument("--domains", default=",".join(DOMAINS), help="the copies' domains to use")
  ap.add_argument("--out", help="folder for the trained model and its logs (not with --eval_only)")
  ap.add_argument("--steps", type=int, default=460)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq_len", type=int, default=2048)
  ap.add_argument("--lr", type=float, default=1e-3)
  ap.add_argument("--weight", type=float, default=5.0, help="loss weight of a departing token")
  ap.add_argument("--rest_weight", type=float, default=1.0, help="paired arm: loss weight "
                  "of the target tokens outside the departure (0: only the departing tokens)")
  ap.add_argument("--v0_share", type=float, default=0.0, help="share of the training episodes "
                  "rendered in the evaluation template (variant 0) instead of the SFT ones (2-11)")
  ap.add_argument("--every", type=int, default=50)
  ap.add_argument("--held_out", type=int, default=64, help="held-out departures scored")
  ap.add_argument("--eval_only", action="store_true", help="score --start on the held-out "
                  "departures, print it and stop (no training, nothing written)")
  args = ap.parse_args()
  if not args.eval_only and not args.out:
    ap.error("--out is required unless --eval_only")
  t0 = time.time()
  domains = args.domains.split(",")
  start, sp, _, _ = corpus_lib.given_start(args.start)
  tok = load_tokenizer(sp)
  c = stages.STAGE_CONFIGS["sft"].get_config("demo")
  cfg = c.data.pipeline
  cfg.seq_len, cfg.thinking = args.seq_len, recorded_thinking(start)
  folders = args.copies.split(",")
  per = -(-args.held_out // len(set(folders)))  # the held-out departures, evenly from each folder
  valid = [x for f in dict.fromkeys(folders) for x in departures(f, "validation", domains)[:per]]
  items = held_out(valid, tok, cfg, args.held_out)
  items_v0 = held_out(valid, tok, cfg, args.held_out, variant=0)

  def scores(model) -> dict:  # under the SFT templates, and under the evaluation template
    return {**evaluate(model, items, args.seq_len, args.batch),
            "eval_template": evaluate(model, items_v0, args.seq_len, args.batch)}

  if args.eval_only:
    print(json.dumps(scores(hf.load_pretrained(start, dtype="float32"))))
    return
  train = [x for f in folders for x in departures(f, "train", domains)]
  print(f"{len(train)} training departures; {len(items)} held out ({time.time() - t0:.0f} s)",
        flush=True)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "log.jsonl"), "w") as log_file:
    def log(rec):
      print(json.dumps(rec), flush=True)
      log_file.write(json.dumps(rec) + "\n")
      log_file.flush()
    log({"step": 0, "seconds": round(time.time() - t0, 1),
         **scores(hf.load_pretrained(start, dtype="float32"))})
    summary = scored_run.train_and_score(drill_config(args, start, sp),
                                         os.path.join(args.out, "run"), scores, log)
  write_provenance(summary["export_hf"], start, cfg.thinking)
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump({"command": " ".join(["python"] + sys.argv), "train_departures": len(train),
               "held_out": len(items), "seconds": round(time.time() - t0, 1),
               "final_loss": summary["losses"][-1] if summary["losses"] else None,
               "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
  main()
