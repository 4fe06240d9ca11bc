"""Generated worlds of the text environments (terminal, swe, search): seeded, deterministic, varied
and internally consistent, checked against the world itself (and, for swe, against real pytest)."""
import ast
import csv
import io
import re
import sqlite3
import sys

import pytest

from lwm_jax.envs import base
from lwm_jax.envs.search import env as search
from lwm_jax.envs.search import worlds as search_worlds
from lwm_jax.envs.swe import worlds as swe_worlds
from lwm_jax.envs.terminal import worlds as terminal_worlds
from lwm_jax.envs.search.env import SearchEnv
from lwm_jax.envs.terminal.env import TerminalEnv

SEEDS = range(40)


# -- terminal ---------------------------------------------------------------------------------------
def test_terminal_worlds_differ_by_seed_and_repeat_per_seed():
  a, b = terminal_worlds.generate_world(1), terminal_worlds.generate_world(2)
  assert base.world_id("terminal", a) != base.world_id("terminal", b)
  assert sorted(a["files"]) != sorted(b["files"])  # the names differ, not only the values
  assert terminal_worlds.generate_world(1) == a
  names = {p for s in SEEDS for p in terminal_worlds.generate_world(s)["files"]}
  assert len(names) > 100


@pytest.mark.parametrize("names", terminal_worlds.NAMES)
def test_terminal_world_is_consistent(names):
  for s in SEEDS:
    w = terminal_worlds.generate_world(s, names)
    files, lay = w["files"], w["layout"]
    assert terminal_worlds.check_consistent(w) == [], s
    for key in ("log", "sales", "users_csv", "todo"):
      assert lay[key] in files, (s, key)
    # Every function the layout lists is defined in its file (read with Python's own parser),
    # and every import of the main script names a module and function of this tree.
    for func, path in lay["functions"].items():
      defs = {n.name for n in ast.parse(files[path]).body if isinstance(n, ast.FunctionDef)}
      assert func in defs, (s, func, path)
    for path, text in files.items():
      if path.endswith(".py"):
        for node in ast.parse(text).body:
          if isinstance(node, ast.ImportFrom):
            mod = f"{lay['src']}/{node.module}.py"
            assert mod in files and all(f"def {a.name}(" in files[mod] for a in node.names), (s, path)
    rows = list(csv.DictReader(io.StringIO(files[lay["sales"]])))
    assert sorted({r["region"] for r in rows}) == lay["regions"] and all(r[lay["amount"]].isdigit() for r in rows)
    assert any(p.startswith(lay["notes"] + "/") and p.endswith(".txt") for p in files)
    for line in files[lay["log"]].splitlines():
      user = line.split()[3].split("=")[1] if lay["log_format"] == "keyvalue" else line.split()[2].strip("[]")
      assert user.isalpha() and user in files[lay["log"]], (s, line)


def test_terminal_reset_builds_the_world_and_repeats(tmp_path):
  env = TerminalEnv(root=str(tmp_path), time_limit=2.0)
  try:
    first = env.reset(7)
    wid = env.world_id
    listing = env.step("find . -type f | sed 's|^./||' | sort")
    assert listing.splitlines()[:-1] == sorted(terminal_worlds.generate_world(7)["files"])
    task = env.goal
    assert env.reset(7) == first and env.world_id == wid and env.goal == task
    assert env.reset(8) != first and env.world_id != wid
  finally:
    env.close()


