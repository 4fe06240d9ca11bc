"""Fidelity by kind of turn (lwm_jax/eval/turn_kinds.py): loops, header leaks and GUI screen
identity on crafted predictions, counted by hand; the loop and leak rules flag no real
observation of the bundled test split; the screen readers find a screen in every real GUI
observation; the free-running report carries the counts."""
import glob
import os

import pytest

from lwm_jax.data import prompts, schema
from lwm_jax.data.bench_records import OBSERVATION_HEADER
from lwm_jax.eval import free_running as fr
from lwm_jax.eval import turn_kinds as tk

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "corpus")

ANDROID = ('<hierarchy package="com.android.settings" screen="{}" time="09:01">\n'
           '  <node class="android.widget.Switch" text="Bluetooth" checked="false" />\n</hierarchy>')
OS = 'window "{}" app=Text Editor (1 of 2 windows)\n  [1] button "Save"\n  dock'
WEB = 'Page "{}" at http://shop.local/x\nnavigation\n  [1] link "Home"'


@pytest.mark.parametrize("text,unit,repeats", [
    ("from stdplus.numeric import clamp, mean" + ", mean" * 30, 2, 31),    # to the cap
    ("total 12\n" + "drwxr-xr-x 2 dev dev 4096 a\n" * 7 + "drwxr-xr-x 2 dev", 10, 7),  # cut inside
    ("ok " * 20 + "done", 1, 20),                                             # 16+ anywhere
])
def test_a_repetition_to_the_end_or_a_long_one_is_a_loop(text, unit, repeats):
  assert tk.loop_run(text) == (unit, repeats)


@pytest.mark.parametrize("text", [
    "-" * 80 + "\nname  size\n" + "=" * 80,          # punctuation rules are not words
    "a.txt\nb.txt\nc.txt\n" * 3 + "README.md",        # three repeats, then other text
    "ok " * 10 + "done",                              # not at the end, fewer than 16
    "",
])
def test_real_looking_repetition_is_not_a_loop(text):
  assert tk.loop_run(text) == (0, 0)


@pytest.mark.parametrize("text,found", [
    ('**Environment - Shop"\nPage "Cart - Shop"', "**Environment"),
    ("# Observation:**\n$ ls", "# Observation:**"),
    (OBSERVATION_HEADER + "\nfoo", OBSERVATION_HEADER),
    ("ok\n</predicted_observation>", "</predicted_observation>"),
    ("### Turn 3\nls", "### Turn 3"),
    ("## Initial state\nthe shop", "## Initial state"),
    ("<action_space>\nclick(id)", "<action_space>"),
    ("4. SIMULATION INSTRUCTION\nnone", "4. SIMULATION INSTRUCTION"),
])
def test_prompt_and_chat_rendering_inside_an_observation_is_a_leak(text, found):
  assert tk.header_leak(text) == found


@pytest.mark.parametrize("text", [
    "Task: buy 2 mugs", "## Usage\nrun it", "Observation count: 3", "<task>write</task>", ""])
def test_ordinary_text_is_no_leak(text):
  assert tk.header_leak(text) == ""


def test_every_template_heading_is_known_to_the_leak_rule():
  traj = next(schema.read_jsonl(os.path.join(CORPUS, "web_test.jsonl.gz")))
  for variant in range(prompts.NUM_VARIANTS):
    for title, _ in prompts._sections(traj, variant, long=True):
      assert title in prompts.SECTION_TITLES, (variant, title)


def test_screen_readers_read_what_each_environment_renders():
  android, desktop, web = (tk.screen_reader(d) for d in ("android", "os", "web"))
  assert tk.screen_reader("terminal") is None
  assert android(ANDROID.format("Settings")) == "Settings"
  assert desktop("Error: unknown shortcut 'ctrl+q'\n" + OS.format("*notes.txt - Text Editor")) \
      == "notes.txt - Text Editor"
  assert desktop("desktop (no open windows)\n  dock") == "desktop"
  assert web(WEB.format("Cart - Shop")) == "Cart - Shop"
  assert android("Settings") is None and web("") is None


