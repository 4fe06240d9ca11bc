"""lwm_jax/eval/fidelity.py (the library behind evals/fidelity.py): the per-kind detectors on crafted and on real perturbed observations, and
the whole script on a tiny random checkpoint (few episodes, few tokens)."""
from __future__ import annotations

import json

import pytest

from lwm_jax.envs import perturb
from lwm_jax.eval import fidelity

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
  from lwm_jax.envs.search import env as search
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


@pytest.mark.slow  # about 3 minutes on 2 cores (its teacher-forced part): `make test-slow`
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
  assert "| search | `page_size:size=2` | page_size |" in md and "departing turns" in md
  assert report["episodes_found"] == {"search": 2} and "all the test split has" not in md
  short = fidelity.markdown({**report, "episodes_per_domain": 5})
  assert ("5 held-out episodes per domain and perturbation (all the test split has: search 2)"
          in short)
  assert page["departing"]["turns"] <= page["turns"] and "departing" not in errs
  # the teacher-forced part scored every replayed turn with and without the instruction
  lik = {r["spec"]: r for r in report["likelihood"]}
  assert set(lik) == set(rows)
  for spec, r in lik.items():
    assert r["all"]["turns"] == rows[spec]["turns"] and r["all"]["tokens"] > 0
    assert r["all"]["nll_with"] > 0 and r["all"]["nll_without"] > 0
    assert r["all"]["gain"] == pytest.approx(r["all"]["nll_without"] - r["all"]["nll_with"])
  assert "(all turns)" in md


def test_likelihood_gain_pools_all_turns_and_the_turns_that_show_the_behaviour(monkeypatch):
  """The teacher-forced part: NLL with and without the instruction, joined turn by turn, pooled
  per token over all turns and over the turns whose real observation shows each check."""
  from lwm_jax.data import schema
  from lwm_jax.eval import teacher_forced as tf
  timeout = "Error: the request timed out (HTTP 504)"
  spec = "errors:rate=0.5,kind=timeout; page_size:size=2"
  traj = schema.Trajectory(id="s1", domain="search", task="find json", action_space="search",
                           initial_state="", simulation_instruction="half the calls time out",
                           turns=[schema.Turn('search("json")', timeout),
                                  schema.Turn('search("json")', SEARCH_OBS),
                                  schema.Turn('open("json")', "json: JSON encoder and decoder")],
                           meta={"perturb": spec})

  def fake_nll(model, tokenizer, trajs, **kw):
    # nats per token: 1 with the instruction and 3 without on the error turn, 2 elsewhere; the
    # last turn does not fit the context when the instruction is removed (joined turns only)
    told = bool(trajs[0].simulation_instruction)
    recs = [tf.TurnNLL(0, 0, 10 * (1.0 if told else 3.0), 10, 0),
            tf.TurnNLL(0, 1, 20 * 2.0, 20, 0)]
    if told:
      recs.append(tf.TurnNLL(0, 2, 99.0, 5, 0))
    return recs, 0 if told else 1

  monkeypatch.setattr(tf, "observation_nll", fake_nll)
  (row,) = fidelity.likelihood(None, None, [traj], thinking=False, max_len=64)
  assert (row["domain"], row["spec"]) == ("search", spec)
  assert row["all"]["turns"] == 2 and row["all"]["tokens"] == 30
  assert row["all"]["nll_with"] == pytest.approx(50 / 30)
  assert row["all"]["gain"] == pytest.approx((70 - 50) / 30)
  errors, page = row["checks"]["errors"], row["checks"]["page_size"]
  assert (errors["turns"], errors["nll_with"], errors["nll_without"]) == (1, 1.0, 3.0)
  assert (page["turns"], page["gain"]) == (1, 0.0)  # the 2-item page; the document is no list
  assert row["skipped_turns"] == {"with": 0, "without": 1}
  md = "\n".join(fidelity.likelihood_markdown([row]))
  assert f"| search | `{spec}` (errors shown) | 1 | 10 | 1.000 | 3.000 | +2.000 |" in md


