"""Drill sources (lwm_jax/data/drill_sources.py) as batch sources of the one trainer.

The reference for the rows is the code they replace: tests/fixtures/drill_rows_golden.json
(written by experiments/made_up_names/make_drill_rows_golden.py) holds
the digests of the rows that experiments/made_up_names/listing_drill.py and
experiments/perturb_vs_plain/departure_drill.py built at commit e7b63f9 (their own loops and
render functions, run from a checkout of that commit) for seed 0, on the bundled corpus and
tokenizer: the listing drill's first batches with short and far copy rows, and the departure rows
of two hand-made twins (a turn-1 observation replaced by a disk-full error). The sources must draw
and render the same rows. Then: packing (positions, segments) against hand-computed arrays, the
trainer on a drill mixture with exact resume, and bad settings named.
"""
import dataclasses
import hashlib
import json
import os
import types

import numpy as np
import pytest

from configs import world_model
from lwm_jax.data import drill_sources, drills, schema
from lwm_jax.train import sources, trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "drill_rows_golden.json")
START = os.path.join(ROOT, "data", "world_model")
SP = os.path.join(START, "tokenizer.model")
CORPUS = os.path.join(ROOT, "data", "corpus")
LISTING = os.path.join(CORPUS, "terminal_train.jsonl.gz")


pytestmark = pytest.mark.usefixtures("jax_disk_cache")  # one compile per repeated step


@pytest.fixture(scope="module")
def golden():
  with open(GOLDEN) as f:
    return json.load(f)


def _digest(row):
  ids = np.asarray(row[0], np.int32).tobytes()
  w = np.asarray(row[1], np.float32).tobytes()
  seg = row[2] if len(row) == 3 else None
  return {"n": len(row[0]), "ids": hashlib.sha256(ids).hexdigest()[:16],
          "weights": hashlib.sha256(w).hexdigest()[:16], "weight_sum": float(np.sum(row[1])),
          "segments": (hashlib.sha256(np.asarray(seg, np.int32).tobytes()).hexdigest()[:16]
                       if seg is not None else None)}


def _drill_config(seq_len, batch, copy_short, mix_share, copy_share, **train):
  """The recipe's listing-drill stage (configs/world_model.py) on the bundled data."""
  c = world_model.listing_drill(START, "unused", steps=4, lr=1e-3, copy_short=copy_short,
                                batch=batch, seq_len=seq_len, mix_share=mix_share,
                                copy_share=copy_share).config
  c.data.drills.update(listing=LISTING, mix=CORPUS, thinking="on")
  c.train.update(**train)
  return c


@pytest.mark.parametrize("case", ["short64", "far", "listing_only"])
def test_listing_mix_draws_the_rows_of_the_old_listing_drill(golden, case):
  g = golden["cases"][case]
  c = _drill_config(g["seq_len"], g["batch"], g["copy_short"], g["mix_share"], g["copy_share"])
  src, evals, tok = sources.drill_source(c, types.SimpleNamespace(vocab_size=2048))
  assert evals is None and tok == os.path.abspath(SP)
  ordinary = g["ordinary_turns"] if g["mix_share"] else 0  # not read when no row is drawn
  assert (len(src.listing), len(src.ordinary)) == (g["listing_turns"], ordinary)
  for want in g["batches"]:
    assert [_digest(r) for r in src.next_rows()] == want
  # the rows' kinds: listing turns first (each target an `ls` turn), then ordinary, then copies
  n_copy, n_mix = int(round(g["batch"] * g["copy_share"])), int(round(g["batch"] * g["mix_share"]))
  assert (src.n_copy, src.n_mix) == (n_copy, n_mix)
  assert all(drills.is_listing(src.listing[i][0].turns[src.listing[i][1]].action)
             for i in range(len(src.listing)))


