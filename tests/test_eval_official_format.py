"""Our benchmark files and the official AgentWorldBench client's rules agree.

The official client (QwenLM/Qwen-AgentWorld, eval/eval.py) builds a model's messages from a record
as: the system prompt when not empty, then user/assistant pairs zip(prompt[:t], response[:t]) with
t = turn_idx - 1, then user = prompt[t]. It reads nothing else. `_official_messages` restates that
rule independently of our reader; every bundled record must give the same messages both ways.
"""
import json
import os

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
