"""The real environments' perturbations on fixed seeds: the search engine (errors, pages,
withheld fields, rate limit), the web shop (error pages, pages, partial add-to-cart failures),
McpEnv (per-episode options through the server's side file, partial updates judged by the
verifiers), and how trajectories record them."""
from __future__ import annotations

import json
import math
import re

import pytest

from lwm_jax.envs import collect, perturb, recorder
from lwm_jax.envs.search import env as search
from lwm_jax.envs.web import env as web
from lwm_jax.envs.mcp.server import ERROR_MESSAGES


def _binomial_ok(k: int, n: int, rate: float) -> bool:
  return abs(k - n * rate) < 3.5 * math.sqrt(n * rate * (1 - rate))


@pytest.fixture(scope="module")
def search_env():
  env = search.SearchEnv()
  yield env
  env.close()


# -- search ------------------------------------------------------------------------------------
def test_search_errors_follow_the_rate_and_the_seed(search_env):
  n, rate = 240, 0.25
  search_env.set_perturb(f"errors:rate={rate},kind=timeout")

  def run(seed):
    search_env.reset(seed)
    return [search_env.step('search(query="function")') for _ in range(n)]

  outs = run(4)
  failed = [o.startswith("Error: ") for o in outs]
  assert _binomial_ok(sum(failed), n, rate), sum(failed)
  assert all(o == "Error: " + ERROR_MESSAGES["timeout"] for o, f in zip(outs, failed) if f)
  assert all(o.startswith("Results ") for o, f in zip(outs, failed) if not f)
  assert [o.startswith("Error: ") for o in run(4)] == failed  # same seed, same failing calls
  assert [o.startswith("Error: ") for o in run(5)] != failed
  search_env.set_perturb(None)
  search_env.reset(4)
  assert not any(search_env.step('search(query="function")').startswith("Error") for _ in range(40))


def test_search_pages_and_withheld_fields_against_the_plain_engine(search_env):
  search_env.set_perturb(None)
  search_env.reset(2)
  plain = search_env.step('search(query="function")')
  n = int(re.search(r"of (\d+) for", plain).group(1))
  plain_items = re.findall(r"^(\d+)\. \[([^\]]+)\] (.*)\n   score [\d.]+ \| (.+)$", plain, re.M)
  assert len(plain_items) == search.PER_PAGE and n > 9
  search_env.set_perturb("page_size:size=3; withhold:fields=snippet+score")
  search_env.reset(2)
  pages = [search_env.step(f'search(query="function", page={p})') for p in (1, 2)]
  assert f"(page 1 of {math.ceil(n / 3)})" in pages[0]
  items = [re.findall(r"^(\d+)\. \[([^\]]+)\](.*)$", p, re.M) for p in pages]
  assert [len(x) for x in items] == [3, 3]
  # The same ranking as the plain engine, with only id and title left.
  assert [(k, d, f" {t}") for k, d, t, _ in plain_items] == (items[0] + items[1])[:5]
  assert "score" not in pages[0] and "**" not in pages[0] and " | " not in pages[0]
  search_env.set_perturb("withhold:fields=title")
  search_env.reset(2)
  first = search_env.step('search(query="function")').split("\n")[2:4]
  assert first == [f"1. [{plain_items[0][1]}]", f"   score {plain.split('score ')[1].split(' |')[0]} | "
                   f"{plain_items[0][3]}"]
  with pytest.raises(ValueError, match="cannot withhold date"):
    search_env.set_perturb("withhold:fields=date")


def test_search_rate_limit(search_env):
  search_env.set_perturb("rate_limit:limit=3,retry_after=9")
  search_env.reset(1)
  doc = search_env.ids[0]
  outs = [search_env.step(f'open(doc_id="{doc}")') for _ in range(5)]
  assert [o.startswith(f"[{doc}]") for o in outs] == [True, True, True, False, False]
  assert outs[3] == "Error: Rate limit exceeded (429): 3 calls allowed per session; retry after 9 s"
  search_env.reset(1)  # a new episode: a new quota
  assert search_env.step(f'open(doc_id="{doc}")').startswith(f"[{doc}]")


# -- web ---------------------------------------------------------------------------------------
def test_web_error_pages_at_the_rate():
  n, rate = 150, 0.2
  with web.WebEnv(perturb=f"errors:rate={rate},kind=unavailable") as env:
    first = env.reset(6)
    assert "[HTTP" not in first  # the episode's first page is served normally
    outs = [env.step('goto("/products")') for _ in range(n)]
  heads = [o.split("\n")[0] for o in outs]
  bad = [h.endswith("[HTTP 503]") for h in heads]
  assert _binomial_ok(sum(bad), n, rate), sum(bad)
  assert all(h.startswith('Page "Service unavailable') for h, b in zip(heads, bad) if b)
  assert all(h.endswith("/products") for h, b in zip(heads, bad) if not b)


