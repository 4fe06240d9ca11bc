"""The judge (lwm_jax.judge): both styles' messages and reply parsing, JSON repair, and judging runs
with the official style, in-process and through the evaluation CLI against a stub judge server."""
import json
import os
import subprocess
import sys

import pytest

from lwm_jax import judge
from lwm_jax.data import bench_records as awb
from lwm_jax.eval import inference as A
from lwm_jax.eval import records as R
from lwm_jax.eval.judge import run_judging
from lwm_jax.sampling.backends import FunctionBackend
from test_eval_e2e import REPO, _Server, _write_bench

HEADER = awb.OBSERVATION_HEADER


def _prompts_dir(tmp_path, domains=("terminal", "mcp", "search")):
  """Small judge prompts of our own, in the official repository's layout."""
  root = tmp_path / "prompts"
  for d in domains:
    (root / d).mkdir(parents=True)
    (root / d / "judge_system_prompt.txt").write_text(f"JUDGE-{d.upper()}: grade it.\n")
    (root / d / "system_prompt.txt").write_text("a world model prompt, not read by the judge")
  return root


def _verdict(scores, before="Reasoning per dimension.\n", tag=True):
  body = "```json\n" + json.dumps({"strengths": ["s"], "weaknesses": ["w"],
                                   "scores": scores}) + "\n```"
  return before + (f"<final_evaluation>\n{body}\n</final_evaluation>" if tag else body)


FIVE = dict(format=5, factuality=5, consistency=5, realism=5, quality=5)

# -------------------------------------------------------------------------------- JSON repair


def test_repair_json_trailing_commas_only_outside_strings():
  assert json.loads(judge.repair_json('{"a": [1, 2,], "b": {"c": 3,},}')) == {
      "a": [1, 2], "b": {"c": 3}}
  # a comma before a brace inside a string is content, and an escaped quote does not end it
  assert json.loads(judge.repair_json('{"s": "x, } \\", ]", "t": 1,\n}')) == {
      "s": 'x, } ", ]', "t": 1}


def test_rubric_reply_with_trailing_commas():
  reply = ('```json\n{"format": 4, "factuality": 3, "consistency": 5, "realism": 2, '
           '"quality": 1,}\n```')
  assert judge.parse_judge_reply(reply)["scores"] == dict(
      format=4, factuality=3, consistency=5, realism=2, quality=1)
  assert judge.rubric_reward('{"format": 1, "factuality": 1, "consistency": 1, "realism": 1, '
                             '"quality": 1, }') == 5.0


# ----------------------------------------------------------------------------- official parser


@pytest.mark.parametrize("value,expected", [
    (4, 4), (6, 5), (100, 5),            # clamped above 5
    (3.5, 4), (2.5, 2), (4.5, 4), (1.4, 1), (4.6, 5),  # Python round: half to even
    ("4", 4), (" 3 ", 3), ("4/5", 4), ("7", 5),
    ("4.5", 0), ("great", 0), ("", 0),                   # unreadable strings: 0, invalid
    (0, 0), (-2, -2), (0.4, 0),                          # 0 and below kept as the client does
    (None, 0), ([4], 0), ({"score": 4}, 0),              # nested object as a value: invalid
    (float("nan"), 0),
    (True, 1),                                           # JSON true is the int 1 in Python
])
def test_official_score(value, expected):
  assert judge.official_score(value) == expected


def test_official_reply_nested_objects_and_commas():
  # braces inside strings, nested objects before the scores, trailing commas everywhere
  reply = ('Format is fine; factuality differs {see below}.\n<final_evaluation>\n```json\n'
           '{"strengths": ["keeps {ids}", "json: {\\"a\\": 1}"], "weaknesses": ["wrong count",],\n'
           ' "meta": {"notes": {"depth": 2}},\n'
           ' "scores": {"format": 6, "factuality": 3.5, "consistency": "4.5", "realism": "4/5",'
           ' "quality": 0,},\n}\n```\n</final_evaluation>')
  parsed = judge.parse_official_reply(reply)
  assert parsed["scores"] == dict(format=5, factuality=4, consistency=0, realism=4,
                                  quality=0)  # 0: the client's mark of an invalid dimension
  assert parsed["strengths"] == ["keeps {ids}", 'json: {"a": 1}']
  assert parsed["weaknesses"] == ["wrong count"]


