"""Schema validation modes, importers and hygiene filters on hand-made fixtures."""
import gzip
import json
import os

import pytest

from lwm_jax import domains
from lwm_jax.data import hygiene, importers, schema

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "data")


def test_read_fixture_all_domains():
  trajs = list(schema.read_jsonl(os.path.join(FIX, "trajectories.jsonl")))
  assert {t.domain for t in trajs} == set(domains.bench_domains())
  assert trajs[0].simulation_instruction.startswith("The disk")


def test_gzip_roundtrip(tmp_path):
  trajs = list(schema.read_jsonl(os.path.join(FIX, "trajectories.jsonl")))
  p = tmp_path / "t.jsonl.gz"
  assert schema.write_jsonl(p, trajs) == len(trajs)
  with gzip.open(p, "rt") as f:
    assert json.loads(f.readline())["id"] == "term-001"
  assert [t.to_dict() for t in schema.read_jsonl(p)] == [t.to_dict() for t in trajs]


def test_strict_names_path_and_line():
  path = os.path.join(FIX, "corrupt.jsonl")
  with pytest.raises(ValueError, match=r"corrupt\.jsonl:2: bad JSON"):
    schema.load_jsonl(path, mode="strict")
  with pytest.raises(ValueError, match=r"corrupt\.jsonl:2:"):
    list(schema.read_jsonl(path))


def test_skip_counts_reasons_and_quarantines(tmp_path):
  q = tmp_path / "quarantine.jsonl"
  trajs, rep = schema.load_jsonl(os.path.join(FIX, "corrupt.jsonl"), mode="skip", quarantine=q)
  assert [t.id for t in trajs] == ["term-001", "search-001"]
  assert rep.loaded == 2
  assert dict(rep.bad) == {"bad_json": 1, "missing_field": 1, "unknown_domain": 1,
                           "empty_turns": 1}
  lines = [json.loads(x) for x in q.read_text().splitlines()]
  assert [(x["line"], x["reason"]) for x in lines] == [
      (2, "bad_json"), (3, "missing_field"), (4, "unknown_domain"), (5, "empty_turns")]
  assert "missing field 'task'" in lines[1]["error"]
  assert "loaded 2, bad 4" in rep.summary()


def test_awb_import_merges_to_full_trajectory():
  trajs, rep = importers.load_any(os.path.join(FIX, "awb_terminal.jsonl"))
  assert rep.loaded == 7 and len(trajs) == 2
  ref = {t.id: t for t in schema.read_jsonl(os.path.join(FIX, "trajectories.jsonl"))}
  for t in trajs:
    assert [x.to_dict() for x in t.turns] == [x.to_dict() for x in ref[t.id].turns]
    assert t.meta["system_str"] == "You simulate a terminal environment."


def test_chat_import(tmp_path):
  path = os.path.join(FIX, "chat.jsonl")
  with pytest.raises(ValueError, match=r"chat\.jsonl:3: last user message has no observation"):
    importers.load_any(path)
  trajs, rep = importers.load_any(path, mode="skip")
  assert dict(rep.bad) == {"bad_turn": 1}
  a, b = trajs
  assert a.id == "chat-1" and a.meta["system_str"].startswith("You are a Linux shell")
  assert [(t.action, t.observation) for t in a.turns] == [
      ("pwd", "/home/alice"), ("ls", "notes.txt\nphoto.jpg")]
  assert b.id == "chat.jsonl:2" and b.domain == "search"
  assert b.turns[0].action == 'search("capital of Peru")'
  assert b.turns[0].observation == "1. Lima - capital and largest city of Peru."


def test_hygiene_filters_each_counted():
  trajs = list(schema.read_jsonl(os.path.join(FIX, "trajectories.jsonl")))
  rep = hygiene.HygieneReport()
  kept = hygiene.filter_trajectories(trajs, rep)
  ids = {t.id for t in kept}
  assert "mcp-001" in ids and "swe-001" in ids and "term-002" in ids
  assert dict(rep.dropped) == {"undeclared_tool": 1,       # mcp-002 calls delete_all
                               "broken_environment": 1,    # web-002 shows a CAPTCHA
                               "fewer_than_2_turns": 1}    # os-002 has one turn
  assert dict(rep.turns_dropped) == {"unchanged_gui_state": 1}  # android swipe changed nothing
  android = next(t for t in kept if t.id == "android-001")
  assert [t.action for t in android.turns] == ["tap(settings)", "tap(wifi)"]
  assert rep.kept == len(kept) == len(trajs) - 3


def test_tool_name_forms():
  assert hygiene.tool_name('{"name": "a", "arguments": {}}') == "a"
  assert hygiene.tool_name('{"function": {"name": "b"}}') == "b"
  assert hygiene.tool_name("read_file('x')") == "read_file"
  assert hygiene.tool_name("just text") is None