# -- partial and stale on the MCP tool server --------------------------------------------------
def _act(tool, **args):
  return json.dumps({"tool": tool, "arguments": args})


def _cust(cid=3, email="old@x.test", city="Oslo", tier="basic"):
  return json.dumps({"id": cid, "name": "Ana Silva", "email": email, "city": city, "tier": tier})


def _listing(columns, rows, **extra):
  return json.dumps({"columns": columns, "rows": rows, "row_count": len(rows), **extra})


def test_partial_detector_on_the_real_mcp_update_result(tmp_path):
  import asyncio
  from lwm_jax.envs.mcp import env as mcp_env
  from lwm_jax.envs.mcp import server as mcp_server
  db = str(tmp_path / "shop.db")
  mcp_env.write_database(db, mcp_env.generate_world(2))

  def update(opts):
    app = mcp_server.make_server(db, opts)
    result = asyncio.run(app.call_tool("update_customer", {"customer_id": 1, "email": "n@x.test",
                                                           "city": "Tartu", "tier": "gold"}))
    return result.content[0].text

  plain = update(None)
  mixed = next(o for o in (update({"partial_rate": 0.5, "seed": s}) for s in range(20))
               if 0 < len(json.loads(o).get("failed", {})) < 3)
  failed_all = update({"partial_rate": 1.0, "seed": 0})
  assert fidelity.shows_partial(mixed) and fidelity.shows_partial(failed_all)
  assert not fidelity.shows_partial(plain)
  part = perturb.parse("partial:rate=0.3")[0]
  assert fidelity.followed(part, mixed, plain) is True  # applies to every update result
  assert fidelity.followed(part, plain, mixed) is False
  assert fidelity.followed(part, mixed, _cust()) is None  # a read: not a batch action


def test_stale_detector_on_crafted_episodes():
  upd = (_act("update_customer", customer_id=3, email="new@x.test"),
         json.dumps({"updated": ["email"], "customer": json.loads(_cust(email="new@x.test"))}))
  read = _act("get_customer", customer_id=3)
  S = fidelity.shows_stale
  assert S(read, _cust(), [upd]) is True  # the old email after an acknowledged write
  assert S(read, _cust(email="new@x.test"), [upd]) is False
  assert S(read, _cust(), []) is None  # nothing written before
  assert S(_act("get_customer", customer_id=4), _cust(4), [upd]) is None  # another record
  assert S(read, json.dumps({"id": 3, "name": "A", "city": "Oslo"}), [upd]) is None  # withheld
  assert S(*upd, []) is None and S(*upd, [upd]) is None  # a write is no read
  refused = (upd[0], '{"isError": true, "content": "sqlite3.IntegrityError: UNIQUE"}')
  assert S(read, _cust(), [refused]) is None  # a refused write changed nothing
  part = (_act("update_customer", customer_id=3, email="new@x.test", city="Lyon"),
          json.dumps({"updated": ["city"], "failed": {"email": "Write conflict (409): ..."},
                      "customer": json.loads(_cust(city="Lyon"))}))
  assert S(read, _cust(city="Lyon"), [part]) is False  # only the city was written
  assert S(read, _cust(), [part]) is True
  assert S(_act("query", sql="SELECT id, email FROM customers"),
           _listing(["id", "email"], [[2, "b@x.test"], [3, "old@x.test"]]), [upd]) is True
  # A created order: missing from the customer's complete listing is stale.
  order = (_act("create_order", customer_id=3, product_id=5, quantity=2),
           json.dumps({"order_id": 41, "status": "paid", "product": "Mug", "quantity": 2,
                       "total": 9.0, "stock_left": 10}))
  cols = ["id", "status", "total", "created_at"]
  lst = _act("list_orders", customer_id=3)
  assert S(lst, _listing(cols, [[7, "paid", 3.0, "t"]]), [order]) is True
  assert S(lst, _listing(cols, [[7, "paid", 3.0, "t"], [41, "paid", 9.0, "t"]]), [order]) is False
  assert S(lst, _listing(cols, [[7, "paid", 3.0, "t"]], truncated=True), [order]) is None
  assert S(_act("list_orders", customer_id=3, status="pending"), _listing(cols, []), [order]) is None
  assert S(_act("list_orders", customer_id=9), _listing(cols, []), [order]) is None
  stock = _act("search_products", keyword="Mug")
  assert S(stock, _listing(["id", "name", "category", "price", "stock"],
                           [[5, "Mug", "cups", 4.5, 12]]), [order]) is True
  # A refund: the order's status and the refunds row.
  refund = (_act("refund_order", order_id=7, reason="broken"),
            json.dumps({"order_id": 7, "refunded": 3.0, "status": "refunded"}))
  q = _act("query", sql="SELECT * FROM refunds WHERE order_id = 7")
  rcols = ["order_id", "amount", "reason", "created_at"]
  assert S(q, _listing(rcols, []), [refund]) is True
  assert S(q, _listing(rcols, [[7, 3.0, "broken", "t"]]), [refund]) is False
  assert S(lst, _listing(cols, [[7, "paid", 3.0, "t"]]), [refund]) is True
  assert S(lst, _listing(cols, [[7, "refunded", 3.0, "t"]]), [refund]) is False
  join = _act("query", sql="SELECT o.id FROM orders o JOIN refunds r ON r.order_id = o.id")
  assert S(join, _listing(["id"], []), [refund]) is None
  assert S('{"tool": "list_tables"}', '["customers"]', [refund]) is None
  # followed: applies where the real read was stale, each side judged on its own history.
  st = perturb.parse("stale")[0]
  assert fidelity.followed(st, _cust(), _cust(), action=read, sim_history=[upd],
                           real_history=[upd]) is True
  assert fidelity.followed(st, _cust(email="new@x.test"), _cust(), action=read,
                           sim_history=[upd], real_history=[upd]) is False
  assert fidelity.followed(st, _cust(), _cust(email="new@x.test"), action=read,
                           sim_history=[upd], real_history=[upd]) is None