def test_terminal_made_up_names_keep_the_contents_and_leave_the_usual_pools():
  """`names="made_up"`: the same world's contents under made-up directory and file names, none
  from the usual pools, far more varied than them; repeatable per seed."""
  top = lambda w: {p.split("/")[0] for p in w["files"] if "/" in p}  # noqa: E731
  usual_dirs, made_dirs = set(), set()
  for s in SEEDS:
    u, m = terminal_worlds.generate_world(s), terminal_worlds.generate_world(s, "made_up")
    assert terminal_worlds.generate_world(s, "made_up") == m
    assert len(m["files"]) == len(u["files"]) and m["files"]["README.md"] != u["files"]["README.md"]
    for key in ("log", "sales", "users_csv", "todo"):   # same text, another path
      assert m["files"][m["layout"][key]] == u["files"][u["layout"][key]], (s, key)
      assert m["layout"][key] != u["layout"][key], (s, key)
    for role in ("data", "src", "notes"):                # the README names the made-up places
      assert f"{m['layout'][role]}/" in m["files"]["README.md"], (s, role)
    usual_dirs |= top(u)
    made_dirs |= top(m)
  assert not usual_dirs & made_dirs
  assert len(made_dirs) > 5 * len(usual_dirs)
  with pytest.raises(ValueError, match="expected one of usual, made_up, got 'odd'"):
    terminal_worlds.generate_world(1, "odd")


def test_terminal_env_made_up_names_and_collect_options(tmp_path):
  from lwm_jax.envs import collect
  env = TerminalEnv(root=str(tmp_path), time_limit=2.0, names="made_up")
  try:
    env.reset(7)
    listing = env.step("find . -type f | sed 's|^./||' | sort")
    assert listing.splitlines()[:-1] == sorted(terminal_worlds.generate_world(7, "made_up")["files"])
    assert env.episode_meta()["names"] == "made_up"
  finally:
    env.close()
  trajs, _ = collect.collect("terminal", 1, seed=3, workers=1, progress=False,
                             env_options={"names": "made_up"})
  world = terminal_worlds.generate_world(trajs[0].meta["seed"], "made_up")
  assert trajs[0].meta["names"] == "made_up"
  assert trajs[0].meta["world"] == base.world_id("terminal", world)
  with pytest.raises(ValueError, match="environment 'mcp' options {'names': 'made_up'}"):
    collect.collect("mcp", 1, workers=1, progress=False, env_options={"names": "made_up"})
  with pytest.raises(ValueError, match="TerminalEnv names"):
    TerminalEnv(names="odd")
  with pytest.raises(ValueError, match="TerminalEnv task: expected one of count_errors, .*tour"):
    TerminalEnv(task="odd")


def test_terminal_tour_task_lists_every_directory_and_its_verdict():
  """`task="tour"` (asked for, never drawn): the scripted agent lists every directory, and the
  transcript verdict gives full credit for it, partial credit when a listing is cut."""
  from lwm_jax.data.schema import Turn
  from lwm_jax.envs import collect, verify_transcript
  options = {"names": "made_up", "task": "tour"}
  trajs, _ = collect.collect("terminal", 2, seed=5, workers=1, progress=False, env_options=options)
  env = TerminalEnv(time_limit=2.0, **options)
  try:
    for t in trajs:
      world = terminal_worlds.generate_world(t.meta["seed"], "made_up")
      dirs = sorted({p.rsplit("/", 1)[0] for p in world["files"] if "/" in p})
      assert t.meta["task_kind"] == "tour" and t.task.startswith("List the files of every")
      assert sum(u.action.split()[0] == "ls" and u.action.split()[-1] in dirs for u in t.turns) >= len(dirs)
      verdict = verify_transcript.check_trajectory(t, env)
      assert verdict.success and verdict.credit == 1.0, verdict
      cut = [Turn(u.action, u.observation.split("  ")[0] if u.action.split()[-1] == dirs[0] else
                  u.observation) for u in t.turns]
      partial = verify_transcript.check_transcript("terminal", t.meta["seed"], cut, env)
      assert not partial.success and partial.credit == pytest.approx((len(dirs) - 1) / len(dirs))
  finally:
    env.close()


# -- swe --------------------------------------------------------------------------------------------
def test_swe_worlds_differ_by_seed_and_repeat_per_seed():
  a, b = swe_worlds.generate_world(3), swe_worlds.generate_world(4)
  assert base.world_id("swe", a.to_json()) != base.world_id("swe", b.to_json())
  assert swe_worlds.generate_world(3) == a
  bugs = {(w.func, w.bad) for w in map(swe_worlds.generate_world, SEEDS)}
  assert len(bugs) > 25  # far more than a handful of fixed bug variants


