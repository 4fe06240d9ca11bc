"""What the text environments report about each step (issue 69): `Env.step_error` from their own
machinery (exit status, JSON-RPC error, a refused call), `Env.state_digest` for state changes,
the recorder keeping both per turn, and each domain's `error` rule (the text an error shows)
agreeing with the signal on real episodes. The GUI domains' facts: tests/test_env_facts_gui.py."""
import json

import pytest

from lwm_jax import domains
from lwm_jax.data import schema
from lwm_jax.envs import base, recorder
from lwm_jax.envs.mcp import env as mcp
from lwm_jax.envs.search import env as search
from lwm_jax.envs.swe import env as swe
from lwm_jax.envs.terminal import env as terminal


def _step(env, action):
  """(observation, step_error, changed) of one step, as the recorder sees it."""
  before = env.state_digest()
  env.step_error = "stale"  # every step must set it afresh
  obs = env.step(action)
  return obs, env.step_error, env.state_digest() != before


def test_terminal_reports_exit_status_time_limit_and_file_changes(tmp_path):
  env = terminal.TerminalEnv(root=str(tmp_path), time_limit=1.0)
  try:
    env.reset(3)
    log = env.layout["log"]
    cases = [  # action, error expected, changed expected
        (f"grep -c ERROR {log}", False, False),
        ("cat nothere.txt", True, False),          # cat: exit 1 with its message
        ("grep -q NOTINTHELOG " + log, False, False),  # status 1 of grep is an answer
        ("grep -q x missing.txt", True, False),     # status 2 of grep is an error
        ("[ -f nothere.txt ] && echo yes", False, False),
        ("ls nothere | wc -l", False, False),       # the shell reports the pipeline's last status
        ("sl", True, False),                         # command not found: 127
        ("echo hi > new.txt", False, True),
        ("cd /tmp", False, False),                   # the shell's directory is not the world
        ("cd ~ && rm new.txt", False, True),
        ("sleep 5", True, False),
    ]
    for action, err, changed in cases:
      obs, got, moved = _step(env, action)
      assert bool(got) == err, (action, got, obs)
      assert moved == changed, action
    assert got == "killed by the time limit"
    assert _step(env, "cat nothere.txt")[1] == "exit status 1"
  finally:
    env.close()


def test_search_fails_only_with_error_answers_and_changes_nothing():
  env = search.SearchEnv()
  try:
    env.reset(2)
    for action, err in (('search(query="list")', False), ('search(query="zzzzqqq")', False),
                        ('open(doc_id="nope")', True), ('search(query="")', True),
                        ('search(query="list", page=999)', True), ("frobnicate()", True)):
      obs, got, moved = _step(env, action)
      assert bool(got) == err and not moved, (action, got)
      assert bool(search.error(obs)) == err, obs
  finally:
    env.close()


def test_swe_refusals_and_pytest_usage_errors_are_errors_failing_tests_are_not(tmp_path):
  env = swe.SweEnv(root=str(tmp_path))
  try:
    env.reset(1)
    g = env.goal
    cases = [("run_tests()", False, False),               # tests fail: an answer (exit code 1)
             ('view(path="nothere.py")', True, False),
             ('ls(path="nothere")', True, False),
             ('search(pattern="def (")', True, False),     # git refuses the pattern
             ('run_tests(target="tests/test_nothere.py")', True, False),  # pytest exit code 4
             (swe.repr_edit(g["path"], "NOT IN THE FILE", "x"), True, False),
             (swe.repr_edit(g["path"], g["bad"], g["good"]), False, True),
             ("run_tests()", False, False),
             ("diff()", False, False)]
    for action, err, changed in cases:
      obs, got, moved = _step(env, action)
      assert bool(got) == err, (action, got, obs)
      assert moved == changed, action
      assert bool(swe.error(obs)) == err, obs
    assert obs.startswith("diff --git")
  finally:
    env.close()


@pytest.fixture(scope="module")
def mcp_env():
  env = mcp.McpEnv()
  yield env
  env.close()


def test_mcp_reports_rpc_errors_tool_errors_partial_writes_and_row_changes(mcp_env):
  env = mcp_env
  env.reset(4)
  customer = env.world["tables"]["customers"][0][0]
  cases = [("not json", "JSON-RPC error -32700", False),
           ('{"tool": 3}', "JSON-RPC error -32600", False),
           ('{"tool": "list_tables", "arguments": []}', "JSON-RPC error -32602", False),
           ('{"tool": "list_tables", "arguments": {}}', "", False),
           ('{"tool": "update_customer", "arguments": {"customer_id": 999999, "city": "Oslo"}}',
            "tool error (isError)", False),
           (json.dumps({"tool": "update_customer", "arguments": {"customer_id": customer,
                                                               "city": "Tromso"}}), "", True)]
  for action, err, changed in cases:
    obs, got, moved = _step(env, action)
    assert got == err and moved == changed, (action, got, obs)
    assert mcp.error(obs) == err, obs
  env.set_perturb("partial:rate=1.0")
  try:
    env.reset(4)
    obs, got, moved = _step(env, json.dumps({"tool": "update_customer", "arguments": {
        "customer_id": customer, "city": "Bergen"}}))
    assert got == "partial failure: city" == mcp.error(obs) and not moved, obs
  finally:
    env.set_perturb(None)


@pytest.mark.parametrize("name,episodes", [
    ("terminal", 12), ("search", 10), ("mcp", 10),
    pytest.param("swe", 5, marks=pytest.mark.slow)])  # swe runs git and pytest per turn: 20 s
def test_the_error_rule_reads_real_episodes_as_the_environment_reported_them(name, episodes):
  """On recorded episodes (every turn carries the env's own facts), the domain's `error` rule
  finds an error in exactly the observations whose step the environment reported as failed."""
  read = domains.get_domain(name).load("error")
  env = base.make_env(name)
  errors = turns = 0
  try:
    for i in range(episodes):
      t = recorder.record(name, recorder.episode_seed(11, i), f"{name}-{i}", env=env)
      assert t.meta["env_version"] == recorder.ENV_VERSION
      for k, turn in enumerate(t.turns):
        assert set(turn.env) == {"error", "changed"}, turn.env
        assert bool(read(turn.observation)) == bool(turn.env["error"]), (
            t.id, k, turn.action, turn.env, turn.observation[:400])
        errors += bool(turn.env["error"])
        turns += 1
  finally:
    env.close()
  assert errors >= 2 and errors < turns  # the scripted agents make mistakes, not only mistakes


def test_turn_facts_survive_a_jsonl_round_trip(tmp_path):
  t = schema.Trajectory(id="a", domain="terminal", task="t", action_space="s", initial_state="i",
                        turns=[schema.Turn("ls", "x\n", {"error": "", "changed": False}),
                               schema.Turn("cat y", "cat: y: No such file or directory\n",
                                           {"error": "exit status 1", "changed": False}),
                               schema.Turn("pwd", "/home/user\n")])
  path = tmp_path / "t.jsonl"
  schema.write_jsonl(path, [t])
  back = next(schema.read_jsonl(path))
  assert [x.env for x in back.turns] == [x.env for x in t.turns]
  assert "env" not in json.loads(path.read_text())["turns"][2]  # no fact, no key
  with pytest.raises(ValueError, match=r"turns\[0\]\.env must be an object"):
    schema.Trajectory.from_dict(dict(t.to_dict(), turns=[{"action": "a", "observation": "b",
                                                         "env": "oops"}]))