def test_departure_rows_are_the_old_departure_drills(golden):
  cfg = sources.data_config(_drill_config(1024, 4, 0, 0.0, 0.0))
  cfg.thinking = True
  tok = __import__("lwm_jax.data.tokenizer", fromlist=["x"]).load_tokenizer(SP)
  pairs = []
  for t in list(schema.read_jsonl(LISTING))[:2]:
    turns = list(t.turns)
    turns[1] = dataclasses.replace(turns[1],
                                   observation="OSError: [Errno 28] No space left on device")
    a = dataclasses.replace(t, turns=turns,
                            simulation_instruction="The disk is full: every write fails.")
    pairs += [(a, t, k) for k, d in enumerate(drills.departing_turns(a, t)) if d]
  assert [[a.id, k] for a, _, k in pairs] == golden["departures"]["pairs"]
  for arm, rest, v0 in (("paired", 1.0, 0.0), ("paired", 0.0, 0.5), ("plain", 1.0, 0.0)):
    rows = drill_sources.departure_rows(pairs, arm, 5.0, tok, cfg, rest, v0)
    assert [_digest(r) for r in rows] == golden["departures"]["rows"][f"{arm}_rest{rest}_v0{v0}"]
  # weight 5 lands on the departing tokens of the perturbed sample and nowhere else
  ids, w = drill_sources.departure_rows(pairs[:1], "paired", 5.0, tok, cfg, 0.0)[0]
  text = tok.decode([i for i, x in zip(ids, w) if x == 5.0])
  assert "No space left" in text and set(w) <= {0.0, 5.0}


def test_departure_source_passes_over_every_row_each_epoch():
  rows = [([i + 3, i + 4], [0.0, 1.0]) for i in range(5)]
  src = drill_sources.DepartureRows(rows, batch=2, seq_len=4, seed=0)
  seen = [int(t) - 3 for _ in range(5) for t in src.next_batch()["tokens"][:, 0]]
  assert sorted(seen) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # two passes in five batches of two
  state = json.loads(json.dumps(src.get_state()))
  again = drill_sources.DepartureRows(rows, batch=2, seq_len=4, seed=0)
  again.set_state(state)
  np.testing.assert_array_equal(again.next_batch()["tokens"], src.next_batch()["tokens"])


def test_pack_positions_and_segments():
  rows = [([5, 6, 7], [0.0, 1.0, 1.0]),
          ([8, 9, 10, 11], [0.0, 0.0, 1.0, 1.0], np.array([1, 1, 2, 2]))]
  b = drill_sources.pack(rows, 6)
  np.testing.assert_array_equal(b["tokens"], [[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 0, 0]])
  np.testing.assert_array_equal(b["segment_ids"], [[1, 1, 1, 0, 0, 0], [1, 1, 2, 2, 0, 0]])
  np.testing.assert_array_equal(b["positions"], [[0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 0, 1]])
  np.testing.assert_array_equal(b["loss_weights"][1], [0, 0, 1, 1, 0, 0])
  with pytest.raises(ValueError, match="drill row 0: 3 ids and 2 weights"):
    drill_sources.pack([([1, 2, 3], [0.0, 1.0])], 6)


def test_copy_rows_weight_only_what_copying_predicts():
  pieces = np.arange(100, 160, dtype=np.int32)
  ids, w, segs = drills.copy_row(np.random.default_rng(1), pieces, 128, short=32)
  assert len(ids) == 128 and list(segs) == [1] * 32 + [2] * 32 + [3] * 32 + [4] * 32
  ids, w = np.asarray(ids), np.asarray(w)
  for s in range(4):  # every weighted id repeats one written a segment's length before it
    row, wr = ids[32 * s:32 * s + 32], w[32 * s:32 * s + 32]
    for p in np.flatnonzero(wr):
      assert any(p - k >= 0 and row[p - k] == row[p] for k in range(2, 9))
  ids, w, segs = drills.copy_row(np.random.default_rng(1), pieces, 64)
  assert segs is None and not any(w[:32]) and sum(w) > 16  # far row: copies in its 2nd half