def test_real_observations_are_neither_loops_nor_leaks_and_show_their_screen():
  obs, unread = [], []
  for path in sorted(glob.glob(os.path.join(CORPUS, "*_test.jsonl.gz"))):
    for t in schema.read_jsonl(path):
      read = tk.screen_reader(t.domain)
      for i, x in enumerate(t.turns):
        obs.append((f"{t.id}:{i + 1}", x.observation))
        if read and read(x.observation) is None:
          unread.append(f"{t.id}:{i + 1}")
  assert len(obs) > 1000
  assert tk.flagged_real(obs) == []
  assert unread == []


def case(key, domain, truth, previous="", error=None, changed=None):
  return fr.Case(key=key, domain=domain, traj_id=key, turn=0, messages=(), truth=truth,
                 previous=previous, error=error, changed=changed)


def test_counts_by_kind_on_crafted_predictions():
  cases = [
      case("a1", "android", ANDROID.format("Clock"), ANDROID.format("home")),       # transition
      case("a2", "android", ANDROID.format("Clock:edit"), ANDROID.format("Clock")),  # transition
      case("a3", "android", ANDROID.format("Clock"), ANDROID.format("Clock")),       # same screen
      case("t1", "terminal", "a.txt\n"),
      case("t2", "terminal", "b.txt\n"),
  ]
  preds = {"a1": ANDROID.format("Clock"),                 # right, on a transition
           "a2": ANDROID.format("Clock"),                 # stayed: wrong on a transition
           "a3": "**Environment Observation:**\n" + ANDROID.format("Clock"),  # right, a leak
           "t1": "a.txt" + "\na.txt" * 8,                 # a loop to the end
           "t2": "b.txt\n"}
  got = tk.turn_kinds(cases, preds)
  assert got == {"android": {"turns": 3, "loops": 0, "header_leaks": 1, "screen_turns": 3,
                             "screen_right": 2, "transitions": 2, "transitions_right": 1},
                 "terminal": {"turns": 2, "loops": 1, "header_leaks": 0}}
  r = tk.rates(got)
  assert r["android"]["transitions_right"] == 50.0 and r["terminal"]["loops"] == 50.0
  assert r["terminal"]["screen_right"] is None
  # copy-previous on the same cases: right only where the screen did not change
  copy = tk.turn_kinds(cases, {c.key: c.previous for c in cases})
  assert copy["android"]["screen_right"] == 1 and copy["android"]["transitions_right"] == 0


def test_the_free_running_report_carries_the_kinds():
  cases = [case("a1", "android", ANDROID.format("Clock"), ANDROID.format("home")),
           case("t1", "terminal", "a.txt\n")]
  sel = fr.Selection(cases=cases, turns_total={"android": 1, "terminal": 1},
                     turns_selected={"android": 1, "terminal": 1}, trajectories=[])
  res = fr.results(sel, {"model": {"a1": ANDROID.format("Clock"), "t1": "x" + " x" * 20}})
  assert res["systems"]["model"]["kinds"]["terminal"]["loops"] == 1
  assert res["systems"]["copy_previous"]["kinds"]["android"]["transitions_right"] == 0
  md = fr.markdown(res)
  assert "## By kind of turn" in md and "### Right screen on transitions" in md
  assert "| model | 0.0 (0/1) | 100.0 (1/1) |" in md  # loops: android, terminal