@pytest.mark.parametrize("reply", [
    "",
    "no verdict at all",
    _verdict(FIVE).replace('"scores"', '"grades"'),              # no scores object
    "<final_evaluation>```json\n{\"format\": 5, \"factuality\": 5}\n```</final_evaluation>",
    '<final_evaluation>{"scores": [5, 5, 5, 5, 5]}</final_evaluation>',  # scores not an object
    "<think>" + _verdict(FIVE, tag=False),                          # only in unclosed thinking
])
def test_official_reply_failures(reply):
  assert judge.parse_official_reply(reply) is None


def test_official_reply_where_the_json_is_read():
  # the last <final_evaluation> block wins over a draft in the reasoning and an earlier block
  reply = ("<think>draft " + _verdict(dict(FIVE, format=1)) + "</think>" +
           _verdict(dict(FIVE, format=2)) + "\nrevised:\n" + _verdict(dict(FIVE, format=3)))
  assert judge.parse_official_reply(reply)["scores"]["format"] == 3
  # an unclosed tag: the rest of the reply is the block
  assert judge.parse_official_reply(
      "<final_evaluation>\n" + json.dumps({"scores": FIVE}))["scores"] == FIVE
  # no tag: the whole reply is searched, as the official client does
  assert judge.parse_official_reply(_verdict(dict(FIVE, quality=2), tag=False))[
      "scores"]["quality"] == 2
  # thinking left unclosed, answered inside it: the verdict after the tag still counts
  assert judge.parse_official_reply("<think>hmm " + _verdict(FIVE))["scores"] == FIVE
  # all dimensions invalid is still a parsed reply (no retry), whose sample is later excluded
  assert judge.parse_official_reply(_verdict({"format": 0}))["scores"] == dict.fromkeys(
      judge.DIMENSIONS, 0)


# --------------------------------------------------------------------------- official layout


def test_official_messages_layout(tmp_path):
  style = judge.make_style("official", _prompts_dir(tmp_path))
  history = [(awb.format_action(1, "echo hi"), awb.format_observation("hi"))]
  msgs = style.messages("terminal", history, awb.format_action(2, "ls"),
                        "a.txt", awb.format_observation("a.txt\nb.txt"))
  assert msgs[0] == {"role": "system", "content": "JUDGE-TERMINAL: grade it.\n"}
  user = msgs[1]["content"]
  pred = "**Simulated output (world model):**\n```\na.txt\n```"
  truth = "**Ground Truth (real environment output):**\n```\na.txt\nb.txt\n```"
  order = [user.index(s) for s in (history[0][0] + "\n" + history[0][1], "# Current turn\n\n"
                                   "### Turn 2", pred, truth, "<final_evaluation>")]
  assert order == sorted(order)
  assert user.count(HEADER) == 1  # only the history keeps its header, as the file has it
  # no history: the section is left out; a header anywhere in a prediction is removed; a fence
  # inside the prediction cannot close ours
  msgs = style.messages("mcp", [], "call", f"x {HEADER} ```y```", "ok")
  assert msgs[0]["content"].startswith("JUDGE-MCP")
  user = msgs[1]["content"]
  assert user.startswith("# Current turn\n\ncall\n\n") and HEADER not in user
  assert "**Simulated output (world model):**\n````\nx  ```y```\n````" in user


def test_official_prompts_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a directory"):
    judge.make_style("official", tmp_path / "missing")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="judge_system_prompt.txt"):
    judge.make_style("official", tmp_path / "empty")
  with pytest.raises(ValueError, match="--judge_prompts"):
    judge.make_style("official")
  with pytest.raises(ValueError, match="unknown judge style 'gpt'"):
    judge.make_style("gpt")
  style = judge.make_style("official", _prompts_dir(tmp_path, ["terminal"]))
  with pytest.raises(FileNotFoundError, match=r"os/judge_system_prompt.txt.*found: terminal"):
    style.messages("os", [], "a", "b", "c")


# ---------------------------------------------------------------------------------- judging


