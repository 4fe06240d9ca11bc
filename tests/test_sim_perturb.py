"""The perturbation catalogue (specs, rendering into the system prompt) and its real counterpart
in the MCP tool server (errors at a seeded rate, pages, withheld fields, partial batch failures,
rate limit, stale reads)."""
from __future__ import annotations

import asyncio
import json
import math
import os
import sqlite3
import subprocess
import sys

import pytest

import lwm_jax
from lwm_jax.data import prompts
from lwm_jax.data.schema import Trajectory, Turn
from lwm_jax.envs.mcp import env as mcp_env
from lwm_jax.envs.mcp import server as mcp_server
from lwm_jax.sim import perturb
from tests.sim_helpers import terminal_world


# -- the catalogue ---------------------------------------------------------------------------
def test_parse_spec_and_round_trip():
  perts = perturb.parse("errors:rate=0.2,kind=timeout; page_size:size=3;withhold:fields=email+city")
  assert [p.name for p in perts] == ["errors", "page_size", "withhold"]
  assert perts[0].params == {"rate": 0.2, "kind": "timeout"}
  assert perts[2].params == {"fields": ["email", "city"]}
  assert perturb.parse(";".join(p.spec() for p in perts)) == perts
  assert perturb.parse("stale")[0].params == {"refresh": 0}  # defaults
  assert perturb.parse("") == []


@pytest.mark.parametrize("spec, msg", [
    ("erors:rate=0.2", "perturbation 'erors': unknown"),
    ("errors:rate=1.5", "perturbation 'errors': rate must be in \\[0, 1\\], got 1.5"),
    ("errors:rate=lots", "perturbation 'errors': rate must be float, got 'lots'"),
    ("errors:kind=explode", "perturbation 'errors': kind must be one of timeout"),
    ("errors:speed=2", "perturbation 'errors': unknown parameter 'speed'"),
    ("errors:rate", "perturbation 'errors': expected key=value, got 'rate'"),
    ("errors:rate=0.1,rate=0.2", "parameter 'rate' given twice"),
    ("page_size:size=0", "perturbation 'page_size': size must be >= 1, got 0"),
    ("withhold:fields=", "perturbation 'withhold': fields must name at least one field"),
    ("stale;stale", "perturbation 'stale': given twice"),
])
def test_bad_specs_name_the_fault(spec, msg):
  with pytest.raises(ValueError, match=msg):
    perturb.parse(spec)


def test_instruction_lands_in_the_prompts_simulation_instruction_section():
  world = perturb.apply(terminal_world(simulation_instruction="The disk is nearly full."),
                        "errors:rate=0.25,kind=server_error;page_size:size=4")
  text = world.simulation_instruction
  assert text.startswith("The disk is nearly full.\n- Intermittent failures: about 25% of")
  assert "internal server error (status 500)" in text and "more than 4 items" in text
  traj = Trajectory("t", "terminal", world.task, world.action_space, world.initial_state,
                    [Turn("ls", "")], simulation_instruction=text)
  for variant in (0, 3, 7):  # plain, XML and prose layouts all carry it in that section
    sp = prompts.system_prompt(traj, variant)
    assert "about 25% of the agent's calls" in sp
  assert "<simulation_instruction>\nThe disk is nearly full.\n- Intermittent" in \
      prompts.system_prompt(traj, 3)


def test_real_options_for_the_mcp_server_and_the_hook_for_others():
  opts = perturb.real_options("errors:rate=0.1,kind=unavailable;withhold:fields=email", "mcp",
                              seed=9)
  assert opts == {"seed": 9, "error_rate": 0.1, "error_kind": "unavailable", "withhold": ["email"]}
  assert mcp_server.check_perturb(opts) == opts
  # The tool server implements partial batch failures (update_customer's fields); search does not.
  assert perturb.real_options("partial:rate=0.5", "mcp", seed=2) == {"seed": 2, "partial_rate": 0.5}
  with pytest.raises(NotImplementedError, match="'partial' is not implemented by the real 'search'"):
    perturb.real_options("partial:rate=0.5", "search")
  with pytest.raises(NotImplementedError, match="'search' environment"):
    perturb.real_options("stale", "search")


# -- the real MCP server --------------------------------------------------------------------
def _server(tmp_path, perturb_opts=None, seed=3):
  db = str(tmp_path / "shop.db")
  if not os.path.exists(db):
    mcp_env.write_database(db, mcp_env.generate_world(seed))
  return db, mcp_server.make_server(db, perturb_opts)


def _call(app, name, **args):
  """(is_error, text) of one tool call, through the MCP server's own call path."""
  from mcp.server.mcpserver.exceptions import ToolError
  try:
    result = asyncio.run(app.call_tool(name, args))
  except ToolError as e:
    return True, str(e)
  text = "\n".join(c.text for c in result.content)
  return bool(getattr(result, "is_error", False)), text