def test_bad_drill_settings_are_named():
  c = _drill_config(256, 4, 0, 0.75, 0.5)
  with pytest.raises(ValueError, match="mix_share 0.75 and copy_share 0.5 together exceed"):
    sources.drill_source(c, types.SimpleNamespace(vocab_size=2048))
  c = _drill_config(256, 4, 0, 0.25, 0.0)
  c.data.drills.kind = "lisitng"
  with pytest.raises(ValueError, match="data.drills.kind: 'lisitng'"):
    sources.drill_source(c, types.SimpleNamespace(vocab_size=2048))
  c = _drill_config(256, 4, 0, 0.25, 0.0)
  c.data.drills.listing = "/nonexistent/tours.jsonl.gz"
  with pytest.raises(FileNotFoundError, match="data.drills.listing: /nonexistent"):
    sources.drill_source(c, types.SimpleNamespace(vocab_size=2048))
  c = _drill_config(256, 4, 0, 0.25, 0.0)
  del c.data["drills"]
  with pytest.raises(ValueError, match="config.data.drills"):
    trainer.validate_config(c)


def _tiny_drill(**train):
  """A one-layer model from scratch on a listing / ordinary / copy mixture of rows of 256."""
  c = _drill_config(256, 4, 32, 0.25, 0.25, log_every=1, progress=False, **train)
  c.init_from_hf, c.export_hf = "", False
  c.model.update(num_hidden_layers=1, num_experts=4, vocab_size=2048, hidden_size=64,
                 intermediate_size=128, moe_intermediate_size=64, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32)
  c.train.num_steps = 6
  c.checkpoint.update(every=3, use_async=False)
  c.optim.warmup_steps = 2
  c.train.xent_chunk = 0
  return c


@pytest.mark.slow  # heavy: `make test-slow` (CI runs it after `make test`) keeps `make test` under 8 minutes
def test_trainer_trains_a_drill_mixture_and_resumes_exactly(tmp_path):
  straight = trainer.train(_tiny_drill(), str(tmp_path / "a"))
  first = trainer.train(_tiny_drill(stop_after=3), str(tmp_path / "b"))
  second = trainer.train(_tiny_drill(), str(tmp_path / "b"))
  assert (first["final_step"], second["start_step"], second["final_step"]) == (3, 3, 6)
  np.testing.assert_allclose(first["losses"] + second["losses"], straight["losses"],
                             atol=1e-5, rtol=0)
  assert straight["losses"][-1] < straight["losses"][0]  # it learns
  cfg = json.loads((tmp_path / "a" / "config.json").read_text())
  assert cfg["data"]["source"] == "drills" and cfg["data"]["drills"]["copy_short"] == 32
  rows = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]


def test_induction_source_draws_the_old_copy_drills_rows():
  """launch/copy_drill.py drew `induction_rows(rng, n, row, vocab - 3, segment_range(row))` from
  one default_rng(0) per phase, loss on every token; the induction source draws the same."""
  rng = np.random.default_rng(0)
  src = drill_sources.InductionRows(batch=8, seq_len=64, alphabet=97, seed=0)
  for _ in range(3):
    want, _ = drills.induction_rows(rng, 8, 64, 97, drills.segment_range(64))
    b = src.next_batch()
    np.testing.assert_array_equal(b["tokens"], want)
    assert b["loss_weights"].min() == 1.0 and (b["segment_ids"] == 1).all()
  np.testing.assert_array_equal(b["positions"][0], np.arange(64))


def test_trainable_pattern_freezes_the_rest_and_is_checked():
  from lwm_jax.train import optimizer
  params = {"layers": {"0": {"self_attn": {"q": np.ones((2, 2), np.float32)},
                             "mlp": {"w": np.ones((2, 2), np.float32)}}}}
  assert optimizer.trainable_labels(params, "self_attn") == \
      {"layers": {"0": {"self_attn": {"q": "train"}, "mlp": {"w": "frozen"}}}}
  with pytest.raises(ValueError, match="optim.trainable: 'experts' matches no parameter"):
    optimizer.trainable_labels(params, "experts")


