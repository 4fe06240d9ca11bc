"""Our benchmark files and the official AgentWorldBench client's rules agree.

The official client (QwenLM/Qwen-AgentWorld, eval/eval.py) builds a model's messages from a record
as: the system prompt when not empty, then user/assistant pairs zip(prompt[:t], response[:t]) with
t = turn_idx - 1, then user = prompt[t]. It reads nothing else. `_official_messages` restates that
rule independently of our reader; every bundled record must give the same messages both ways.
"""
import json
import os

import pytest

from lwm_jax import domains
from lwm_jax.data import bench_records as awb
from lwm_jax.eval import records as R

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "evals", "mini_bench")


def _official_messages(row):
  t = row["turn_idx"] - 1
  msgs = [{"role": "system", "content": row["system_str"]}] if row.get("system_str") else []
  for act, obs in zip(row["prompt"][:t], row["response"][:t]):
    msgs += [{"role": "user", "content": act}, {"role": "assistant", "content": obs}]
  msgs.append({"role": "user", "content": row["prompt"][t]})  # IndexError if prompt stops short
  return msgs


def test_every_bundled_record_gives_the_official_messages():
  rows = []
  for name in sorted(os.listdir(BENCH)):
    with open(os.path.join(BENCH, name), encoding="utf-8") as f:
      rows += [json.loads(line) for line in f if line.strip()]
  recs = R.load_bench(BENCH)
  assert len(rows) == len(recs) > 1000
  domains = set()
  for row, rec in zip(rows, recs):
    assert row["id"] == rec.id
    assert R.chat_messages(rec) == _official_messages(row), rec.id
    # the official judge reads the ground truth at the same position
    assert R.ground_truth(rec) == awb.parse_observation(row["response"][row["turn_idx"] - 1])
    assert len(row["prompt"]) == len(row["response"]) == row["total_turns"]  # published layout
    domains.add(R.domain(rec))
  assert len(domains) == 7


def test_reader_prefers_prompt_and_falls_back_to_current_prompt():
  whole = awb.AWBRecord(task="os", id="1", system_str="s", prompt=["a1", "a2", "a3"],
                        response=["o1", "o2", "o3"], current_prompt="stale", turn_idx=2,
                        total_turns=3)
  assert [m["content"] for m in R.chat_messages(whole)] == ["s", "a1", "o1", "a2"]
  short = awb.AWBRecord(task="os", id="2", system_str="", prompt=["a1"], response=["o1", "o2"],
                        current_prompt="a2", turn_idx=2, total_turns=2)
  assert [m["content"] for m in R.chat_messages(short)] == ["a1", "o1", "a2"]
  # a record without current_prompt reads the action from prompt; a numeric id stays a number
  d = whole.to_dict()
  del d["current_prompt"]
  d["id"] = 7
  rec = awb.AWBRecord.from_dict(d)
  assert rec.action == "a2" and rec.id == "7" and rec.to_dict()["id"] == 7


def test_importer_keeps_only_the_turns_up_to_the_one_under_test(tmp_path):
  from lwm_jax.data import importers
  path = tmp_path / "os_test.jsonl"
  with open(os.path.join(BENCH, "os_test.jsonl"), encoding="utf-8") as f:
    row = json.loads(f.readline())
  row = dict(row, turn_idx=2, id="x#t2")
  path.write_text(json.dumps(row) + "\n")
  (traj,), _ = importers.load_awb_jsonl(path)
  assert len(traj.turns) == 2 < row["total_turns"]  # no repeated or future turns
  assert traj.turns[1].action == awb.parse_action(row["prompt"][1])
  assert traj.turns[1].observation == awb.parse_observation(row["response"][1])


# ------------------------------------------------------------------- the official row shapes

def _official_pred_rows():
  """Rows as the official `infer` writes them: the whole record plus `gen` (integer ids)."""
  base = {"system_str": "sys", "prompt": ["### Turn 1\n**Action:**\n```\nls\n```"],
          "response": ["**Environment Observation:**\na.txt"], "turn_idx": 1, "total_turns": 1,
          "current_prompt": "### Turn 1\n**Action:**\n```\nls\n```"}
  return [
      dict(base, task="terminal", id=1, gen="<think>draft <predicted_observation>no"
           "</predicted_observation></think><predicted_observation>\na.txt\n"
           "</predicted_observation>"),
      dict(base, task="terminal", id=2, gen="b.txt"),  # no tags: the text itself
      dict(base, task="mcp", id=1, gen=""),  # a failed call: empty generation
  ]