def test_web_page_size_and_partial_add_to_cart():
  with web.WebEnv(perturb="page_size:size=2; partial:rate=0.4") as env:
    env.reset(3)
    world = web.generate_world(3)
    listing = env.step('goto("/products")')
    assert len(re.findall(r'link "[^"]+"', listing.split("main", 1)[1])) == 2 + 1  # + "Next page"
    assert f"Page 1 of {math.ceil(len(world['products']) / 2)}" in listing
    prod = next(p for p in world["products"] if p["stock"] >= 20)
    added, failed_units, pages = 0, 0, 0
    for _ in range(4):  # 4 x 5 units of one product
      env.step(f'goto("/product/{prod["id"]}")')
      env.step(f'select({web.find(env.render(), "combobox", "Quantity")}, "5")')
      obs = env.step(f'click({web.find(env.render(), "button", "Add to cart")})')
      if obs.split("\n")[0].endswith("[HTTP 409]"):
        pages += 1
        ok, of = map(int, re.search(r"Added (\d+) of (\d+) x", obs).groups())
        assert of == 5 and obs.count(": failed (reservation error)") == 5 - ok
        added += ok
        failed_units += 5 - ok
      else:
        assert obs.split("\n")[0].endswith("/cart")
        added += 5
    cart = env.step('goto("/cart")')
  assert pages >= 1 and 0 < failed_units < 20  # partial failures present, not all-or-nothing
  assert f'{prod["name"]} x {added} ' in cart  # the cart holds exactly the units that succeeded


def test_unsupported_perturbations_are_refused_by_name():
  with pytest.raises(NotImplementedError, match="'stale' is not implemented by the real 'web'"):
    web.WebEnv(perturb="stale")
  with pytest.raises(ValueError, match=r"--perturb for 'terminal' \(episode 0\): perturbation "
                                       "'errors' is not implemented"):
    collect.collect("terminal", 1, perturb="errors:rate=0.1", workers=1, progress=False)


# -- mcp ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mcp_env_():
  """One McpEnv (its server process starts once) for the MCP tests of this file."""
  from lwm_jax.envs.mcp import env as mcp_env
  env = mcp_env.McpEnv()
  yield env
  env.close()


def test_mcp_env_reset_applies_each_episodes_options(mcp_env_):
  env = mcp_env_
  env.set_perturb("page_size:size=2; withhold:fields=email")
  env.reset(5)
  out = json.loads(env.step(json.dumps({"tool": "query", "arguments": {
      "sql": "SELECT id, email, city FROM customers ORDER BY id"}})))
  assert out["rows"] == [[1, out["rows"][0][1]], [2, out["rows"][1][1]]]
  assert out["columns"] == ["id", "city"] and out["truncated"]
  env.set_perturb("errors:rate=1.0,kind=server_error")
  env.reset(5)
  failed = json.loads(env.step(json.dumps({"tool": "list_tables", "arguments": {}})))
  assert failed["isError"] and ERROR_MESSAGES["server_error"] in failed["content"]
  env.set_perturb(None)
  env.reset(5)
  full = json.loads(env.step(json.dumps({"tool": "query", "arguments": {
      "sql": "SELECT id, email FROM customers ORDER BY id LIMIT 3"}})))
  assert full["columns"] == ["id", "email"] and len(full["rows"]) == 3


def test_mcp_env_partial_updates_and_the_verifiers_agree(mcp_env_):
  """McpEnv under `partial`: the update task (seed 4) is done exactly when the email field of an
  update went through, whichever other field failed; the database and transcript verifiers agree."""
  from lwm_jax.envs import verify, verify_transcript
  env = mcp_env_
  env.set_perturb("partial:rate=1.0")
  try:
    env.reset(4)
    g = env.goal
    assert g["kind"] == "update"
    before = next(c for c in env.world["tables"]["customers"] if c[0] == g["customer_id"])
    act = json.dumps({"tool": "update_customer", "arguments": {
        "customer_id": g["customer_id"], "email": g["email"], "city": "Atlantis"}})
    res = json.loads(env.step(act))
    assert res["updated"] == [] and sorted(res["failed"]) == ["city", "email"]
    assert res["customer"]["email"] == before[2] and res["customer"]["city"] == before[3]
    turns = [(act, json.dumps(res))]
    assert not verify.check(env, turns).success
    assert not verify_transcript.check_transcript("mcp", 4, turns, env).success
    # At rate 0.5 the seed's item stream fails the city and writes the email on some call.
    env.set_perturb("partial:rate=0.5")
    env.reset(4)
    turns, city = [], before[3]
    for _ in range(12):
      obs = env.step(act)
      turns.append((act, obs))
      res = json.loads(obs)
      if res["updated"] == ["email"]:
        break
      city = res["customer"]["city"]
    assert res["updated"] == ["email"] and list(res["failed"]) == ["city"]
    assert res["customer"]["email"] == g["email"] and res["customer"]["city"] == city  # kept
    assert verify.check(env, turns).success
    assert verify_transcript.check_transcript("mcp", 4, turns, env).success
  finally:
    env.set_perturb(None)


