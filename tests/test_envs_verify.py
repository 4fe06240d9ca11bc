"""Task verifiers: each goal kind of each environment on a solved episode (the scripted agent's
run on a seed where it does the task) and an unsolved one (stopped after its first action, or a
wrong final answer), in real-state mode and from the transcript alone."""
from __future__ import annotations

import csv
import glob
import gzip
import io
import json
import os
import random

import pytest

from lwm_jax.envs import base, recorder, ui, verify
from lwm_jax.envs.verify_transcript import check_trajectory, check_transcript, solved_turns
from lwm_jax.envs.terminal import verify as terminal_verify

# (domain, goal kind, seed): the first seed of each kind (a kind with a suffix is a variant of
# it: the quantity exceeds the stock, the email is taken, the order was already refunded).
CASES = [
    ("terminal", "sum_region", 0), ("terminal", "rename_notes", 4), ("terminal", "find_def", 5),
    ("terminal", "count_errors", 6), ("terminal", "backup_csv", 7), ("terminal", "top_users", 15),
    ("swe", "fix", 0),
    ("search", "stdlib", 0), ("search", "wiki", 2),
    ("web", "cheapest", 0), ("web", "buy", 4), ("web", "account", 5), ("web", "buy/nostock", 35),
    ("android", "alarm", 0), ("android", "delete_contact", 4), ("android", "settings", 5),
    ("android", "add_contact", 6), ("android", "note", 7),
    ("os", "mkdir", 0), ("os", "theme", 4), ("os", "rename", 5), ("os", "edit", 6), ("os", "delete", 7),
    ("mcp", "order", 0), ("mcp", "update", 4), ("mcp", "refund", 5), ("mcp", "lookup", 6),
    ("mcp", "report", 7), ("mcp", "update/taken", 20), ("mcp", "order/nostock", 38),
    ("mcp", "refund/refunded", 41),
]
_IDS = [f"{d}-{k}-{s}" for d, k, s in CASES]


_STOPPED = [c for c in CASES if c[1] != "refund/refunded"]  # that order needs no action at all


@pytest.fixture(scope="module")
def envs():
  """envs(name, slot=0): one env per (domain, slot), closed when the module ends."""
  made: dict[tuple[str, int], base.Env] = {}

  def get(name: str, slot: int = 0) -> base.Env:
    if (name, slot) not in made:
      made[name, slot] = base.make_env(name)
    return made[name, slot]
  yield get
  for e in made.values():
    e.close()


def play(env: base.Env, seed: int, max_turns: int = 30) -> list:
  traj = recorder.run_episode(env, base.make_agent(env.domain, random.Random(seed)), seed, "t",
                              max_turns=max_turns)
  return [(t.action, t.observation) for t in traj.turns]


@pytest.mark.parametrize("domain,kind,seed", CASES, ids=_IDS)
def test_scripted_agent_solves_and_both_modes_agree(envs, domain, kind, seed):
  env = envs(domain)
  turns = play(env, seed)
  assert env.goal.get("kind", "fix") == kind.split("/")[0]  # swe has one kind of task
  v = verify.check(env, turns)
  assert v.success and v.credit == 1.0, v.reason
  # From the transcript alone (the world re-created by a reset of the same env, nothing replayed).
  t = check_transcript(domain, seed, turns, env=env)
  assert t.success and t.credit == 1.0, t.reason


@pytest.mark.parametrize("domain,kind,seed", _STOPPED, ids=[f"{d}-{k}-{s}" for d, k, s in _STOPPED])
def test_stopped_after_first_action_fails(envs, domain, kind, seed):
  env = envs(domain)
  turns = play(env, seed, max_turns=1)
  v = verify.check(env, turns)
  assert not v.success and v.credit < 1.0, (v, turns)
  t = check_transcript(domain, seed, turns, env=env)
  assert not t.success and t.credit < 1.0, (t, turns)


