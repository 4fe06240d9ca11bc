"""--official_client: the judge request and parsing come from the official client's own code in a
checkout (here a stand-in of ours in the same layout, tests/fixtures/official_client), and the
official-mode parsing and scoring rules when no checkout is given."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lwm_jax import judge
from lwm_jax.data.bench_records import read_awb_jsonl
from lwm_jax.eval import judge as eval_judge
from lwm_jax.eval import metrics
from lwm_jax.eval import records as R
from lwm_jax.eval.official_client import (OfficialClientError, judge_protocol,
                                          official_client_style)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STANDIN = os.path.join(ROOT, "tests", "fixtures", "official_client")
BENCH = os.path.join(ROOT, "evals", "mini_bench")


_REFERENCE = """
import json, sys
import eval as ref  # the stand-in's eval.py, found in this process's working folder
recs, gen = json.load(sys.stdin)
prompts = ref.load_judge_system_prompts()
print(json.dumps([ref.build_judge_messages(r, ref.parse_model_output(gen, "predicted_observation"),
                                           prompts) for r in recs]))
"""


def _reference_messages(recs: list[dict], gen: str) -> list:
  """The stand-in client's own judge requests, built in a child process run from its eval/
  folder as the client runs (the test's reference, apart from our loader)."""
  out = subprocess.run([sys.executable, "-c", _REFERENCE], cwd=os.path.join(STANDIN, "eval"),
                       input=json.dumps([recs, gen]), capture_output=True, text=True, check=True)
  return json.loads(out.stdout)


def test_request_is_the_clients_own_byte_for_byte():
  style = official_client_style(STANDIN)
  recs = list(read_awb_jsonl(os.path.join(BENCH, "terminal_test.jsonl")))[:12]
  assert len(recs) == 12
  gen = "<think>x</think><predicted_observation>**Environment Observation:**\nok $ </predicted_observation>"
  wants = _reference_messages([rec.to_dict() for rec in recs], gen)
  for rec, want in zip(recs, wants, strict=True):
    got = eval_judge.judge_messages(rec, "ignored", R.ground_truth(rec), style=style,
                                    row={"gen": gen})
    assert json.dumps(got) == json.dumps(want)
  # An independent spelling of one request: the stand-in's layout, not ours.
  rec = recs[0]
  got = eval_judge.judge_messages(rec, "", "", style=style, row={"raw": "plain output"})
  assert got[0] == {"role": "system", "content": "Stand-in judge rules for terminal sessions.\n"}
  turn = rec.turn_idx - 1
  assert got[1]["content"].startswith("[stand-in judge request]\nBefore:\n")
  assert f"Now: {rec.prompt[turn]}\nGuess:\n~~~\nplain output\n~~~\n" in got[1]["content"]
  assert got[1]["content"].endswith("with {\"scores\": {...}}.  ")


def test_reply_parsed_by_the_clients_parser_and_scores_kept():
  style = official_client_style(STANDIN)
  reply = '<verdict>{"scores": {"format": -2, "factuality": 4, "consistency": 4, ' \
          '"realism": 4, "quality": 0}, "weaknesses": ["w"]}</verdict>'
  parsed = style.parse(reply)
  assert parsed["scores"] == {"format": -2, "factuality": 4, "consistency": 4, "realism": 4,
                              "quality": 0}
  assert parsed["total_score"] == 4 and parsed["reason"] == "w" and style.usable(parsed)
  assert style.parse("no verdict here") is None


def test_missing_prompt_file_and_missing_client_are_clear_errors(tmp_path):
  style = official_client_style(STANDIN)
  rec = next(iter(read_awb_jsonl(os.path.join(BENCH, "mcp_test.jsonl"))))
  with pytest.raises(FileNotFoundError, match=r"prompts/mcp/judge_system_prompt.txt: no judge "
                                              r"system prompt for domain 'mcp'"):
    eval_judge.judge_messages(rec, "p", "t", style=style, row={"gen": "p"})
  with pytest.raises(OfficialClientError, match="no eval/eval.py"):
    official_client_style(tmp_path)
  # Our own official layout: a prompts folder without the domain's file names the file.
  (tmp_path / "p" / "terminal").mkdir(parents=True)
  (tmp_path / "p" / "terminal" / "judge_system_prompt.txt").write_text("x")
  ours = judge.make_style("official", tmp_path / "p")
  with pytest.raises(FileNotFoundError, match=r"p/os/judge_system_prompt.txt"):
    ours.messages("os", [], "a", "b", "c")


@pytest.mark.parametrize("reply,scores", [
    ("<final_evaluation>{'scores': {'format': 4, 'factuality': 3, 'consistency': 5, "
     "'realism': 4, 'quality': 2}}</final_evaluation>", (4, 3, 5, 4, 2)),
    ("<final_evaluation>{scores: {format: 4, factuality: 3, consistency: 5, realism: 4, "
     "quality: 2,},}</final_evaluation>", (4, 3, 5, 4, 2)),
    ('{"scores": {"format": -2, "factuality": true, "consistency": 9, "realism": "3/5", '
     '"quality": "bad"}}', (-2, 1, 5, 3, 0)),
])
def test_official_parser_reads_what_the_client_reads(reply, scores):
  parsed = judge.parse_official_reply(reply)
  assert tuple(parsed["scores"][d] for d in judge.DIMENSIONS) == scores


def test_official_rows_score_by_the_clients_rules():
  rows = [{"task": "os", "judge_style": "official", "failed": False,
           "scores": {"format": -2, "factuality": 4, "consistency": 4, "realism": 4,
                      "quality": 0}},
          {"task": "os", "judge_style": "official", "failed": False,
           "scores": {"format": 2, "factuality": 2, "consistency": 2, "realism": 2,
                      "quality": 2}}]
  out = metrics.aggregate(rows)
  # Totals: (4+4+4)/3 = 4 and 2; format's mean holds the -2: (-2 + 2) / 2 = 0; quality's 0 is
  # left out: 2.
  assert out["domains"]["os"] == metrics.to_percent(3.0)
  assert out["dimensions"]["os"]["format"] == metrics.to_percent(0.0)
  assert out["dimensions"]["os"]["quality"] == metrics.to_percent(2.0)
  rubric = [dict(r, judge_style="rubric") for r in rows]
  assert metrics.aggregate(rubric)["dimensions"]["os"]["format"] == metrics.to_percent(2.0)


def test_cli_says_which_protocol_it_runs():
  line = judge_protocol("official", None, False)
  assert "NOT comparable with published ones" in line and "--official_client" in line
  assert "--drop_empty" in line
  line = judge_protocol("official", "/x/Qwen-AgentWorld", True)
  assert "official client's own request" in line and "NOT" not in line
