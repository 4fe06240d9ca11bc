"""The copy drill as CPT samples mixed into the trajectories (data config `drill_share` /
`drill_rows`, `launch/reproduce.py --config.drill_share`): the samples, their share of the tokens, the
packed rows' segments, resuming, and the errors."""
import json

import numpy as np
import pytest

from lwm_jax.data import drills, pipeline
from lwm_jax.envs import knowledge
from lwm_jax.data import tokenizer as tk
from tests.test_reproduce_knowledge import _cfg, tok, trajs  # noqa: F401  (fixtures)


def _second_copies_repeat(ids: np.ndarray, seg: tuple[int, int]) -> bool:
  """True when `ids` can be cut into segments of seg[0]..seg[1] ids each followed by itself (the
  last one cut at the end), found by a search independent of how the drill builds them."""
  n = len(ids)

  def ok(i):
    if i == n:
      return True
    for k in range(seg[0], seg[1] + 1):
      end = min(i + 2 * k, n)
      if i + k <= n and np.array_equal(ids[i + k:end], ids[i:i + end - i - k]) and ok(end):
        return True
    return False
  return ok(0)


def test_sample_is_a_marker_then_an_induction_row():
  alphabet = drills.drill_alphabet(300, [3, 4, 299])
  assert 3 not in alphabet and 299 not in alphabet and alphabet.min() == 5 and len(alphabet) == 294
  s = drills.induction_sample(7, (64,), alphabet, marker=1, seed=2)
  assert s["tokens"][0] == 1 and len(s["tokens"]) == 65
  assert s["loss_weights"].tolist() == [0.0] + [1.0] * 64
  assert np.isin(s["tokens"][1:], alphabet).all()
  assert _second_copies_repeat(s["tokens"][1:], drills.segment_range(64))
  assert int(s["n_drill"][0]) == 65 and int(s["n_drill"][1:].sum()) == 0
  # deterministic per (index, seed), different across indices and seeds
  again = drills.induction_sample(7, (64,), alphabet, marker=1, seed=2)
  assert np.array_equal(s["tokens"], again["tokens"])
  assert not np.array_equal(s["tokens"], drills.induction_sample(8, (64,), alphabet, 1, 2)["tokens"])
  assert not np.array_equal(s["tokens"], drills.induction_sample(7, (64,), alphabet, 1, 3)["tokens"])


def test_each_row_length_gets_the_same_share_of_tokens():
  alphabet = drills.drill_alphabet(100, [])
  lengths = [len(drills.induction_sample(i, (16, 128), alphabet, 0)["tokens"]) - 1
             for i in range(900)]
  short, long_ = lengths.count(16) * 16, lengths.count(128) * 128
  assert set(lengths) == {16, 128} and abs(short - long_) / (short + long_) < 0.15


def test_far_row_copies_its_first_half_in_another_order():
  toks, copied = drills.far_rows(np.random.default_rng(5), 3, 301, alphabet=40, segment=(4, 32))
  dists = []
  for row, mask in zip(toks, copied):
    half = row[:150]
    # the second half (but its last, odd id) is the first half's ids again, reordered
    assert sorted(row[150:300].tolist()) == sorted(half.tolist())
    assert not np.array_equal(row[150:300], half)
    # every id marked as copied continues an adjacent pair of the first half (found by search)
    pairs = set(zip(half[:-1].tolist(), half[1:].tolist()))
    marked = np.flatnonzero(mask)
    assert marked.min() > 150 and len(marked) > 100
    assert all((int(row[i - 1]), int(row[i])) in pairs for i in marked)
    # the sources lie near and far: the nearest earlier occurrence of each copied pair
    dists += [i - max(j for j in range(1, 150) if (row[j - 1], row[j]) == (row[i - 1], row[i]))
              for i in marked]
  assert min(dists) < 60 and max(dists) > 240


def test_far_rows_in_the_drill_stream():
  rows = drills.parse_drill_rows(" 64, far256 ")
  assert rows == (drills.DrillRow(64), drills.DrillRow(256, far=True))
  assert ",".join(map(str, rows)) == "64,far256"
  alphabet = drills.drill_alphabet(100, [])
  samples = [drills.induction_sample(i, rows, alphabet, marker=1) for i in range(40)]
  far = [s["tokens"][1:] for s in samples if len(s["tokens"]) == 257]
  assert far and len(far) < 40
  for ids in far:
    assert sorted(ids[:128].tolist()) == sorted(ids[128:].tolist())


@pytest.mark.parametrize("bad", ["", "64,a", "4", "64,9000", "far", "farx", "far4", "far9000"])
def test_bad_rows_are_named(bad):
  with pytest.raises(ValueError, match="drill_rows"):
    drills.parse_drill_rows(bad)