def test_mcp_errors_follow_the_rate_on_a_fixed_seed(tmp_path):
  n, rate = 300, 0.2
  _, app = _server(tmp_path, {"error_rate": rate, "error_kind": "timeout", "seed": 11})
  outcomes = [_call(app, "get_customer", customer_id=1) for _ in range(n)]
  errors = [t for bad, t in outcomes if bad]
  assert all(t.endswith(mcp_server.ERROR_MESSAGES["timeout"]) for t in errors)
  sd = math.sqrt(n * rate * (1 - rate))
  assert abs(len(errors) - n * rate) < 3.5 * sd, len(errors)  # binomial, 3.5 sigma
  # The same seed gives the same failing calls; another seed, other ones.
  _, again = _server(tmp_path, {"error_rate": rate, "error_kind": "timeout", "seed": 11})
  assert [_call(again, "get_customer", customer_id=1)[0] for _ in range(n)] == \
      [bad for bad, _ in outcomes]
  _, other = _server(tmp_path, {"error_rate": rate, "error_kind": "timeout", "seed": 12})
  assert [_call(other, "get_customer", customer_id=1)[0] for _ in range(n)] != \
      [bad for bad, _ in outcomes]
  ok = [t for bad, t in outcomes if not bad][0]
  assert json.loads(ok)["id"] == 1  # the calls that pass are untouched


def test_mcp_page_size_and_withheld_fields(tmp_path):
  db, app = _server(tmp_path, {"page_size": 3, "withhold": ["email", "total"]})
  con = sqlite3.connect(db)
  # A query under the server's own 50-row cap, so every row not shown is one the page cut.
  where = "WHERE order_id <= 8"
  n_items = con.execute(f"SELECT COUNT(*) FROM order_items {where}").fetchone()[0]
  con.close()
  assert 3 < n_items <= 50
  bad, text = _call(app, "query", sql=f"SELECT * FROM order_items {where}")
  out = json.loads(text)
  assert not bad and len(out["rows"]) == 3 and out["truncated"]
  assert out["rows_not_shown"] == n_items - 3
  bad, text = _call(app, "get_customer", customer_id=2)
  cust = json.loads(text)
  assert not bad and "email" not in cust and set(cust) == {"id", "name", "city", "tier"}
  out = json.loads(_call(app, "query", sql="SELECT id, email, city FROM customers")[1])
  assert out["columns"] == ["id", "city"] and all(len(r) == 2 for r in out["rows"])
  # Without perturbations the server answers as before.
  _, plain = _server(tmp_path)
  assert "email" in json.loads(_call(plain, "get_customer", customer_id=2)[1])


def _partial_run(tmp_path, name, seed, rate, n):
  """`n` three-field update_customer calls on customer 3 under `partial_rate`; for each call the
  result, the fields asked and the row the database holds afterwards (read with sqlite3)."""
  db = str(tmp_path / f"{name}.db")
  mcp_env.write_database(db, mcp_env.generate_world(3))
  app = mcp_server.make_server(db, {"partial_rate": rate, "seed": seed} if rate else None)
  tiers = ("basic", "silver", "gold")
  out = []
  for i in range(n):
    asked = {"email": f"p{i}@partial.test", "city": f"City{i}", "tier": tiers[i % 3]}
    bad, text = _call(app, "update_customer", customer_id=3, **asked)
    assert not bad, text
    con = sqlite3.connect(db)
    row = dict(zip(("email", "city", "tier"), con.execute(
        "SELECT email, city, tier FROM customers WHERE id=3").fetchone()))
    con.close()
    out.append((json.loads(text), asked, row))
  return out


def test_mcp_partial_update_fails_fields_at_the_rate_and_applies_the_rest(tmp_path):
  n, rate = 40, 0.3
  runs = _partial_run(tmp_path, "a", 11, rate, n)
  failed_items, mixed = 0, 0
  prev = dict(zip(("email", "city", "tier"), mcp_env.generate_world(3)["tables"]["customers"][2][2:]))
  for res, asked, row in runs:
    failed = res.get("failed", {})
    assert sorted(res["updated"]) == res["updated"]
    assert set(res["updated"]) | set(failed) == set(asked) and not set(res["updated"]) & set(failed)
    for f in asked:
      if f in failed:  # named with its own error, and not written: the row keeps its old value
        assert failed[f] == mcp_server.PARTIAL_MESSAGE.format(field=f)
        assert row[f] == prev[f]
      else:
        assert row[f] == asked[f]
    assert res["customer"] == {"id": 3, "name": res["customer"]["name"], **row}  # the row as it is
    failed_items += len(failed)
    mixed += 0 < len(failed) < len(asked)
    prev = row
  assert abs(failed_items - 3 * n * rate) < 3.5 * math.sqrt(3 * n * rate * (1 - rate)), failed_items
  assert mixed >= 5  # genuinely partial: some fields of one call fail, the others are written
  # The fields that fail are those of the shared item stream (the web shop's units draw the
  # same way): the same seed gives the same failures, another seed other ones.
  faults = perturb.Faults({"seed": 11, "partial_rate": rate})
  assert [sorted(f for f, bad in zip(("email", "city", "tier"), faults.partial(3)) if bad)
          for _ in range(n)] == [sorted(r.get("failed", {})) for r, _, _ in runs]
  again = _partial_run(tmp_path, "b", 11, rate, n)
  assert [r for r, _, _ in again] == [r for r, _, _ in runs]
  other = _partial_run(tmp_path, "c", 12, rate, 15)
  assert [sorted(r.get("failed", {})) for r, _, _ in other] != \
      [sorted(r.get("failed", {})) for r, _, _ in runs[:15]]


