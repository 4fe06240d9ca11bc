"""Our judge run with --official_client against the official client's own judge run: the requests
they send, byte for byte, and the scores they read from the same replies.

Needs a checkout of QwenLM/Qwen-AgentWorld (nothing of it is copied; it runs from where it is).
Both sides judge the same predictions of the bundled benchmark (N records per domain, a generation
with thinking and an answer block per record): the official `run_judge` with a client object that
records each request and answers from a fixed list of judge replies, and our `run_judging` with
`official_client_style(DIR)` and a backend that does the same. The replies include the cases where
parsers differ (single-quoted and unquoted keys, -2, booleans, out-of-range and unreadable values).
Our parser without the checkout (`--judge_style=official`) reads the same replies for comparison.

  python tools/official_judge_requests.py --official=/path/to/Qwen-AgentWorld \\
      --out=benchmarks/results/official_judge_requests.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from lwm_jax import judge as judge_lib
from lwm_jax.data.bench_records import read_awb_jsonl
from lwm_jax.eval import judge as eval_judge
from lwm_jax.eval import records as R
from lwm_jax.eval.official_client import import_file, official_client_style
from lwm_jax.sampling.backends import Backend, Completion

DOMAINS = ("mcp", "search", "terminal", "swe", "android", "web", "os")
SCORES = '"format": {}, "factuality": {}, "consistency": {}, "realism": {}, "quality": {}'
REPLIES = [
    "<think>fine</think>Good.\n<final_evaluation>\n```json\n{{\"strengths\": [\"a\"], "
    "\"weaknesses\": [\"b\"], \"scores\": {{" + SCORES.format(4, 3, 5, 4, 2) + "}}}}\n```\n"
    "</final_evaluation>",
    "<final_evaluation>{{'scores': {{'format': 4, 'factuality': 3, 'consistency': 5, "
    "'realism': 4, 'quality': 2}}}}</final_evaluation>",
    "<final_evaluation>{{scores: {{format: 4, factuality: 3, consistency: 5, realism: 4, "
    "quality: 2,}},}}</final_evaluation>",
    "<final_evaluation>```json\n{{\"scores\": {{" + SCORES.format(-2, "true", 9, '"3/5"', '"bad"')
    + "}}}}\n```</final_evaluation>",
    "<final_evaluation>{{\"scores\": {{" + SCORES.format(2.5, 3.5, 0, 1, 5) + "}}}}"
    "</final_evaluation>",
    "I cannot grade this.",
]
REPLIES = [r.replace("{{", "{").replace("}}", "}") for r in REPLIES]


def _gen(rec, k: int) -> str:
  truth = R.ground_truth(rec) or ""
  body = truth if k % 3 else truth[: len(truth) // 2] + "\n(cut)"
  return (f"<think>\nreasoning about turn {rec.turn_idx}\n</think>\n\n"
          f"<predicted_observation>\n**Environment Observation:**\n{body}\n"
          "</predicted_observation>")


def load_official(root: str):
  return import_file(os.path.join(root, "eval", "eval.py"), "official_eval",
                     fresh=("lwm_eval_utils",))


class _Recorder:
  """An OpenAI-client look-alike for the official run_judge: records, answers in turn."""

  def __init__(self):
    self.requests, self.n = [], 0
    self.chat = types.SimpleNamespace(completions=types.SimpleNamespace(create=self._create))

  def _create(self, **kw):
    self.requests.append(kw["messages"])
    text = REPLIES[self.n % len(REPLIES)]
    self.n += 1
    msg = types.SimpleNamespace(content=text)
    return types.SimpleNamespace(choices=[types.SimpleNamespace(message=msg)])


class _RecordingBackend(Backend):
  name = "recorder"

  def __init__(self, order):
    self.order, self.requests = order, []

  def complete(self, messages):
    self.requests.append(messages)
    # The reply the official run got for the same request (the first one for a request it
    # never sent: such a request counts as different below).
    return Completion(text=REPLIES[self.order.get(json.dumps(messages), 0) % len(REPLIES)])


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--official", required=True, help="root of the official client's checkout")
  ap.add_argument("--official_commit", default="", help="the checkout's commit, for the record")
  ap.add_argument("--per_domain", type=int, default=3)
  ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results",
                                                "official_judge_requests.json"))
  a = ap.parse_args()
  recs = []
  for d in DOMAINS:
    recs += list(read_awb_jsonl(os.path.join(REPO, "evals", "mini_bench",
                                              f"{d}_test.jsonl")))[:a.per_domain]
  gens = [_gen(r, k) for k, r in enumerate(recs)]

  # The official client's own judge loop.
  official = load_official(a.official)
  rec_client = _Recorder()
  jobs = [dict(r.to_dict(), gen=g) for r, g in zip(recs, gens)]
  judged = official.run_judge(jobs, rec_client, "judge", max_retries=1)
  theirs = rec_client.requests

  # Ours: run_judging with the client's code loaded from the checkout.
  style = official_client_style(a.official)
  preds = {R.record_key(r): {"key": R.record_key(r), "task": R.domain(r), "id": r.id,
                             "prediction": "", "raw": g} for r, g in zip(recs, gens)}
  order = {json.dumps(m): i for i, m in enumerate(theirs)}
  backend = _RecordingBackend(order)
  with tempfile.TemporaryDirectory() as tmp:
    eval_judge.run_judging(recs, preds, backend, os.path.join(tmp, "judged.jsonl"), retries=0,
                           style=style, progress=False)
    rows = {}
    with open(os.path.join(tmp, "judged.jsonl")) as f:
      for line in f:
        row = json.loads(line)
        rows[row["key"]] = row
  ours = {json.dumps(m) for m in backend.requests}
  same = sum(json.dumps(m) in ours for m in theirs)
  # Our own wording of the official layout (--judge_style=official without the checkout).
  reworded = judge_lib.make_style("official", os.path.join(a.official, "prompts"))
  reworded_same = sum(
      json.dumps(eval_judge.judge_messages(r, judge_lib.strip_marker(g), R.ground_truth(r),
                                           style=reworded)) in {json.dumps(m) for m in theirs}
      for r, g in zip(recs, gens))

  # Scores read from the same replies: the client's, ours through its code, ours without it.
  score_rows = []
  for k, (r, job) in enumerate(zip(recs, judged)):
    row = rows[R.record_key(r)]
    own = judge_lib.parse_official_reply(REPLIES[k % len(REPLIES)])
    client = None if job.get("failed") else {d: job[d] for d in judge_lib.DIMENSIONS}
    score_rows.append({"key": R.record_key(r), "reply": k % len(REPLIES), "client": client,
                       "ours_with_client_code": row["scores"],
                       "ours_without_client": own["scores"] if own else None})
  agree_code = sum(s["client"] == s["ours_with_client_code"] for s in score_rows)
  agree_own = sum(s["client"] == s["ours_without_client"] for s in score_rows)
  out = {"official_checkout": os.path.abspath(a.official), "official_commit": a.official_commit,
         "records": len(recs),
         "requests_official": len(theirs), "requests_ours": len(backend.requests),
         "identical_requests": same, "identical_requests_our_wording": reworded_same, "request_bytes": [len(json.dumps(x)) for x in theirs],
         "scores_agree_with_client_code": agree_code, "scores_agree_without_client": agree_own,
         "scores": score_rows}
  os.makedirs(os.path.dirname(a.out), exist_ok=True)
  with open(a.out, "w") as f:
    json.dump(out, f, indent=1)
  print(f"{same} of {len(theirs)} judge requests byte-identical ({len(recs)} records, "
        f"{len(DOMAINS)} domains; {reworded_same} with our wording, no --official_client); "
        f"scores equal to the client's on {agree_code}/{len(score_rows)} "
        f"(its code), {agree_own}/{len(score_rows)} (our official parser) -> {a.out}")


if __name__ == "__main__":
  main()
