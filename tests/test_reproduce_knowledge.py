"""Plain-document CPT source (knowledge text): full-loss weights, windows, file errors, and its
token share when mixed into the CPT stream, resumed exactly."""
import json
import os

import numpy as np
import pytest

from lwm_jax.data import documents, pipeline, prompts, schema
from lwm_jax.data import tokenizer as tk

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "data")
JSONL = os.path.join(FIX, "trajectories.jsonl")
TEXT = ("The bisect module keeps a list in sorted order without sorting it again after each "
        "insertion. insort(a, x) inserts x in a, keeping it sorted.")


@pytest.fixture(scope="module")
def trajs():
  return list(schema.read_jsonl(JSONL))


@pytest.fixture(scope="module")
def tok(trajs, tmp_path_factory):
  texts = [TEXT]
  for t in trajs:
    texts += [x.action for x in t.turns] + [x.observation for x in t.turns]
    texts.append(prompts.system_prompt(t, 1))
  return tk.load_tokenizer(tk.train_sentencepiece(texts, 500, tmp_path_factory.mktemp("sp") / "s"))


def _write(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
  return str(path)


def test_document_is_full_loss_after_its_marker(tok):
  doc = documents.Document("d1", TEXT, "bisect")
  (s,) = documents.document_samples(doc, tok, 4096)
  end = tok.special_tokens[tk.ENDOFTEXT]
  body = tok.encode("bisect\n\n" + TEXT)
  # hand-built expectation: marker, the text's tokens, marker; weight 0 only on the first marker
  assert s["tokens"].tolist() == [end] + body + [end]
  assert s["loss_weights"].tolist() == [0.0] + [1.0] * (len(body) + 1)
  assert int(s["n_knowledge"][0]) == len(body) + 2 and int(s["n_split"].sum()) == 0


def test_long_document_is_windowed_without_loss(tok):
  doc = documents.Document("d1", TEXT * 4)
  body = tok.encode(TEXT * 4) + [tok.special_tokens[tk.ENDOFTEXT]]
  samples = documents.document_samples(doc, tok, 16)
  assert all(len(s["tokens"]) <= 16 for s in samples)
  assert len(samples) == -(-len(body) // 15)
  # every window opens with the marker at weight 0; the rest rebuild the document exactly
  rebuilt = [t for s in samples for t in s["tokens"][1:].tolist()]
  assert rebuilt == body
  assert all(s["loss_weights"][0] == 0 and np.all(s["loss_weights"][1:] == 1) for s in samples)
  assert sum(int(s["n_split"][0]) for s in samples) == len(samples) - 1


def test_read_documents_errors_name_file_and_line(tmp_path):
  good = _write(tmp_path / "a.jsonl", [{"id": "x", "text": "hello"}, {"id": "e", "text": "  "}])
  stats = documents.DocumentStats()
  docs = documents.read_documents(good, stats)
  assert [d.id for d in docs] == ["x"] and stats.empty_skipped == 1 and stats.documents == 1
  bad = _write(tmp_path / "b.jsonl", [{"id": "x", "text": "a"}, "{not json"])
  with pytest.raises(ValueError, match=r"b\.jsonl:2: not valid JSON"):
    documents.read_documents(bad)
  missing = _write(tmp_path / "c.jsonl", [{"id": "x"}])
  with pytest.raises(ValueError, match=r"c\.jsonl:1: field 'text' must be a string"):
    documents.read_documents(missing)
  dup = _write(tmp_path / "d.jsonl", [{"id": "x", "text": "a"}, {"id": "x", "text": "b"}])
  with pytest.raises(ValueError, match=r"d\.jsonl:2: duplicate document id 'x'"):
    documents.read_documents(dup)
  (tmp_path / "notes.md").write_text("# Notes\nplain text")
  assert documents.read_documents(str(tmp_path / "notes.md"))[0].id == "notes"


def test_write_then_read_round_trip(tmp_path):
  docs = [documents.Document("a", "one", "T"), documents.Document("b", "two")]
  path = str(tmp_path / "k.jsonl.gz")
  assert documents.write_documents(docs, path) == 2
  assert documents.read_documents(path) == docs


def _cfg(**kw):
  c = pipeline.default_data_config()
  c.update(dict(jsonl=JSONL, seq_len=256, batch_size=2, num_epochs=2, num_packing_bins=2,
                seed=3, hygiene=False))
  c.update(kw)
  return c


def _knowledge_file(tmp_path):
  rows = [{"id": f"k{i}", "title": f"page {i}", "text": TEXT * (1 + i % 3)} for i in range(12)]
  return _write(tmp_path / "k.jsonl", rows)


def test_mix_share_of_tokens(tok, tmp_path, trajs):
  share = 0.3
  c = _cfg(knowledge_jsonl=_knowledge_file(tmp_path), knowledge_share=share)
  samples = list(pipeline.sample_dataset(trajs, tok, c, "cpt"))
  know = [s for s in samples if s["n_knowledge"][0] > 0]
  rest = [s for s in samples if s["n_knowledge"][0] == 0]
  k_tok = sum(len(s["tokens"]) for s in know)
  total = k_tok + sum(len(s["tokens"]) for s in rest)
  # the trajectory stream is untouched: the same samples in the same order as without knowledge
  plain = list(pipeline.sample_dataset(trajs, tok, _cfg(), "cpt"))
  assert len(rest) == len(plain)
  assert all(np.array_equal(a["tokens"], b["tokens"]) for a, b in zip(rest, plain))
  # the knowledge share is within one sample of the target
  longest = max(len(s["tokens"]) for s in samples)
  assert abs(k_tok - share * total) <= longest
  # knowledge samples are full loss after their marker; trajectory samples keep their masking
  assert all(np.all(s["loss_weights"][1:] == 1) for s in know)
  # the packed iterator counts the knowledge tokens it delivers
  it = pipeline.make_train_iterator(c, tok, "cpt", source=trajs)
  batches = list(it)
  assert it.stats["knowledge_tokens"] == k_tok
  assert sum(int(np.sum(b["segment_ids"] > 0)) for b in batches) == total


def test_mix_resumes_exactly(tok, tmp_path, trajs):
  c = _cfg(knowledge_jsonl=_knowledge_file(tmp_path), knowledge_share=0.5, num_epochs=2)
  it = pipeline.make_train_iterator(c, tok, "cpt", source=trajs)
  for _ in range(3):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  want = [next(it)["tokens"] for _ in range(3)]
  again = pipeline.make_train_iterator(c, tok, "cpt", source=trajs)
  again.set_state(state)
  got = [next(again)["tokens"] for _ in range(3)]
  assert all(np.array_equal(a, b) for a, b in zip(want, got))


def test_mix_config_errors(tok, tmp_path, trajs):
  k = _knowledge_file(tmp_path)
  with pytest.raises(ValueError, match="knowledge_share' must be in"):
    pipeline.make_train_iterator(_cfg(knowledge_jsonl=k, knowledge_share=1.0), tok, "cpt",
                                 source=trajs)
  with pytest.raises(ValueError, match="go together"):
    pipeline.make_train_iterator(_cfg(knowledge_share=0.2), tok, "cpt", source=trajs)
  with pytest.raises(ValueError, match="cpt stage only"):
    pipeline.make_train_iterator(_cfg(knowledge_jsonl=k, knowledge_share=0.2), tok, "sft",
                                 source=trajs)


def test_action_space_documents():
  from lwm_jax.envs import knowledge
  docs = {d.id: d for d in knowledge.action_spaces()}
  assert "action_space/search" in docs and "action_space/terminal" in docs
  assert "search(query=" in docs["action_space/search"].text
  assert "{limit}" not in docs["action_space/terminal"].text


def test_copy_drills_repeat_their_listing_and_are_seeded():
  from lwm_jax.data.drills import copy_drills
  from lwm_jax.envs import knowledge
  drills = copy_drills(50, seed=4)
  assert drills == copy_drills(50, seed=4) and drills != copy_drills(50, seed=5)
  for d in drills:
    first, second = d.text.split("\n\n")  # a listing never holds a blank line
    assert first == second and first.strip()
  # made-up names: no two listings alike
  listings = [d.text.split("\n\n")[0] for d in drills]
  assert len(set(listings)) == len(listings)
  with pytest.raises(ValueError, match="min_items <= max_items"):
    copy_drills(3, min_items=5, max_items=2)
  docs = knowledge.knowledge_documents(sources=("copy",))
  assert len(docs) == knowledge.COPY_DRILLS and docs[0].id == "drill/copy/0"
  with pytest.raises(ValueError, match="unknown knowledge source 'nope'"):
    knowledge.knowledge_documents(sources=("nope",))