def test_error_and_state_change_counts_on_crafted_predictions():
  """Truth from the recorded facts, the prediction read by the terminal's error rule; counted by
  hand: 4 turns with facts, 2 real errors, 2 predicted, 1 of them right."""
  missing = "cat: x: No such file or directory\n"
  cases = [case("e1", "terminal", missing, error="exit status 1", changed=False),
           case("e2", "terminal", "ls: cannot access 'd': No such file or directory\n",
                error="exit status 2", changed=False),
           case("e3", "terminal", "a.txt\n", error="", changed=False),
           case("e4", "terminal", "done\n", error="", changed=True),
           case("e5", "terminal", "b.txt\n")]  # collected before the facts: not counted
  preds = {"e1": missing, "e2": "a.txt\n", "e3": "bash: foo: command not found\n",
           "e4": "done\n", "e5": "cat: b: No such file or directory\n"}
  got = tk.turn_kinds(cases, preds)["terminal"]
  assert {k: got[k] for k in ("turns", "error_turns", "errors", "errors_predicted",
                              "errors_found", "error_rule_agrees", "changing_turns",
                              "read_only_turns")} == {
      "turns": 5, "error_turns": 4, "errors": 2, "errors_predicted": 2, "errors_found": 1,
      "error_rule_agrees": 4, "changing_turns": 1, "read_only_turns": 3}
  r = tk.rates({"terminal": got})["terminal"]
  assert (r["error_recall"], r["error_precision"], r["error_rule_agrees"]) == (50.0, 50.0, 100.0)
  assert r["changing_f1"] == 100.0 and r["read_only_f1"] == pytest.approx(100 / 3)
  # copy-previous (every previous is ""): shows no error, so recall 0 and no precision
  copy = tk.rates(tk.turn_kinds(cases, {c.key: c.previous for c in cases}))["terminal"]
  assert copy["error_recall"] == 0.0 and copy["error_precision"] is None
  sel = fr.Selection(cases=cases, turns_total={"terminal": 5}, turns_selected={"terminal": 5},
                     trajectories=[])
  md = fr.markdown(fr.results(sel, {"model": preds}))
  assert "### Error turns" in md and "| model | 50.0 / 50.0 (2/4) |" in md
  assert "| copy_previous | 0.0 / - (2/4) |" in md
  assert "on: Term. 100.0%." in md
  assert "### Token F1 on state-changing and read-only turns" in md
  assert "| model | 100.0 / 33.3 (1/3) |" in md


def test_cases_carry_the_recorded_facts_of_their_turn():
  t = schema.Trajectory(id="x", domain="terminal", task="t", action_space="s", initial_state="i",
                        turns=[schema.Turn("cat y", "cat: y: nope\n", {"error": "exit status 1",
                                                                        "changed": False}),
                               schema.Turn("ls", "a\n")])
  sel = fr.select_cases([t])
  assert [(c.error, c.changed) for c in sel.cases] == [("exit status 1", False), (None, None)]


def test_copyable_world_specific_and_invented_words_counted_by_hand():
  msgs = ({"role": "system", "content": "Files: app.log notes.txt"},
          {"role": "user", "content": "tail -n 2 app.log"})
  truth = "ERROR disk full on app.log\nWARN retry 3"
  # truth words: ERROR disk full on app log WARN retry 3 (9); in the prompt: app, log (2)
  pred = "ERROR disk quota on app.log\nINFO user alice"
  # pred words: ERROR disk quota on app log INFO user alice (9)
  got = tk.content_counts(msgs, truth, pred)
  assert got == {"copyable": 2, "copyable_found": 2, "specific": 7,
                 "specific_found": 3,            # ERROR, disk, on
                 "pred_words": 9, "invented": 4}  # quota, INFO, user, alice
  c = fr.Case(key="k", domain="terminal", traj_id="k", turn=0, messages=msgs, truth=truth,
              previous="")
  kinds = tk.turn_kinds([c], {"k": pred})
  r = tk.rates(kinds)["terminal"]
  assert (r["copyable_found"], r["specific_found"]) == (100.0, pytest.approx(300 / 7))
  assert r["invented"] == pytest.approx(400 / 9)
  md = "\n".join(tk.markdown({"domains": ["terminal"], "systems": {"m": {"kinds": kinds}}}))
  assert "### Copyable and world-specific content" in md and "| m | 100.0 / 42.9 / 44.4 |" in md
  # copy-previous invents nothing: the previous observation is part of the prompt
  prev = "line one\nline two"
  c2 = fr.Case(key="k", domain="terminal", traj_id="k", turn=1,
               messages=msgs + ({"role": "assistant", "content": prev},), truth=truth,
               previous=prev)
  assert tk.turn_kinds([c2], {"k": prev})["terminal"]["invented"] == 0