# -- trajectories ------------------------------------------------------------------------------
def test_trajectories_record_their_perturbation(search_env):
  spec = "errors:rate=0.3,kind=timeout;page_size:size=2"
  search_env.set_perturb(spec)
  t = recorder.record("search", 11, "p", env=search_env)
  assert t.meta["perturb"] == "errors:rate=0.3,kind=timeout; page_size:size=2"
  assert t.simulation_instruction == perturb.instruction(perturb.parse(spec))
  assert "more than 2 items" in t.simulation_instruction
  search_env.set_perturb(None)
  plain = recorder.record("search", 11, "p", env=search_env)
  assert "perturb" not in plain.meta and plain.simulation_instruction == ""


def test_perturbed_collection_is_deterministic():
  spec = "errors:rate=0.3,kind=unavailable; page_size:size=2"
  runs = [collect.collect("search", 3, seed=1, workers=1, progress=False, perturb=spec)
          for _ in range(2)]
  assert [t.to_dict() for t in runs[0][0]] == [t.to_dict() for t in runs[1][0]]
  assert runs[0][1]["perturbed"] == {"errors:rate=0.3,kind=unavailable; page_size:size=2":
                                     runs[0][1]["kept"]}
  assert any("Error: Service unavailable (503)" in x.observation for t in runs[0][0]
             for x in t.turns)


def test_corpus_menu_and_share():
  for domain, menu in perturb.corpus_menu().items():
    for spec in menu:  # every menu entry is canonical and implemented by its environment
      perts = perturb.parse(spec)
      assert perturb.spec_of(perts) == spec
      perturb.real_options(perts, domain)
  picks = [perturb.corpus_choice("search", i, 0.3) for i in range(1000)]
  assert picks == [perturb.corpus_choice("search", i, 0.3) for i in range(1000)]
  assert _binomial_ok(sum(bool(p) for p in picks), 1000, 0.3)
  assert set(picks) == {""} | set(perturb.corpus_menu()["search"])
  assert all(perturb.corpus_choice("search", i, 0.0) == "" for i in range(200))
  assert all(perturb.corpus_choice("terminal", i, 1.0) == "" for i in range(20))
  with pytest.raises(ValueError, match="perturb_share must be in"):
    perturb.corpus_choice("web", 0, 1.5)


def test_a_given_menu_replaces_the_domains_menu():
  """`parse_menu` (make_corpus --menu, fidelity --specs): the fixed menus for "", else only the
  named specs in canonical form, checked against each domain's real environment; corpus_choice
  then draws from that menu alone, at the same share."""
  assert perturb.parse_menu("", ["mcp"]) == {"mcp": list(perturb.corpus_menu()["mcp"])}
  got = perturb.parse_menu("mcp=page_size:size=3 && web=errors:kind=timeout,rate=0.1|"
                           "partial:rate=0.4", ["mcp", "search", "web"])
  assert got == {"mcp": ["page_size:size=3"], "search": [],
                 "web": ["errors:rate=0.1,kind=timeout", "partial:rate=0.4"]}
  with pytest.raises(ValueError, match="--menu: expected DOMAIN=SPEC"):
    perturb.parse_menu("terminal=page_size:size=3", ["mcp"], "--menu")
  with pytest.raises(NotImplementedError, match="partial"):  # search has no partial failures
    perturb.parse_menu("search=partial:rate=0.3", ["search"])
  picks = [perturb.corpus_choice("web", i, 0.5, menu=got["web"]) for i in range(400)]
  assert set(picks) == {"", *got["web"]}
  assert [bool(p) for p in picks] == [bool(perturb.corpus_choice("web", i, 0.5))
                                      for i in range(400)]
  assert all(perturb.corpus_choice("search", i, 1.0, menu=[]) == "" for i in range(20))


def test_make_corpus_share_puts_menu_perturbations_in_the_corpus():
  from lwm_jax.envs import corpus as mc
  kept, _, _ = mc.collect_split("search", 4, 0, 1, perturb_share=1.0)
  specs = [t.meta["perturb"] for t, _ in kept]
  assert specs == [perturb.corpus_choice("search", int(t.id.rsplit("-", 1)[1]), 1.0)
                   for t, _ in kept]
  assert all(s in perturb.corpus_menu()["search"] for s in specs)
  assert all(t.simulation_instruction == perturb.instruction(perturb.parse(t.meta["perturb"]))
             for t, _ in kept)
  plain, _, _ = mc.collect_split("search", 2, 0, 1)
  assert all("perturb" not in t.meta and not t.simulation_instruction for t, _ in plain)