def test_drill_share_of_the_packed_tokens(tok, trajs):  # noqa: F811
  share = 0.4
  c = _cfg(drill_share=share, drill_rows="16,32")
  specials = set(tok.special_tokens.values())
  it = pipeline.make_train_iterator(c, tok, "cpt", source=trajs)
  batches = list(it)
  plain = list(pipeline.make_train_iterator(_cfg(), tok, "cpt", source=trajs))
  total = sum(int(np.sum(b["segment_ids"] > 0)) for b in batches)
  plain_total = sum(int(np.sum(b["segment_ids"] > 0)) for b in plain)
  # every trajectory token is still there, and the drill holds its share of all tokens (within a
  # sample: 33 tokens at most)
  assert total - it.stats["drill_tokens"] == plain_total
  assert abs(it.stats["drill_tokens"] - share * total) <= 33
  # in the packed rows, each drill sample is its own segment starting at position 0, its first
  # id (the marker) out of the loss, then ids that are not special tokens
  marker, found = tok.special_tokens[tk.ENDOFTEXT], 0
  for b in batches:
    for r in range(b["tokens"].shape[0]):
      for seg in np.unique(b["segment_ids"][r]):
        idx = np.nonzero(b["segment_ids"][r] == seg)[0]
        ids = b["tokens"][r, idx]
        if seg == 0 or len(idx) not in (17, 33) or any(int(t) in specials for t in ids[1:]):
          continue
        found += len(idx)
        assert ids[0] == marker
        assert b["positions"][r, idx].tolist() == list(range(len(idx)))
        assert b["loss_weights"][r, idx[0]] == 0 and np.all(b["loss_weights"][r, idx[1:]] == 1)
  assert found == it.stats["drill_tokens"]


def test_drill_mix_resumes_exactly(tok, trajs):  # noqa: F811
  c = _cfg(drill_share=0.5, drill_rows="16")
  it = pipeline.make_train_iterator(c, tok, "cpt", source=trajs)
  for _ in range(3):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  rest = [b["tokens"] for b in it]
  again = pipeline.make_train_iterator(c, tok, "cpt", source=trajs)
  again.set_state(state)
  assert all(np.array_equal(a, b["tokens"]) for a, b in zip(rest, again, strict=True))


def test_bad_drill_config_is_named(tok, trajs):  # noqa: F811
  with pytest.raises(ValueError, match="'drill_share' must be in"):
    pipeline.make_train_iterator(_cfg(drill_share=1.0), tok, "cpt", source=trajs)
  with pytest.raises(ValueError, match="'drill_share' is for the cpt stage only"):
    pipeline.make_train_iterator(_cfg(drill_share=0.2), tok, "sft", source=trajs)
  with pytest.raises(ValueError, match="drill_rows"):
    pipeline.make_train_iterator(_cfg(drill_share=0.2, drill_rows="3"), tok, "cpt", source=trajs)
  with pytest.raises(ValueError, match="does not fit a packed row of seq_len 256"):
    pipeline.make_train_iterator(_cfg(drill_share=0.2, drill_rows="64,256"), tok, "cpt",
                                 source=trajs)


def test_lookup_drills_answer_from_their_paths():
  docs = drills.lookup_drills(60, seed=3)
  assert [d.text for d in docs] == [d.text for d in drills.lookup_drills(60, seed=3)]
  assert docs[0].text != drills.lookup_drills(1, seed=4)[0].text
  kinds = set()
  for d in docs:
    head, *queries = d.text.split("\n\n$ ")
    assert head.startswith("Files under ~:\n") and queries
    paths = head.split("\n")[1:]
    under = {}  # directory -> names, read back from the paths alone
    for p in paths:
      parent, _, name = p.rpartition("/")
      under.setdefault(parent, []).append(name)
    top = sorted(under.get("", []) + [k for k in under if k])
    for q in "\n\n$ ".join(queries).split("\n\n$ "):
      cmd, _, answer = q.partition("\n")
      kinds.add(cmd.split(" ")[-1] if cmd != "ls" else "ls")
      if cmd == "ls":
        assert answer.split("  ") == top
      elif cmd == "ls -R":
        blocks = answer.split("\n\n")
        assert blocks[0] == ".:\n" + "  ".join(top)
        assert blocks[1:] == [f"./{k}:\n" + "  ".join(sorted(under[k])) for k in sorted(under) if k]
      else:
        assert cmd.startswith("ls ") and answer.split("  ") == sorted(under[cmd[3:]])
  assert {"ls", "-R"} <= kinds and len(kinds) > 10
  # the knowledge source 'lookup' is these drills (seed 0)
  docs = knowledge.knowledge_documents(sources=("lookup",))
  assert len(docs) == knowledge.LOOKUP_DRILLS and docs[1].text == drills.lookup_drills(2)[1].text