def test_detectors_take_any_json_a_model_writes():
  """A sampled observation can be any JSON at all; every check rates it (True, False or None)
  instead of stopping the report (a `"columns": true` once ended a 5-minute fidelity run)."""
  read, upd = _act("get_customer", customer_id=3), _act("update_customer", customer_id=3, city="X")
  odd = ['{"columns": true, "rows": 3}', '{"columns": "email", "rows": []}',
         '{"columns": [{"a": 1}], "rows": [[1]]}', '{"updated": [["city"]], "customer": 1}',
         '{"order_id": [41], "status": "refunded"}', '{"order_id": {"x": 1}, "stock_left": 2}',
         '[{"email": null}, 3, "... 2 more"]', 'null', '{"isError": 1}', '"text"']
  kinds = [perturb.parse(s)[0] for s in ("page_size:size=3", "withhold:fields=email", "stale",
                                         "partial:rate=0.3", "errors:rate=0.2,kind=timeout")]
  actions = [read, upd, _act("create_order", customer_id=3, product_id=5, quantity=1),
             _act("refund_order", order_id=7), _act("query", sql="SELECT * FROM customers")]
  for obs in odd:
    history = [(a, obs) for a in actions]
    for p in kinds:
      for action in actions:
        got = fidelity.followed(p, obs, _cust(), action=action, sim_history=history,
                                real_history=[(upd, json.dumps({"updated": ["city"],
                                                                "customer": json.loads(_cust())}))])
        assert got in (True, False, None), (obs, p.name, action, got)
  assert not fidelity.shows_field('{"columns": true, "rows": 3}', "email")


@pytest.fixture(scope="module")
def mcp_real():
  from lwm_jax.envs.mcp import env as mcp_env
  env = mcp_env.McpEnv()
  yield env
  env.close()


