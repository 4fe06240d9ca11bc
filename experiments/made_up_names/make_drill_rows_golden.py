"""Writes tests/fixtures/drill_rows_golden.json from the OLD drill code (commit e7b63f9), the
reference tests/test_drill_sources.py checks the drill sources against (it imports the old
scripts of that checkout by path: the one reason for its sys.path edit). Not run by the tests:

  git archive e7b63f9 | tar -x -C /tmp/old65
  python experiments/made_up_names/make_drill_rows_golden.py /tmp/old65 tests/fixtures/drill_rows_golden.json
"""
import dataclasses, hashlib, json, os, sys
import numpy as np
OLD = sys.argv[1]; OUT = sys.argv[2]
sys.path.insert(0, os.path.join(OLD, "experiments", "made_up_names"))
os.chdir(OLD)
import listing_drill as L  # adds OLD, OLD/launch and perturb_vs_plain to sys.path
import departure_drill as D
import lwm_jax
assert lwm_jax.__file__.startswith(OLD)
from lwm_jax.data import schema
from lwm_jax.data.tokenizer import load_tokenizer

def digest(row):
  ids = np.asarray(row[0], np.int32).tobytes()
  w = np.asarray(row[1], np.float32).tobytes()
  seg = b"" if len(row) < 3 else np.asarray(row[2], np.int32).tobytes()
  return {"n": len(row[0]), "ids": hashlib.sha256(ids).hexdigest()[:16],
          "weights": hashlib.sha256(w).hexdigest()[:16], "weight_sum": float(np.sum(row[1])),
          "segments": hashlib.sha256(seg).hexdigest()[:16] if seg else None}

sp = os.path.join(OLD, "data", "world_model", "tokenizer.model")
tok = load_tokenizer(sp)
listing_file = os.path.join(OLD, "data", "corpus", "terminal_train.jsonl.gz")
out = {"commit": "e7b63f9", "tokenizer": "data/world_model/tokenizer.model",
       "listing": "data/corpus/terminal_train.jsonl.gz", "mix": "data/corpus", "cases": {}}
for name, seq_len, short, mix_share, copy_share, batch, steps in (
    ("short64", 1024, 64, 0.25, 0.5, 8, 2), ("far", 512, 0, 0.25, 0.25, 4, 2),
    ("listing_only", 512, 0, 0.0, 0.0, 4, 1)):
  c = L.stages.STAGE_CONFIGS["sft"].get_config("demo")
  cfg = c.data.pipeline
  cfg.seq_len, cfg.thinking = seq_len, True
  listing = L.listing_turns([listing_file], 12)
  corpus = L.stages.load_corpus(os.path.join(OLD, "data", "corpus"))
  ordinary = [(t, k) for t in corpus.train for k in range(len(t.turns))]
  pieces = L.word_pieces(sp)
  rng = np.random.default_rng(0)
  n_mix = int(round(batch * mix_share)); n_copy = int(round(batch * copy_share))
  batches = []
  for step in range(steps):  # the old main loop's draw, verbatim
    take = ([listing[i] for i in rng.integers(0, len(listing), batch - n_mix - n_copy)] +
            [ordinary[i] for i in rng.integers(0, len(ordinary), n_mix)])
    rows = ([L.render(t, k, tok, cfg) for t, k in take] +
            [L.copy_row(rng, pieces, seq_len, short) for _ in range(n_copy)])
    batches.append([digest(r) for r in rows])
  out["cases"][name] = {"seq_len": seq_len, "copy_short": short, "mix_share": mix_share,
                        "copy_share": copy_share, "batch": batch, "listing_turns": len(listing),
                        "ordinary_turns": len(ordinary), "batches": batches}

# departure rows of hand-made twins: two terminal episodes whose turn 1 observation a
# perturbation changed (the instruction in the system prompt)
trajs = list(schema.read_jsonl(os.path.join(OLD, "data", "corpus", "terminal_train.jsonl.gz")))[:2]
pairs = []
for t in trajs:
  turns = list(t.turns)
  turns[1] = dataclasses.replace(turns[1], observation="OSError: [Errno 28] No space left on device")
  a = dataclasses.replace(t, turns=turns, simulation_instruction="The disk is full: every write fails.")
  k = [i for i, d in enumerate(D.fidelity.departing_turns(a, t)) if d]
  pairs += [(a, t, i) for i in k]
c = L.stages.STAGE_CONFIGS["sft"].get_config("demo")
cfg = c.data.pipeline
cfg.seq_len, cfg.thinking = 1024, True
dep = {}
for arm, rest, v0 in (("paired", 1.0, 0.0), ("paired", 0.0, 0.5), ("plain", 1.0, 0.0)):
  rows = D.rows_of(pairs, arm, 5.0, tok, cfg, rest, v0)
  dep[f"{arm}_rest{rest}_v0{v0}"] = [digest(r) for r in rows]
out["departures"] = {"pairs": [[a.id, k] for a, _, k in pairs], "rows": dep}
json.dump(out, open(OUT, "w"), indent=1)
print("ok", {k: len(v["batches"]) for k, v in out["cases"].items()}, len(pairs))