def test_terminal_answer_is_the_last_lone_number(envs):
  env = envs("terminal")
  turns = play(env, 0)
  lay = env.layout
  rows = list(csv.DictReader(io.StringIO(env.files[lay["sales"]])))
  total = sum(int(r[lay["amount"]]) for r in rows if r["region"] == env.goal["region"])
  assert verify.check(env, turns).success
  wrong = turns + [("echo 123456789", env.step("echo 123456789"))]
  v = verify.check(env, wrong)
  assert not v.success and v.reason == f"answer 123456789, total {total}"
  # A later command with more than one line of output is not an answer; the last lone number is.
  right = wrong + [(f"echo {total}", env.step(f"echo {total}")), ("ls", env.step("ls"))]
  assert verify.check(env, right).success


def test_terminal_report_checked_in_the_sandbox(envs):
  env = envs("terminal")
  turns = play(env, 6)
  # The real shell's count is the reference.
  out = env.step(f"grep -c ERROR {env.layout['log']}")
  n = int(terminal_verify.shell_output(out)[0])
  v = verify.check(env, turns)
  assert v.success and f"the log has {n} ERROR lines" in v.reason
  env.step(f"echo {n + 1} > report.txt")
  v = verify.check(env, turns)
  assert not v.success and f"holds '{n + 1}'" in v.reason


def test_swe_editing_the_tests_is_not_a_fix(envs):
  env = envs("swe")
  env.reset(3)
  g = env.goal
  # The test of the broken function made to return early: the suite passes, the bug stays.
  head = f"def {g['test']}():\n"
  cheat = f"edit(path={g['test_path']!r}, old={head!r}, new={head + '  return' + chr(10)!r})"
  turns = [(cheat, env.step(cheat)), ("run_tests()", env.step("run_tests()"))]
  assert turns[-1][1].rstrip().endswith("[exit code 0]")  # pytest's own verdict
  v = verify.check(env, turns)
  assert not v.success and v.reason == f"test files changed: {g['test_path']}"
  assert not check_transcript("swe", 3, turns, env=env).success


def test_search_wrong_document_is_not_the_answer(envs):
  env = envs("search")
  env.reset(0)
  target = env.goal["target"]
  other = next(i for i in env.ids if i != target)
  act = f'open(doc_id="{other}")'
  v = verify.check(env, [(act, env.step(act))])
  assert not v.success and v.credit == 0.0 and target in v.reason


def test_mcp_report_last_answer_counts(envs):
  env = envs("mcp")
  turns = play(env, 7)
  assert verify.check(env, turns).success
  bad = json.dumps({"tool": "query", "arguments": {"sql": "SELECT p.category, ROUND(SUM(i.quantity * "
                    "i.unit_price), 2) AS r FROM order_items i JOIN products p ON p.id = i.product_id "
                    "GROUP BY p.category ORDER BY r DESC"}})  # refunded and pending orders counted too
  v = verify.check(env, turns + [(bad, env.step(bad))])
  assert not v.success and v.credit < 1.0


def test_mcp_already_refunded_order_needs_nothing(envs):
  env = envs("mcp")
  env.reset(41)
  v = verify.check(env, [])
  assert v.success and "refunded -> refunded" in v.reason


def test_partial_credit_android_settings(envs):
  env = envs("android")
  env.reset(5)
  g = env.goal
  steps = ['open_app("Settings")']
  turns = [(steps[0], env.step(steps[0]))]
  tap = f"tap({ui.find(turns[-1][1], g['toggle'])})"
  turns.append((tap, env.step(tap)))
  v = verify.check(env, turns)
  assert not v.success and v.credit == 0.5, v
  t = check_transcript("android", 5, turns, env=envs("android", 1))
  assert not t.success and t.credit == 0.5, t


