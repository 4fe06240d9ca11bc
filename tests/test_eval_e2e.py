"""AgentWorldBench end to end over real HTTP: a stub world model and a stub judge, each a small
OpenAI-compatible server in a thread, then infer -> judge -> score through the CLI; and resume."""
import http.server
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from lwm_jax.data import bench_records as awb
from lwm_jax.data import schema
from lwm_jax.eval import inference as A
from lwm_jax.eval import records as R
from lwm_jax.sampling.backends import FunctionBackend, OpenAIBackend, SamplerBackend
from lwm_jax.eval.runner import JsonlCache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "SECRET-THOUGHT"


class _Server:
  """A threaded HTTP server answering POST /v1/chat/completions with `reply(body) -> (code, text)`."""

  def __init__(self, reply):
    self.requests = []
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      disable_nagle_algorithm = True  # headers and body go out as two writes

      def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        outer.requests.append(body)
        code, text = reply(body)
        if code == 200:
          data = json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": {
              "role": "assistant", "content": text}}]}).encode()
        else:
          data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


def _model_reply(body):
  """A tiny 'world model': echo commands print their argument, anything else repeats the last
  observation; it thinks first, as a thinking model does."""
  msgs = body["messages"]
  action = awb.parse_action(msgs[-1]["content"])
  m = re.match(r"echo (.*)", action)
  if m:
    obs = m.group(1)
  else:
    prev = [x["content"] for x in msgs if x["role"] == "assistant"]
    obs = awb.parse_observation(prev[-1]) if prev else ""
  return 200, f"<think>{SECRET}: simulate {action!r}</think>\n<predicted_observation>\n{obs}\n" \
              "</predicted_observation>"


FAIL_REPLY = "I would rather not give numbers."
MATCH_REPLY = ('Looks right.\n```json\n{"format": "5", "factuality": 5, "consistency": 5, '
               '"realism": 5, "quality": 5, "reason": "same"}\n```')
MISS_REPLY = ('{"format_score": 4, "factuality": 2, "consistency": 3, "realism": "4/5", '
              '"quality": 9, "reason": "differs"}')  # quality out of range -> sample mean 3.25


def _judge_reply(body):
  """Fixed JSON by case: empty prediction -> no verdict; equal to the reference -> all 5s; else
  the MISS scores. Hand-computed expectations below follow from these three replies."""
  user = body["messages"][-1]["content"]
  ref = re.search(r"<reference_observation>\n(.*)\n</reference_observation>", user, re.S).group(1)
  pred = re.search(r"<simulated_observation>\n(.*)\n</simulated_observation>", user, re.S).group(1)
  if not pred:
    return 200, FAIL_REPLY
  return 200, MATCH_REPLY if pred == ref else MISS_REPLY


def _write_bench(path):
  """terminal: 3 records of one trajectory; mcp: turn 2 of another; search: one record in the
  official layout (whole trajectory in prompt/response, turn_idx in the middle)."""
  term = schema.Trajectory(id="t", domain="terminal", task="", action_space="", initial_state="",
                           turns=[schema.Turn("echo hello", "hello"),
                                  schema.Turn("ls", "a.txt\nb.txt"),
                                  schema.Turn("echo bye", "bye")])
  mcp = schema.Trajectory(id="m", domain="mcp", task="", action_space="", initial_state="",
                          turns=[schema.Turn('{"tool": "list"}', '{"items": [1, 2]}'),
                                 schema.Turn('{"tool": "get", "id": 1}', '{"id": 1, "name": "x"}')])
  recs = awb.trajectory_to_records(term, "You simulate a shell.", [0, 1, 2])
  recs += awb.trajectory_to_records(mcp, "You simulate tools.", [1])
  acts = ["search cats", "open result", "search dogs"]
  obs = ["result one", "result two", "result three (future)"]
  recs.append(awb.AWBRecord(
      task="search", id="900", system_str="You simulate search.",
      prompt=[awb.format_action(i + 1, a) for i, a in enumerate(acts)],
      response=[awb.format_observation(o) for o in obs],
      current_prompt=awb.format_action(2, acts[1]), turn_idx=2, total_turns=3))
  awb.write_awb_jsonl(path, recs)
  return recs