def test_run_judging_official_style(tmp_path):
  recs = _write_bench(tmp_path / "bench.jsonl")
  preds = {R.record_key(r): {"prediction": R.ground_truth(r)} for r in recs}
  preds[R.record_key(recs[1])] = {"prediction": ""}  # empty: dropped, counted
  calls = []
  bye = R.record_key(recs[2])

  def reply(messages):
    calls.append(messages)
    turn = messages[1]["content"].split("# Current turn")[1].split("**Simulated")[0]
    if "\nls\n" in turn:
      return "I cannot decide."  # never a verdict: three tries, then a failed row
    return _verdict(dict(FIVE, factuality=3.5))

  style = judge.make_style("official", _prompts_dir(tmp_path))
  out = tmp_path / "judged.jsonl"
  stats, skipped = run_judging(recs, preds, FunctionBackend(reply), str(out), style=style,
                               drop_empty=True, progress=False)
  assert skipped == {"no_prediction": 0, "no_ground_truth": 0, "empty_prediction": 1}
  rows = {r["key"]: r for r in map(json.loads, out.read_text().splitlines())}
  dropped = [k for k, r in rows.items() if r.get("dropped_empty")]
  assert dropped == [R.record_key(recs[1])] and rows[dropped[0]]["failed"]  # kept, not judged
  rows = {k: r for k, r in rows.items() if k not in dropped}
  assert len(rows) == len(recs) - 1 and stats.done == len(recs) - 1
  # the "ls" turn (recs[1]) was dropped as empty, so no record fails here; every row scored
  assert all(not r["failed"] and r["judge_style"] == "official" for r in rows.values())
  assert rows[bye]["scores"] == dict(FIVE, factuality=4)
  assert rows[bye]["weaknesses"] == ["w"]
  assert {m[0]["content"].split(":")[0] for m in calls} == {
      "JUDGE-TERMINAL", "JUDGE-MCP", "JUDGE-SEARCH"}
  # now judge the "ls" turn: three tries (the official client's), then a failed row
  calls.clear()
  preds[R.record_key(recs[1])] = {"prediction": "a.txt"}
  out = tmp_path / "judged_ls.jsonl"
  stats, _ = run_judging(recs[1:2], preds, FunctionBackend(reply), str(out), style=style,
                         progress=False)
  assert len(calls) == 3 and stats.done == 1
  row = [json.loads(x) for x in out.read_text().splitlines()][-1]
  assert row["key"] == R.record_key(recs[1]) and row["failed"] and row["scores"] is None


def test_cli_official_judge_style(tmp_path):
  bench = tmp_path / "bench" / "all_test.jsonl"
  bench.parent.mkdir()
  recs = _write_bench(bench)
  out = tmp_path / "run"
  A.write_baselines(recs, str(out))  # copy_previous and empty predictions need no model

  def reply(body):
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    quality = {"JUDGE-TERMINAL": 2, "JUDGE-MCP": 3, "JUDGE-SEARCH": 4}[system.split(":")[0]]
    return 200, _verdict(dict(FIVE, quality=quality), before=f"seen {len(user)} chars\n")

  srv = _Server(reply)
  try:
    cmd = [sys.executable, os.path.join(REPO, "evals", "agentworldbench.py"), "judge",
           f"--data={bench.parent}", f"--out={out}", f"--judge_endpoint={srv.url}",
           "--judge_model=stub", "--judge_style=official",
           f"--judge_prompts={_prompts_dir(tmp_path)}", "--drop_empty", "--noprogress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
  finally:
    srv.close()
  # copy_previous is empty at each first turn (terminal turn 1): dropped; "empty" is all dropped
  assert "skipped {'no_prediction': 0, 'no_ground_truth': 0, 'empty_prediction': 5}" in proc.stdout
  assert "skipped {'no_prediction': 0, 'no_ground_truth': 0, 'empty_prediction': 1}" in proc.stdout
  rows = [json.loads(x) for x in open(A.judged_path(str(out), "copy_previous"))]
  rows = [r for r in rows if not r.get("dropped_empty")]
  assert sorted((r["task"], r["scores"]["quality"]) for r in rows) == [
      ("mcp", 3), ("search", 4), ("terminal", 2), ("terminal", 2)]
  assert len(srv.requests) == 4 and all("<final_evaluation>" in r["messages"][1]["content"]
                                        for r in srv.requests)
