"""Real text environments: terminal (bash), mcp (stdio server), search (FTS5), swe (git + pytest)."""
import json
import os
import random
import sqlite3
import subprocess

import pytest

from lwm_jax.envs import base, recorder
from lwm_jax.envs.mcp import server as mcp_server
from lwm_jax.envs.search import env as search
from lwm_jax.envs.swe import env as swe
from lwm_jax.envs.terminal import env as terminal


def _snapshot(path):
  out = {}
  for d, _, files in os.walk(path):
    for f in files:
      p = os.path.join(d, f)
      out[p] = os.stat(p).st_mtime_ns
  return out


# -- terminal ---------------------------------------------------------------------------------------
def test_terminal_matches_real_bash_and_persists(tmp_path):
  os.makedirs(tmp_path / "sb")
  outside = tmp_path / "outside.txt"
  outside.write_text("keep\n")
  before = _snapshot(tmp_path)
  env = terminal.TerminalEnv(root=str(tmp_path / "sb"), time_limit=1.5)
  try:
    init = env.reset(3)
    assert init.endswith("@sandbox:~# ") or init.endswith("@sandbox:~$ ")
    # Independent reference: the same pipeline run by a separate bash on the sandbox file.
    log = env.layout["log"]
    ref = subprocess.run(["bash", "-c", f"grep -c ERROR {log}"], cwd=env.home,
                         capture_output=True, text=True).stdout
    obs = env.step(f"grep -c ERROR {log}")
    assert obs.startswith(ref)
    log_dir = log.rsplit("/", 1)[0]
    assert env.step(f"cd {log_dir}").endswith(f":~/{log_dir}# ") or env.cwd.endswith("/" + log_dir)
    assert env.step("pwd").startswith(f"/home/user/{log_dir}\n")
    assert "No such file or directory" in env.step("cat nothere.txt")
    assert "command not found" in env.step("sl")
    assert env.step("date").startswith("Sat Jun  1 09:06:00 UTC 2024")
    obs = env.step("sleep 20")
    assert "time limit" in obs
    assert env.step("echo ok").startswith("ok\n")
    env.step("cd ~ && echo hi > new.txt && mkdir -p d/e")
    assert os.path.exists(os.path.join(env.home, "new.txt"))
  finally:
    env.close()
  after = _snapshot(tmp_path)
  assert after == before  # sandbox removed, nothing else touched
  assert outside.read_text() == "keep\n"


def test_terminal_episode_is_deterministic():
  a = recorder.record("terminal", 11, "t")
  b = recorder.record("terminal", 11, "t")
  assert a.to_dict() == b.to_dict()
  assert 3 <= len(a.turns) <= 30


# -- mcp --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mcp_env():
  env = base.make_env("mcp")
  yield env
  env.close()


def test_mcp_real_server_tools_and_errors(mcp_env, tmp_path):
  mcp_env.reset(5)
  space = mcp_env.describe().action_space
  assert '"query"' in space and "inputSchema" in space
  # Reference: the same query run directly with sqlite3 on the database file.
  con = sqlite3.connect(mcp_env.db_path)
  n = con.execute("SELECT COUNT(*) FROM customers").fetchone()[0]
  con.close()
  out = json.loads(mcp_env.step(json.dumps({"tool": "query", "arguments": {"sql": "SELECT COUNT(*) FROM customers"}})))
  assert out["rows"] == [[n]]
  bad_sql = mcp_env.step(json.dumps({"tool": "query", "arguments": {"sql": "SELECT nope FROM customers"}}))
  assert json.loads(bad_sql)["isError"] and "no such column: nope" in bad_sql
  fk = mcp_env.step(json.dumps({"tool": "create_order", "arguments": {"customer_id": 999, "product_id": 1, "quantity": 1}}))
  assert "FOREIGN KEY constraint failed" in fk
  bad_arg = mcp_env.step(json.dumps({"tool": "get_customer", "arguments": {"customer_id": "abc"}}))
  assert json.loads(bad_arg)["isError"]
  assert "Parse error" in mcp_env.step("{not json")
  assert "Unknown tool" in mcp_env.step(json.dumps({"tool": "drop_everything", "arguments": {}}))


