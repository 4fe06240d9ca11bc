"""Hygiene: declared tools from what the corpus writes, retry cycles, missing starting states."""
from lwm_jax.data import hygiene
from lwm_jax.data.schema import Trajectory, Turn


def _traj(domain, turns, action_space="", meta=None, initial_state="start", tid="t"):
  return Trajectory(id=tid, domain=domain, task="do it", action_space=action_space,
                    initial_state=initial_state, turns=[Turn(a, o) for a, o in turns],
                    meta=meta or {})


def _call(name):
  return '{"tool": "%s", "arguments": {}}' % name


def test_declared_tools_come_from_meta_declared_tools():
  # The environment recorder writes meta["declared_tools"]; the action space is prose that happens
  # to name a tool the trajectory must not call.
  prose = "Call one tool per turn. The admin tool drop_db exists on the server but is not offered."
  bad = _traj("mcp", [(_call("list_tables"), "[]"), (_call("drop_db"), "ok")], prose,
              {"declared_tools": ["list_tables", "query"]})
  good = _traj("mcp", [(_call("list_tables"), "[]"), (_call("query"), "[]")],
               "Call one tool per turn.", {"declared_tools": ["list_tables", "query"]})
  assert hygiene.declared_tools(bad) == {"list_tables", "query"}
  rep = hygiene.HygieneReport()
  assert hygiene.filter_trajectories([bad, good], rep) == [good]
  assert dict(rep.dropped) == {"undeclared_tool": 1}


def test_meta_tools_is_the_fallback():
  t = _traj("mcp", [(_call("a"), "1"), (_call("b"), "2")], "",
            {"tools": [{"name": "a"}, {"function": {"name": "b"}}]})
  assert hygiene.declared_tools(t) == {"a", "b"}
  assert not hygiene.calls_undeclared_tool(t)


def test_prose_mention_is_not_a_declaration():
  space = "Tools: read_file(path), run_tests(). Never use delete_repo, it is disabled."
  assert hygiene.declared_tools(_traj("swe", [], space)) == {"read_file", "run_tests"}
  bad = _traj("swe", [('read_file("a.py")', "x = 1"), ("delete_repo()", "deleted")], space)
  ok = _traj("swe", [('read_file("a.py")', "x = 1"), ("run_tests()", "1 passed")], space)
  assert hygiene.calls_undeclared_tool(bad) and not hygiene.calls_undeclared_tool(ok)


def test_retry_cycles_keep_the_first_try_and_are_counted():
  missing = "cat: notes.txt: No such file or directory"
  turns = [("cat notes.txt", missing), ("cat notes.txt", missing), ("ls", "a.txt"),
           ("cat notes.txt", missing), ("ls", "a.txt"), ("cat a.txt", "hello")]
  t = _traj("terminal", turns)
  rep = hygiene.HygieneReport()
  (kept,) = hygiene.filter_trajectories([t], rep)
  # Two repeats of the same failure go; the repeated successful `ls` is real data and stays.
  assert [(x.action, x.observation) for x in kept.turns] == [
      ("cat notes.txt", missing), ("ls", "a.txt"), ("ls", "a.txt"), ("cat a.txt", "hello")]
  assert dict(rep.turns_dropped) == {"retry_cycle": 2}
  assert kept.meta["retry_turns_dropped"] == 2
  # The same action with a different failure is not a cycle (the state moved on).
  t2 = _traj("terminal", [("make", "make: *** [all] Error 1"), ("make", "make: *** [all] Error 2")])
  assert hygiene.drop_retry_cycles(t2)[1] == 0


def test_failure_reading():
  for obs in ["ls: cannot access 'x': No such file or directory", "bash: foo: command not found",
              "Traceback (most recent call last):\n  ...", '{"isError": true, "content": "no"}',
              '{"error": {"code": -32700}}', "Error: no document with id 'x'.",
              "..F.\n=== FAILURES ===\n"]:
    assert hygiene.is_failure(obs), obs
  for obs in ["2024-05-31T08:00:00Z ERROR [carol] request served", "a.txt\nb.txt", ""]:
    assert not hygiene.is_failure(obs), obs


def test_missing_starting_state_is_dropped():
  turns = [("ls", "a"), ("pwd", "/home")]
  blank = _traj("terminal", turns, initial_state="  \n", tid="blank")
  imported = _traj("terminal", turns, initial_state="", tid="imported",
                   meta={"system_str": "You are a shell. Files: a"})
  rep = hygiene.HygieneReport()
  assert [t.id for t in hygiene.filter_trajectories([blank, imported], rep)] == ["imported"]
  assert dict(rep.dropped) == {"missing_initial_state": 1}