def _official_judged_rows():
  rows = _official_pred_rows()
  # as the official `judge` writes them: five dimensions at top level, total_score, failed
  rows[0].update(format=5, factuality=5, consistency=5, realism=5, quality=5, total_score=5.0,
                 failed=0.0)
  rows[1].update(format=4, factuality=2, consistency=0, realism=3, quality=3, total_score=3.0,
                 failed=0.0)  # 0 = an invalid dimension, left out of the mean
  rows[2].update(failed=1.0, error_message="No model generation")
  return rows


def _write_rows(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


def test_official_rows_read_as_ours(tmp_path):
  from lwm_jax.eval import official
  from lwm_jax.eval.metrics import aggregate
  p, j = tmp_path / "predictions.jsonl", tmp_path / "judged.jsonl"
  _write_rows(p, _official_pred_rows())
  _write_rows(j, _official_judged_rows())
  assert official.file_format(str(p)) == official.file_format(str(j)) == "official"
  preds = official.read_predictions(str(p))
  assert {k: v["prediction"] for k, v in preds.items()} == {
      "terminal:1": "a.txt", "terminal:2": "b.txt", "mcp:1": ""}
  judged = official.read_judged(str(j))
  assert judged["terminal:2"]["scores"] == dict(format=4, factuality=2, consistency=0,
                                                realism=3, quality=3)  # as the client wrote them
  assert judged["mcp:1"]["scores"] is None
  agg = aggregate(judged.values())
  # terminal: samples 5 and 3 -> mean 4 -> 75; mcp has no scored sample
  assert agg["domains"] == {"terminal": 75.0} and agg["excluded"] == {"mcp": 1, "terminal": 0}
  assert agg["n_domains"] == 1 and agg["partial"]
  with pytest.raises(ValueError, match=r"predictions\.jsonl:1: an official prediction row"):
    official.read_judged(str(p))
  bad = _official_judged_rows()
  bad[1]["failed"] = "no"
  _write_rows(j, bad)
  with pytest.raises(ValueError, match=r"judged\.jsonl:2: field 'failed' is 'no'"):
    official.read_judged(str(j))


def test_export_reads_back_by_the_official_rules(tmp_path):
  """Our rows out in the official shapes; the official `judge` input rule (non-empty `gen`, record
  fields) and its `score` arithmetic, restated here, give our figures."""
  from lwm_jax.eval import official
  from lwm_jax.eval.metrics import aggregate
  recs = [awb.AWBRecord(task=d, id=f"{d}{i}", system_str="s", prompt=["a"], response=["o"],
                        current_prompt="a", turn_idx=1, total_turns=1)
          for d in ("os", "web") for i in range(2)]
  preds = {R.record_key(r): {"key": R.record_key(r), "prediction": "o",
                             "raw": "<think>t</think><predicted_observation>o"
                                    "</predicted_observation>"} for r in recs}
  scores = [dict(format=5, factuality=4, consistency=4, realism=4, quality=3), None,
            dict(format=2, factuality=2, consistency=2, realism=2, quality=2),
            dict(format=3, factuality=3, consistency=3, realism=3, quality=4.5)]
  judged = {R.record_key(r): {"key": R.record_key(r), "task": r.task, "id": r.id, "scores": s}
            for r, s in zip(recs, scores)}
  counts = official.export_system(recs, preds, judged, str(tmp_path / "sys"))
  assert counts == {"predictions": 4, "no_prediction": 0, "judged": 4, "not_judged": 0}
  prows = [json.loads(x) for x in open(tmp_path / "sys_predictions.jsonl")]
  assert all(r["gen"] and r["prompt"][r["turn_idx"] - 1] == "a" for r in prows)
  assert prows[0]["id"] == "os0"
  jrows = [json.loads(x) for x in open(tmp_path / "sys_judged.jsonl")]
  assert [r["failed"] for r in jrows] == [0.0, 1.0, 0.0, 0.0]
  by_dom = {}
  for r in jrows:
    if r["failed"] == 0.0:
      by_dom.setdefault(r["task"], []).append(r["total_score"])
  norm = lambda x: (x - 1) / 4 * 100  # noqa: E731
  official_domains = {d: norm(sum(v) / len(v)) for d, v in by_dom.items()}
  pooled = norm(sum(sum(v) for v in by_dom.values()) / sum(len(v) for v in by_dom.values()))
  agg = aggregate(judged.values())
  assert agg["domains"] == pytest.approx(official_domains)
  assert agg["pooled_overall"] == pytest.approx(pooled)
  # hand-computed: os 4.0 -> 75; web (2 + 3.3) / 2 = 2.65 -> 41.25; pooled (4 + 2 + 3.3) / 3 = 3.1
  assert agg["domains"] == pytest.approx({"os": 75.0, "web": 41.25})
  assert agg["overall"] == pytest.approx(58.125) and agg["pooled_overall"] == pytest.approx(52.5)


def test_cli_judges_and_scores_official_files(tmp_path):
  from test_eval_e2e import _Server
  from test_eval_files import run_cli
  bench = tmp_path / "bench"
  bench.mkdir()
  rows = _official_pred_rows()
  for dom in ("terminal", "mcp"):
    _write_rows(bench / f"{dom}_test.jsonl",
                [{k: v for k, v in r.items() if k != "gen"} for r in rows if r["task"] == dom])
  _write_rows(tmp_path / "predictions.jsonl", rows)
  asked = []

  def judge(body):
    asked.append(body["messages"][-1]["content"])
    return 200, '```json\n{"format": 4, "factuality": 4, "consistency": 4, "realism": 4, ' \
                '"quality": 4}\n```'

  srv = _Server(judge)
  out = tmp_path / "run"
  try:
    run_cli("judge", f"--data={bench}", f"--out={out}", f"--judge_endpoint={srv.url}",
            "--judge_model=j", "--judge_systems=theirs", "--drop_empty", "--noprogress",
            f"--import_predictions={tmp_path / 'predictions.jsonl'}", "--system=theirs")
  finally:
    srv.close()
  assert len(asked) == 2  # the empty generation was not sent to the judge
  from lwm_jax.eval import report  # the score step without its plots
  res = report.score_run(R.load_bench(bench), str(out))
  j = res["systems"]["theirs"]["judge"]
  assert j["domains"] == {"terminal": 75.0} and j["excluded"]["mcp"] == 1
  assert j["n_domains"] == 1 and j["partial"] and j["pooled_overall"] == 75.0
  md = report.markdown_report(res)
  assert "| theirs | 75.00 | 1 of 7 (partial) | 75.00 | 2 |" in md
  assert "| theirs | - (1 excl.) | 75.00 | **75.00** (1 of 7 domains) |" in md
  # the imported file is a byte copy, read but never appended to
  assert (out / "predictions" / "theirs.jsonl").read_bytes() == (
      tmp_path / "predictions.jsonl").read_bytes()


def test_overall_counts_its_domains():
  from lwm_jax.eval.metrics import aggregate
  five = dict(format=5, factuality=5, consistency=5, realism=5, quality=5)
  ones = dict(format=1, factuality=1, consistency=1, realism=1, quality=1)
  rows = [{"task": d, "scores": five} for d in domains.bench_domains()]
  rows += [{"task": "os", "scores": ones}] * 3  # os: (5 + 1 + 1 + 1) / 4 = 2 -> 25
  agg = aggregate(rows)
  assert agg["n_domains"] == 7 and not agg["partial"]
  assert agg["overall"] == pytest.approx((6 * 100 + 25) / 7)
  assert agg["pooled_overall"] == pytest.approx((7 * 100 + 0) / 10)  # 10 samples pooled
  rows.append({"task": "mcp", "scores": None})
  agg = aggregate([r for r in rows if r["task"] != "web"])
  assert agg["n_domains"] == 6 and agg["partial"]


def test_official_imports_count_what_they_cannot_keep(tmp_path, caplog):
  """Issue 68 (lesser): duplicate keys, unknown domains, out-of-range scores and misnamed
  dimensions were dropped or overwritten silently; now each is counted and logged."""
  import logging
  from lwm_jax.eval import official
  rows = _official_judged_rows()
  rows.append(dict(rows[0], gen="again"))                       # the same key twice
  rows.append(dict(rows[0], task="moon", id=7))                 # a domain we do not know
  rows[1].update(realism=9, Quality=3)                          # out of range; misnamed
  j = tmp_path / "judged.jsonl"
  _write_rows(j, rows)
  report = {}
  with caplog.at_level(logging.WARNING):
    official.read_judged(str(j), report=report)
  assert report == {"rows": 5, "duplicate_keys": 1, "unknown_domains": 1,
                    "out_of_range_scores": 1, "unknown_dimensions": 1}
  assert any("1 duplicate keys" in r.getMessage() and "judged.jsonl" in r.getMessage()
             for r in caplog.records)
  clean = {}
  _write_rows(j, _official_judged_rows())
  official.read_judged(str(j), report=clean)                     # the 0 marks are not counted
  assert clean == {"rows": 3, "duplicate_keys": 0, "unknown_domains": 0,
                   "out_of_range_scores": 0, "unknown_dimensions": 0}