def test_mcp_partial_keeps_real_errors_and_the_plain_result(tmp_path):
  plain = _partial_run(tmp_path, "plain", 0, 0.0, 3)
  for res, asked, row in plain:  # no perturbation: every field written, the result as before
    assert list(res) == ["updated", "customer"] and res["updated"] == ["city", "email", "tier"]
    assert row == asked
  db, app = _server(tmp_path, {"partial_rate": 0.0001, "seed": 1})
  bad, text = _call(app, "update_customer", customer_id=999, city="Oslo")
  assert bad and "customer 999 not found" in text
  taken = mcp_env.generate_world(3)["tables"]["customers"][0][2]
  bad, text = _call(app, "update_customer", customer_id=2, email=taken, city="Oslo")
  assert bad and "UNIQUE" in text  # a real refusal still fails the whole call
  con = sqlite3.connect(db)
  assert con.execute("SELECT city FROM customers WHERE id=2").fetchone()[0] != "Oslo"
  con.close()
  with pytest.raises(ValueError, match="perturb.partial_rate: must be in"):
    mcp_server.check_perturb({"partial_rate": 1.5})


def test_mcp_rate_limit_and_stale_reads(tmp_path):
  _, app = _server(tmp_path, {"rate_limit": 2, "retry_after": 7})
  assert not _call(app, "list_tables")[0] and not _call(app, "list_tables")[0]
  bad, text = _call(app, "list_tables")
  assert bad and "Rate limit exceeded (429)" in text and "retry after 7 s" in text
  _, stale = _server(tmp_path, {"stale_refresh": 0})
  city = json.loads(_call(stale, "get_customer", customer_id=1)[1])["city"]
  bad, text = _call(stale, "update_customer", customer_id=1, city="Atlantis")
  assert not bad and json.loads(text)["customer"]["city"] == "Atlantis"  # the write happened
  assert json.loads(_call(stale, "get_customer", customer_id=1)[1])["city"] == city  # stale
  _, fresh = _server(tmp_path)
  assert json.loads(_call(fresh, "get_customer", customer_id=1)[1])["city"] == "Atlantis"


def test_mcp_side_file_sets_each_episodes_perturbations(tmp_path):
  db, app = _server(tmp_path)
  mcp_server.write_perturb_file(db, perturb.real_options("rate_limit:limit=1", "mcp", seed=1))
  assert not _call(app, "list_tables")[0] and _call(app, "list_tables")[0]
  # Rewritten for the next episode: the counts start afresh.
  mcp_server.write_perturb_file(db, perturb.real_options("rate_limit:limit=1", "mcp", seed=2))
  assert not _call(app, "list_tables")[0]
  with pytest.raises(ValueError, match="perturb.error_rate: must be in"):
    mcp_server.write_perturb_file(db, {"error_rate": 2})
  with open(mcp_server.perturb_file(db), "w") as f:  # written by hand, badly
    f.write('{"error_rate": 2}')
  bad, text = _call(app, "list_tables")
  assert bad and "perturb.json.error_rate: must be in [0, 1]" in text
  mcp_server.write_perturb_file(db, None)  # no perturbation any more
  assert not os.path.exists(mcp_server.perturb_file(db))
  assert not _call(app, "list_tables")[0] and not _call(app, "list_tables")[0]


def test_mcp_server_cli_rejects_bad_perturb(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "lwm_jax.envs.mcp.server", "--db",
                         str(tmp_path / "x.db"), "--perturb", '{"error_kind": "boom"}'],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and "--perturb.error_kind: must be one of" in proc.stderr


def test_mcp_server_perturb_flag_over_stdio(tmp_path):
  """The real server started as McpEnv starts it, with --perturb, seen by the mcp client."""
  from mcp.client.session import ClientSession
  from mcp.client.stdio import StdioServerParameters, stdio_client
  db = str(tmp_path / "shop.db")
  mcp_env.write_database(db, mcp_env.generate_world(1))
  params = StdioServerParameters(
      command=sys.executable, args=["-m", "lwm_jax.envs.mcp.server", "--db", db, "--perturb",
                                    json.dumps({"page_size": 2, "rate_limit": 2})],
      env={**os.environ, "PYTHONPATH": lwm_jax.child_pythonpath()})

  async def session():
    with open(tmp_path / "server.log", "w") as errlog:
      async with stdio_client(params, errlog=errlog) as (r, w):
        async with ClientSession(r, w) as s:
          await s.initialize()
          return [await s.call_tool("query", {"sql": "SELECT id FROM customers ORDER BY id"})
                  for _ in range(3)]

  first, _, third = asyncio.run(asyncio.wait_for(session(), 60))
  out = json.loads(first.content[0].text)
  assert not first.is_error and out["rows"] == [[1], [2]] and out["truncated"]
  assert third.is_error and "Rate limit exceeded (429)" in third.content[0].text