def test_mcp_reset_isolates_episodes_and_is_deterministic(mcp_env):
  a = recorder.record("mcp", 42, "m", env=mcp_env)
  recorder.record("mcp", 7, "other", env=mcp_env)
  b = recorder.record("mcp", 42, "m", env=mcp_env)
  assert a.to_dict() == b.to_dict()
  for t in a.turns:
    call = json.loads(t.action) if t.action.startswith("{\"") else None
    if call:
      assert call["tool"] in a.meta["declared_tools"]


# -- search -----------------------------------------------------------------------------------------
def _search_seed_with(*modules):
  """The first world seed whose collection indexes the standard-library `modules`."""
  return next(s for s in range(1000)
              if set(modules) <= set(search.search_worlds.generate_world(s, tuple(search.MODULES))["modules"]))


def test_search_bm25_pagination_and_errors():
  env = search.SearchEnv()
  try:
    env.reset(_search_seed_with("itertools", "json"))
    obs = env.step('search(query="permutations")')
    assert "[itertools.permutations]" in obs.split("\n\n")[1]  # best hit first
    m = env.search("iterator", 1)
    total = int(m.split(" of ")[1].split(" ")[0])
    # Independent count with a plain FTS5 query on the index file.
    con = sqlite3.connect(env.path)
    assert total == con.execute("SELECT COUNT(*) FROM docs WHERE docs MATCH '\"iterator\"'").fetchone()[0]
    con.close()
    assert "(page 2 of" in env.step('search(query="iterator", page=2)')
    assert env.step('search(query="zzqxw frobnicate")').startswith("No results")
    assert "past the last page" in env.step('search(query="permutations", page=50)')
    assert env.step('open(doc_id="json.dumps")').startswith("[json.dumps] page 1 of")
    assert "no document" in env.step('open(doc_id="json.nothing")')
    assert env.step("find(x)").startswith("Error: unknown action 'find'")
  finally:
    env.close()
  a, b = recorder.record("search", 9, "s"), recorder.record("search", 9, "s")
  assert a.to_dict() == b.to_dict() and len(a.turns) >= 3


# -- swe --------------------------------------------------------------------------------------------
def test_swe_real_repo_failing_test_fix_and_sandbox(tmp_path):
  os.makedirs(tmp_path / "sb")
  before = _snapshot(tmp_path)
  env = swe.SweEnv(root=str(tmp_path / "sb"))
  try:
    env.reset(0)
    g = env.goal
    out = env.step("run_tests()")
    assert "1 failed" in out and g["test"] in out and "[exit code 1]" in out
    assert "not found" in env.step(f"edit(path={g['path']!r}, old='no such text', new='x')")
    assert "outside the repository" in env.step('view(path="../../etc/passwd")')
    assert "does not exist" in env.step('view(path="nothere.py")')
    assert env.step(swe.repr_edit(g["path"], g["bad"], g["good"])).startswith("Edited")
    out = env.step("run_tests()")
    assert f"{len(env.world.tests)} passed in 0.01s" in out and "[exit code 0]" in out
    diff = env.step("diff()")
    # Reference: git itself on the sandbox repository (owned by the sandbox uid, hence safe.directory).
    ref = subprocess.run(["git", "-c", "safe.directory=*", "diff", "--stat"], cwd=env.repo, capture_output=True, text=True).stdout
    assert "1 file changed" in ref and diff.startswith("diff --git a/" + g["path"])
  finally:
    env.close()
  assert _snapshot(tmp_path) == before


def test_swe_deterministic():
  a, b = recorder.record("swe", 4, "w"), recorder.record("swe", 4, "w")
  assert a.to_dict() == b.to_dict()
  assert a.initial_state == b.initial_state and "HEAD" in a.initial_state