def test_flag_rows_put_the_answer_the_flag_decides():
  """Checked against the drill's definition, row by row: one flag in the first 48 ids, the query
  9 from the end, the flag's answer last, weight on the answer only, the same answers for a
  vocabulary (experiments/perturb_vs_plain/flag_drill.py drew them from default_rng(7))."""
  toks, w = drills.flag_rows(np.random.default_rng(0), 64, 128, 2048)
  want = np.random.default_rng(7).choice(np.arange(16, 2048), 16, replace=False)
  assert set(drills.flag_answers(2048)[drills.FLAG_A]) == set(want[:8])
  for r in range(64):
    flags = [i for i in range(128) if toks[r, i] in (drills.FLAG_A, drills.FLAG_B)]
    assert len(flags) == 1 and flags[0] < 48
    answer = want[:8] if toks[r, flags[0]] == drills.FLAG_A else want[8:]
    np.testing.assert_array_equal(toks[r, -8:], answer)
    assert toks[r, -9] == drills.FLAG_QUERY and toks[r, :-9].min() >= 3
    assert w[r, -8:].tolist() == [1.0] * 8 and w[r, :-8].sum() == 0
  both = {int(toks[r, [i for i in range(48) if toks[r, i] in (3, 4)][0]]) for r in range(64)}
  assert both == {drills.FLAG_A, drills.FLAG_B}
  with pytest.raises(ValueError, match="a flag row needs at least 57 ids"):
    drills.flag_rows(np.random.default_rng(0), 1, 40, 2048)


def test_induction_alphabet_bounds_the_ids():
  c = drill_sources.default_config()
  c.update(kind="induction", alphabet=5)
  src = drill_sources.make_source(c, types.SimpleNamespace(seq_len=64), None, "", batch=4,
                                  vocab_size=100)
  b = src.next_batch()
  assert set(np.unique(b["tokens"])) <= set(range(3, 8))
  c.alphabet = 98
  with pytest.raises(ValueError, match="data.drills.alphabet: 98 ids"):
    drill_sources.make_source(c, types.SimpleNamespace(seq_len=64), None, "", batch=4,
                              vocab_size=100)


@pytest.mark.slow  # heavy (over 10 s): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_scored_run_scores_each_checkpoint_of_the_trainer(tmp_path):
  """The flag drill trained by the one trainer, scored at its checkpoints: a record per saved
  step with that step's training loss, and the last record's score is the exported model's."""
  from lwm_jax import hf
  from lwm_jax.eval import row_nll
  from lwm_jax.train import scored_run
  c = _tiny_drill()
  c.data.drills = drill_sources.default_config()
  c.data.drills.kind = "flag"
  c.data.tokenizer = ""
  c.train.seq_len = 64
  c.export_hf = True
  test, w = drills.flag_rows(np.random.default_rng(5), 8, 64, 2048)
  rows = [(t.tolist(), x.tolist()) for t, x in zip(test, w)]
  score = lambda m: {"answer_nll": row_nll.weighted_nll(m, rows, 64, 8)}
  logged = []
  summary = scored_run.train_and_score(c, str(tmp_path / "run"), score, logged.append,
                                       extra={"phase": 0})
  assert [r["step"] for r in logged] == [3, 6] and summary["scores"] == logged
  assert [r["train_loss"] for r in logged] == [round(summary["losses"][i], 4) for i in (2, 5)]
  assert all(r["phase"] == 0 and np.isfinite(r["answer_nll"]) for r in logged)
  exported = hf.load_pretrained(summary["export_hf"], dtype="float32")
  np.testing.assert_allclose(score(exported)["answer_nll"], logged[-1]["answer_nll"], rtol=1e-5)
  assert logged[0]["answer_nll"] != logged[1]["answer_nll"]