def test_task_seed_ranges_are_disjoint_and_unseen_by_the_corpus():
  train, held = verify.task_seeds("train"), verify.task_seeds("heldout")
  assert train.stop <= held.start or held.stop <= train.start
  assert verify.split_of_seed(train.start) == "train" and verify.split_of_seed(held.stop - 1) == "heldout"
  assert verify.split_of_seed(0) is None and list(verify.task_seeds("heldout", 2)) == [held.start, held.start + 1]
  with pytest.raises(ValueError, match="unknown task split"):
    verify.task_seeds("test")
  # No collection run with a base seed below 999 plays a task seed (a million episodes each).
  for s in range(999):
    lo, hi = recorder.episode_seed(s, 0), recorder.episode_seed(s, 999_999)
    assert all(hi < r.start or lo >= r.stop for r in (train, held)), s
  root = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "corpus")
  seeds = []
  for path in glob.glob(os.path.join(root, "*.jsonl.gz")):
    with gzip.open(path, "rt") as f:
      seeds += [json.loads(line)["meta"]["seed"] for line in f]
  assert seeds and all(verify.split_of_seed(s) is None for s in seeds)


def test_bad_history_names_the_turn(envs):
  env = envs("search")
  env.reset(0)
  with pytest.raises(ValueError, match="history turn 1"):
    verify.check(env, [("a", "b"), "not a pair"])


def test_recorded_trajectory_judged_from_its_seed(envs):
  env = envs("os")
  traj = recorder.run_episode(env, base.make_agent("os", random.Random(6)), 6, "t")
  assert check_trajectory(traj, env=env).success
  traj.meta.pop("seed")
  with pytest.raises(ValueError, match="meta\\['seed'\\] is missing"):
    check_trajectory(traj, env=env)


def test_an_env_without_real_state_is_refused(envs):
  class Stand(base.Env):
    domain = "terminal"
    def reset(self, seed):
      self.goal = {"kind": "count_errors"}
      return ""
    def step(self, action):
      return ""
  env = Stand()
  env.reset(0)
  with pytest.raises(ValueError, match="no real state to check"):
    verify.check(env, [])


def test_task_worlds_differ_between_splits_and_from_corpus_seeds():
  from lwm_jax.envs.android import env as android
  from lwm_jax.envs.desktop import env as desktop
  from lwm_jax.envs.mcp import env as mcp_env
  from lwm_jax.envs.search import env as search
  from lwm_jax.envs.swe import env as swe
  from lwm_jax.envs.terminal import env as terminal
  from lwm_jax.envs.web import env as web
  gens = {"terminal": terminal.generate_world, "swe": lambda s: swe.generate_world(s).to_json(),
          "search": search.generate_world, "web": web.generate_world, "android": android.generate_world,
          "os": desktop.generate_world, "mcp": mcp_env.generate_world}
  for domain, gen in gens.items():
    ids = {name: {base.world_id(domain, gen(s)) for s in seeds} for name, seeds in
           (("train", verify.task_seeds("train", 25)), ("heldout", verify.task_seeds("heldout", 25)),
            ("corpus", range(40)))}
    assert len(ids["train"]) == len(ids["heldout"]) == 25, domain  # distinct worlds per task
    assert not ids["train"] & ids["heldout"] and not ids["corpus"] & (ids["train"] | ids["heldout"]), domain


def test_solved_turns_is_the_first_turn_that_opens_the_search_target(envs):
  env = envs("search")
  traj = recorder.run_episode(env, base.make_agent("search", random.Random(1)), 1, "t")
  target = env.goal["target"]
  # independent reference: the first observation that is a page of the target document
  first = next(i for i, t in enumerate(traj.turns) if t.observation.startswith(f"[{target}] page "))
  assert first + 1 < len(traj.turns)  # the scripted agent acts on after its goal
  assert solved_turns(traj, env) == first + 1
  traj.turns = traj.turns[:first]
  assert solved_turns(traj, env) is None
  traj.domain = "chess"
  with pytest.raises(ValueError, match="no transcript verifier for environment 'chess'"):
    solved_turns(traj, env)


def test_record_tasks_plays_the_scripted_agent_on_task_seeds():
  from lwm_jax.envs import collect
  seeds = verify.task_seeds("train", 3)
  trajs = collect.record_tasks("search", seeds)
  assert [t.id for t in trajs] == [f"search-task-{s}" for s in seeds]
  assert [t.meta["seed"] for t in trajs] == list(seeds)
  assert all(check_trajectory(t).success for t in trajs)
  again = collect.record_tasks("search", seeds[:1])
  assert again[0].to_dict() == trajs[0].to_dict()
