"""evals/fidelity.py: the per-kind detectors on crafted and on real perturbed observations, and
the whole script on a tiny random checkpoint (few episodes, few tokens)."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

from lwm_jax.envs import perturb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("fidelity", os.path.join(REPO, "evals", "fidelity.py"))
fidelity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fidelity)

SEARCH_OBS = ('Results 1-2 of 9 for "json" (page 1 of 5)\n\n1. [json] json: JSON encoder\n'
              '   score 3.10 | **JSON** (JavaScript Object Notation)\n\n2. [json.dumps] json.dumps: '
              'Serialize\n   score 2.00 | Serialize obj to a **JSON** formatted str')


def test_error_detectors():
  assert fidelity.shows_error("Error: Request timed out: the server did not answer", "timeout")
  assert fidelity.shows_error('Page "Gateway timeout - Shop" at http://shop.local/ [HTTP 504]',
                              "timeout")
  assert fidelity.shows_error('{"isError": true, "content": "Internal server error (500): x"}',
                              "server_error")
  assert fidelity.shows_error("HTTP/1.1 503 Service Unavailable", "unavailable")
  assert not fidelity.shows_error(SEARCH_OBS, "timeout")
  assert not fidelity.shows_error('{"id": 500, "total": 500.0}', "server_error")  # numbers only
  assert not fidelity.shows_error("Error: Request timed out", "unavailable")  # another kind
  assert fidelity.shows_rate_limit("Error: Rate limit exceeded (429): 3 calls allowed")
  assert not fidelity.shows_rate_limit(SEARCH_OBS)


def test_count_items_and_fields():
  assert fidelity.count_items(SEARCH_OBS) == 2
  assert fidelity.count_items('{"columns": ["id"], "rows": [[1], [2], [3]]}') == 3
  assert fidelity.count_items('["a", "b", "... 4 more not shown (page size 2)"]') == 2
  assert fidelity.count_items('Page "Products - Shop" at http://shop.local/products\n  list\n'
                              '    listitem\n      [7] link "Mug"\n    listitem\n'
                              '      [8] link "Cup"') == 2
  assert fidelity.count_items("Error: empty query") is None
  assert fidelity.shows_field(SEARCH_OBS, "snippet") and fidelity.shows_field(SEARCH_OBS, "score")
  bare = '1. [json]\n\n2. [json.dumps] json.dumps: Serialize\n   score 2.00'
  assert not fidelity.shows_field(bare, "snippet") and fidelity.shows_field(bare, "score")
  assert fidelity.shows_field(bare, "title") and not fidelity.shows_field("1. [json]", "title")
  assert fidelity.shows_field('{"id": 2, "email": "a@b.c"}', "email")
  assert fidelity.shows_field('{"columns": ["id", "email"], "rows": []}', "email")
  assert not fidelity.shows_field('{"columns": ["id", "city"], "rows": [[1, "Oslo"]]}', "email")
  assert fidelity.shows_partial("Added 2 of 3 x Mug; 1 could not be reserved.")
  assert not fidelity.shows_partial("Added 3 x Mug to the cart.")


def test_followed_applies_where_the_real_env_shows_the_behaviour():
  page = perturb.parse("page_size:size=2")[0]
  assert fidelity.followed(page, SEARCH_OBS, SEARCH_OBS) is True
  assert fidelity.followed(page, SEARCH_OBS.replace("2. [", "2. [x] y\n3. ["), SEARCH_OBS) is False
  assert fidelity.followed(page, "whatever", "Error: empty query") is None  # no list: n/a
  hold = perturb.parse("withhold:fields=snippet")[0]
  assert fidelity.followed(hold, SEARCH_OBS, SEARCH_OBS) is False
  assert fidelity.followed(hold, "1. [json] json: JSON\n   score 3.10", SEARCH_OBS) is True
  err = perturb.parse("errors:rate=0.2,kind=timeout")[0]
  assert fidelity.followed(err, "Error: Request timed out", "anything") is True
  assert perturb.parse("stale")[0].name == "stale"
  assert fidelity.followed(perturb.parse("stale")[0], "x", "y") is None


def test_detectors_agree_with_the_real_search_engine():
  from lwm_jax.envs import search
  env = search.SearchEnv(perturb="page_size:size=2; withhold:fields=snippet")
  try:
    env.reset(3)
    obs = env.step('search(query="function")')
  finally:
    env.close()
  assert fidelity.count_items(obs) == 2 and not fidelity.shows_field(obs, "snippet")
  assert fidelity.shows_field(obs, "score") and fidelity.shows_field(obs, "title")


def test_bad_arguments_name_the_flag(tmp_path, capsys):
  assert fidelity.main(["--checkpoint", "x", "--out", str(tmp_path), "--domains", "terminal"]) == 2
  assert "--domains: 'terminal' has no real perturbations" in capsys.readouterr().err
  assert fidelity.main(["--checkpoint", "x", "--out", str(tmp_path), "--domains", "web",
                        "--specs", "web=stale"]) == 2
  assert "'stale' is not implemented by the real 'web'" in capsys.readouterr().err
  assert fidelity.main(["--checkpoint", "x", "--out", str(tmp_path), "--engine", "[1]"]) == 2
  assert "--engine: expected a JSON object, got list" in capsys.readouterr().err


def test_fidelity_report_on_a_tiny_random_checkpoint(tmp_path):
  from tests.sim_helpers import save_tiny_checkpoint
  ckpt = save_tiny_checkpoint(str(tmp_path / "ckpt"))
  out = tmp_path / "report"
  rc = fidelity.main(["--checkpoint", ckpt, "--out", str(out), "--domains", "search",
                      "--specs", "search=page_size:size=2|errors:rate=0.5,kind=timeout",
                      "--episodes", "2", "--max_turns", "2", "--max_tokens", "4", "--batch", "4",
                      "--engine", json.dumps({"min_batch_bucket": 4, "min_prompt_bucket": 1024,
                                              "min_cache_len": 1536, "prefill_chunk": 1024,
                                              "chunk_steps": 4, "decode_layout": "model"})])
  assert rc == 0
  report = json.loads((out / "fidelity.json").read_text())
  rows = {r["spec"]: r for r in report["rows"]}
  assert set(rows) == {"page_size:size=2", "errors:rate=0.5,kind=timeout"}
  for r in rows.values():
    assert r["episodes"] == 2 and 2 <= r["turns"] <= 4
    for cond in ("with", "without"):
      assert 0.0 <= r["similarity_to_real"][cond]["edit_sim"] <= 1.0
  page = rows["page_size:size=2"]["checks"]["page_size"]
  assert page["real"] in (None, 1.0)  # the real engine always respects its own page size
  errs = rows["errors:rate=0.5,kind=timeout"]["checks"]["errors"]
  assert errs["turns"] == rows["errors:rate=0.5,kind=timeout"]["turns"] and errs["target"] == 0.5
  md = (out / "fidelity.md").read_text()
  assert "| search | `page_size:size=2` | page_size |" in md