def test_swe_world_tests_reference_existing_functions():
  for s in SEEDS:
    repo = swe_worlds.generate_world(s)
    assert swe_worlds.check_consistent(repo) == [], s
    defined = {}
    for path, text in repo.files.items():
      if path.startswith(repo.package + "/"):
        mod = path[:-3].replace("/", ".")
        defined[mod] = {n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    for path, text in repo.files.items():
      if not path.startswith("tests/test_"):
        continue
      tree = ast.parse(text)
      imported = {}
      for node in tree.body:
        if isinstance(node, ast.ImportFrom):
          assert node.module in defined, (s, path, node.module)
          for a in node.names:
            assert a.name in defined[node.module], (s, path, a.name)
            imported[a.name] = node.module
      calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
      assert calls and calls <= set(imported), (s, path, calls - set(imported))
    assert repo.files[repo.path].count(repo.bad) == 1 and repo.good not in repo.files[repo.path]
    assert f"def {repo.test}(" in repo.files[repo.test_path]


def test_swe_bug_fails_only_its_test_and_the_fix_passes(tmp_path):
  # Real pytest on a generated repository, with the bug and after the fix.
  repo = swe_worlds.generate_world(5)
  assert swe_worlds.check_with_pytest(repo, str(tmp_path), sys.executable) == []


# -- search -----------------------------------------------------------------------------------------
def _world(s):
  return search_worlds.generate_world(s, tuple(search.MODULES))


def test_search_worlds_differ_by_seed_and_repeat_per_seed():
  a, b = _world(1), _world(2)
  assert base.world_id("search", a) != base.world_id("search", b)
  assert a["modules"] != b["modules"] and a["wiki"] != b["wiki"]
  assert _world(1) == a


def test_search_wiki_cross_references_resolve_and_dates_agree():
  for s in SEEDS:
    w = _world(s)
    assert search_worlds.check_consistent(w) == [], s
    docs = {d[0]: d[2] for d in w["wiki"]}
    refs = [(i, ref) for i, body in docs.items() for ref in re.findall(r"\[([a-z]+/[^\]\s]+)\]", body)]
    assert refs and all(ref in docs for _, ref in refs), [r for r in refs if r[1] not in docs]
    for i, body in docs.items():
      own = re.search(r"\d{4}-\d\d-\d\d", body)
      if i.startswith("releases/"):
        project = re.search(r"Project: \[(\S+)\]", docs[i]).group(1)
        assert f"[{i}]" in docs[project]  # the project lists its release
        start = re.search(r"Started: (\S+)", docs[project]).group(1)
        assert start < own.group(0)
        req = re.search(r"Requires .* \[(\S+)\]", body)
        if req:
          assert re.search(r"\d{4}-\d\d-\d\d", docs[req.group(1)]).group(0) <= own.group(0)
      if i.startswith("projects/"):
        lead = re.search(r"Lead: .* \[(\S+)\]", body).group(1)
        assert f"[{i}]" in docs[lead]  # the lead's page names the project


def test_search_reset_indexes_exactly_the_world(tmp_path):
  env = SearchEnv(root=str(tmp_path))
  try:
    first = env.reset(12)
    w, wid = env.world, env.world_id
    con = sqlite3.connect(env.path)
    ids = [r[0] for r in con.execute("SELECT doc_id FROM docs")]
    con.close()
    wiki = {d[0] for d in w["wiki"]}
    mods = set(w["modules"])
    assert wiki <= set(ids) and mods <= set(ids)
    assert all(i in wiki or i in mods or i.rsplit(".", 1)[0] in mods for i in ids)
    assert env.goal["target"] in ids
    assert env.reset(12) == first and env.world_id == wid
    assert env.reset(13) != first and env.world_id != wid
  finally:
    env.close()