def test_records_follow_turn_idx(tmp_path):
  recs = _write_bench(tmp_path / "bench.jsonl")
  official = recs[-1]
  assert R.ground_truth(official) == "result two"
  assert R.previous_observation(official) == "result one"
  msgs = R.chat_messages(official)
  assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
  assert "future" not in json.dumps(msgs)  # later turns never reach the model
  inference_only = awb.AWBRecord(task="os", id="1", system_str="", prompt=[], response=[],
                                 current_prompt="click", turn_idx=1, total_turns=1)
  assert R.ground_truth(inference_only) is None
  assert R.chat_messages(inference_only) == [{"role": "user", "content": "click"}]


def test_load_bench_errors(tmp_path):
  path = tmp_path / "x_test.jsonl"
  recs = _write_bench(path)
  with open(path, "a") as f:
    f.write(json.dumps(recs[0].to_dict()) + "\n")
  with pytest.raises(ValueError, match="duplicate record id 't#t1'"):
    R.load_bench(tmp_path)
  assert len(R.load_bench(tmp_path, domains=["mcp", "search"])) == 2
  assert len(R.load_bench(tmp_path, domains=["terminal"], limit_per_domain=2)) == 2


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_end_to_end_cli(tmp_path):
  bench = tmp_path / "bench" / "all_test.jsonl"
  bench.parent.mkdir()
  _write_bench(bench)
  model, judge_srv = _Server(_model_reply), _Server(_judge_reply)
  out = tmp_path / "run"
  try:
    cmd = [sys.executable, os.path.join(REPO, "evals", "agentworldbench.py"), "all",
           f"--data={bench.parent}", f"--out={out}", f"--endpoint={model.url}", "--model=stub/lwm",
           f"--judge_endpoint={judge_srv.url}", "--judge_model=stub-judge", "--noprogress",
           "--concurrency=3", "--judge_concurrency=2", "--max_tokens=256"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
  finally:
    model.close()
    judge_srv.close()
  # the model got the protocol the paper's client sends
  assert len(model.requests) == 5
  assert all(r["temperature"] == 0.6 and r["max_tokens"] == 256 and r["model"] == "stub/lwm"
             for r in model.requests)
  # thinking never reaches the judge
  assert not any(SECRET in json.dumps(r) for r in judge_srv.requests)
  # 5 + 5 + 5 judged samples; empty predictions are asked 3 times (2 retries): model 0,
  # copy_previous 1 (first terminal turn), empty 5
  assert len(judge_srv.requests) == 15 + 2 * (0 + 1 + 5)

  res = json.load(open(out / "scores.json"))
  sysres = res["systems"]
  assert list(sysres) == ["stub__lwm", "copy_previous", "empty"]
  # hand-computed: terminal samples 5, 3.25, 5 -> mean 4.41667 -> 85.4167; mcp, search 3.25 -> 56.25
  j = sysres["stub__lwm"]["judge"]
  assert j["domains"] == pytest.approx({"mcp": 56.25, "search": 56.25, "terminal": 85.416667})
  assert j["overall"] == pytest.approx((85.416667 + 56.25 + 56.25) / 3)
  assert j["excluded"] == {"mcp": 0, "search": 0, "terminal": 0}
  c = sysres["copy_previous"]["judge"]  # the first terminal turn is empty -> excluded, counted
  assert c["domains"] == pytest.approx({"mcp": 56.25, "search": 56.25, "terminal": 56.25})
  assert c["excluded"]["terminal"] == 1 and c["counts"]["terminal"] == 2
  e = sysres["empty"]["judge"]
  assert e["domains"] == {} and e["overall"] is None
  assert e["excluded"] == {"mcp": 1, "search": 1, "terminal": 3}
  # judge-free: the model echoes correctly on 2 of 3 terminal turns; copies elsewhere
  f = sysres["stub__lwm"]["free"]
  assert f["exact"]["domains"] == pytest.approx({"mcp": 0.0, "search": 0.0, "terminal": 200 / 3})
  assert f["token_f1"]["domains"]["terminal"] == pytest.approx(200 / 3)
  assert sysres["empty"]["free"]["exact"]["overall"] == 0.0
  md = (out / "scores.md").read_text()
  assert "| System | MCP | Search | Term. | **Overall** |" in md
  assert "| empty | - (1 excl.) | - (1 excl.) | - (3 excl.) | **-** |" in md
  for metric in ("judge", "exact", "token_f1", "edit_sim"):
    assert (out / f"scores_{metric}.png").stat().st_size > 1000
  # predictions hold the parsed observation only, the raw reply kept beside it
  preds = A.load_rows(A.predictions_path(str(out), "stub/lwm"))
  assert preds["search:900"]["prediction"] == "result one"
  assert SECRET in preds["search:900"]["raw"]


def test_resume_after_http_errors(tmp_path):
  recs = _write_bench(tmp_path / "b.jsonl")
  healthy = {"on": False}

  def flaky(body):
    if not healthy["on"] and "ls" in body["messages"][-1]["content"]:
      return 503, "busy"
    return _model_reply(body)

  srv = _Server(flaky)
  path = str(tmp_path / "p.jsonl")
  try:
    backend = OpenAIBackend(srv.url, "m", concurrency=2, retries=1, backoff_s=0.01)
    stats = A.run_inference(recs, backend, path, progress=False)
    assert (stats.done, stats.errors) == (4, 1)  # failure recorded, not fatal
    assert len(srv.requests) == 4 + 2  # 4 good, 1 bad tried twice
    assert os.path.exists(path + ".errors.jsonl")
    healthy["on"] = True
    srv.requests.clear()
    stats = A.run_inference(recs, backend, path, progress=False)
    assert (stats.cached, stats.done, stats.errors) == (4, 1, 0)
    assert len(srv.requests) == 1  # only the unfinished sample was redone
  finally:
    srv.close()


def test_resume_after_interruption(tmp_path):
  recs = _write_bench(tmp_path / "b.jsonl")
  calls = []

  def dies_after_two(msgs):
    if len(calls) == 2:
      raise KeyboardInterrupt  # the run is killed mid-way
    calls.append(msgs[-1]["content"])
    return "<predicted_observation>x</predicted_observation>"

  path = str(tmp_path / "p.jsonl")
  with pytest.raises(KeyboardInterrupt):
    A.run_inference(recs, FunctionBackend(dies_after_two), path, progress=False)
  with open(path, "a") as f:  # a line torn by the kill
    f.write('{"key": "search:900", "pred')
  cache = JsonlCache(path)
  assert len(cache.rows) == 2 and cache.torn_lines == 1
  calls.clear()
  stats = A.run_inference(recs, FunctionBackend(lambda m: calls.append(1) or "y"), path,
                          progress=False)
  assert (stats.cached, stats.done) == (2, 3) and len(calls) == 3
  rows = A.load_rows(path)
  assert sorted(r["prediction"] for r in rows.values()) == ["x", "x", "y", "y", "y"]


def test_sampler_backend_contract():
  """The adapter for lwm_jax.sampling.Sampler: generate(list of message lists, params)."""

  class Result:
    def __init__(self, text):
      self.text = text

  class FakeSampler:
    def __init__(self):
      self.calls = []

    def generate(self, convs, params):
      self.calls.append((len(convs), params))
      if any("boom" in c[-1]["content"] for c in convs):
        raise RuntimeError("device error")
      return [Result(f"<think>t</think>{c[-1]['content']}!") for c in convs]

  fake = FakeSampler()
  backend = SamplerBackend(fake, batch_size=2, temperature=0.6, max_new_tokens=64, seed=7,
                           make_params=lambda **kw: kw)
  convs = [[{"role": "user", "content": c}] for c in ("a", "b", "boom", "d", "e")]
  out = dict(backend.complete_many(convs))
  assert [n for n, _ in fake.calls] == [2, 2, 1]
  assert fake.calls[1][1] == {"temperature": 0.6, "max_new_tokens": 64, "seed": 8}
  assert out[0].text == "<think>t</think>a!" and out[4].text == "<think>t</think>e!"
  assert isinstance(out[2], RuntimeError) and isinstance(out[3], RuntimeError)


def test_http_client_errors_fail_fast_and_reasoning_is_no_prediction(tmp_path):
  recs = _write_bench(tmp_path / "b.jsonl")[:1]
  srv = _Server(lambda body: (400, "bad request"))
  try:
    stats = A.run_inference(recs, OpenAIBackend(srv.url, "m", retries=3, backoff_s=0.01),
                            str(tmp_path / "p.jsonl"), progress=False)
    assert stats.errors == 1 and len(srv.requests) == 1  # a 4xx other than 429 is not retried
  finally:
    srv.close()

  class ReasoningOnly(FunctionBackend):
    def complete(self, messages):
      from lwm_jax.sampling.backends import Completion
      return Completion(text="", reasoning="thinking <predicted_observation>hello"
                                           "</predicted_observation> more thinking")

  path = str(tmp_path / "q.jsonl")
  A.run_inference(recs, ReasoningOnly(None), path, progress=False)
  # the official rule: a block written inside the reasoning is reasoning, not a prediction
  assert A.load_rows(path)["terminal:t#t1"]["prediction"] == ""