def test_stale_detector_on_real_mcp_episodes(mcp_real):
  """Episodes of the order, update and refund tasks recorded with `stale:refresh=0` and without:
  the detector fires exactly on the turns whose stale observation differs from the plain one
  (the reads the real server served from its snapshot), and never without the perturbation."""
  from lwm_jax.envs import recorder
  stale, plain = [], []
  for seed, kind in ((0, "order"), (4, "update"), (5, "refund")):
    mcp_real.set_perturb("stale:refresh=0")
    stale.append(recorder.record("mcp", seed, f"s{seed}", env=mcp_real))
    assert mcp_real.goal["kind"] == kind
    mcp_real.set_perturb(None)
    plain.append(recorder.record("mcp", seed, f"p{seed}", env=mcp_real))
  fired = 0
  for s, p in zip(stale, plain):
    assert [t.action for t in s.turns] == [t.action for t in p.turns]
    hs, hp = [], []
    for ts, tp in zip(s.turns, p.turns):
      got = fidelity.shows_stale(ts.action, ts.observation, hs)
      assert (got is True) == (ts.observation != tp.observation), ts.action
      assert fidelity.shows_stale(tp.action, tp.observation, hp) is not True
      fired += got is True
      hs.append((ts.action, ts.observation))
      hp.append((tp.action, tp.observation))
  assert fired >= 3  # at least one stale read per task
  # The report: replaying the real stale observations follows the instruction on every stale
  # turn; the plain ones (what a world model ignoring it would show) on none.
  rows = fidelity.measure(stale, [[t.observation for t in s.turns] for s in stale],
                          [[t.observation for t in p.turns] for p in plain])
  check = rows[0]["checks"]["stale"]
  assert rows[0]["spec"] == "stale:refresh=0" and check["turns"] == fired
  assert (check["real"], check["with_instruction"], check["without_instruction"]) == (1.0, 1.0, 0.0)


def test_departing_turns_on_crafted_episodes():
  from lwm_jax.data.schema import Trajectory, Turn
  mk = lambda turns: Trajectory("e|x", "mcp", "", "", "", [Turn(a, o) for a, o in turns])
  pert = mk([("a", "1"), ("b", "2*"), ("c", "3"), ("d", "4*")])
  assert fidelity.departing_turns(pert, mk([("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")])) \
      == [False, True, False, True]
  # once the actions part, no later turn is compared; a shorter twin ends the comparison
  assert fidelity.departing_turns(pert, mk([("a", "1"), ("x", "2"), ("c", "3"), ("d", "4")])) \
      == [False, False, False, False]
  assert fidelity.departing_turns(pert, mk([("a", "1"), ("b", "2")])) == [False, True, False, False]
  assert fidelity.departing_turns(pert, None) == [False] * 4


def test_withhold_rated_on_its_departing_turns(mcp_real):
  """Real MCP episodes with `withhold:fields=email` and their plain twins, replayed as a model
  that follows the instruction (the real withheld observations) and one that ignores it (the
  plain ones). Over all result turns the ignoring model passes too, wherever the result had no
  email to begin with; on the departing turns it never passes and the follower always does."""
  from lwm_jax.envs import recorder
  spec = "withhold:fields=email"
  held, plain = [], {}
  for seed in range(12):
    mcp_real.set_perturb(spec)
    held.append(recorder.record("mcp", seed, f"e{seed}|{spec}", env=mcp_real, max_turns=8))
    mcp_real.set_perturb(None)
    plain[f"e{seed}"] = recorder.record("mcp", seed, f"e{seed}|", env=mcp_real, max_turns=8)
  changed = sum(fidelity.departing_turns(h, plain[h.id.split("|")[0]]).count(True) for h in held)
  assert changed >= 2
  twin_obs = [[t.observation for t in plain[h.id.split("|")[0]].turns][:len(h.turns)]
              for h in held]
  rows = fidelity.measure(held, [[t.observation for t in h.turns] for h in held], twin_obs, plain)
  check = rows[0]["checks"]["withhold"]
  assert check["without_instruction"] > 0.5  # the loose rate: most results never had an email
  dep = check["departing"]
  assert dep["turns"] == changed
  assert (dep["real"], dep["with_instruction"], dep["without_instruction"]) == (1.0, 1.0, 0.0)
  assert "departing" not in fidelity.measure(held, twin_obs, twin_obs)[0]["checks"]["withhold"]
