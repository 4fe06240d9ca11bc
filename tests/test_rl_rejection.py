"""Rejection sampling: which answer is kept (best usable above the threshold), retention counts per
domain, the output read back by the SFT pipeline (the teacher's reasoning lands in the target's
<think> block), n distinct choices from our Sampler, and the CLI against a stub OpenAI endpoint."""
from __future__ import annotations

import collections
import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from lwm_jax.data import pipeline, schema
from lwm_jax.data.bench_records import parse_action
from lwm_jax.rl import rejection
from lwm_jax.rl import rewards as R
from lwm_jax.sampling.backends import FunctionBackend, SamplerBackend
from lwm_jax.sampling.params import Generation
from tests.test_rl_pool import JSONL, fixture_trajs, train_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 3


def _reference_of(trajs):
  """action of the target turn -> (reference observation, domain), read off the prompt."""
  out = {}
  for t in trajs:
    k = pipeline.target_turn(t, SEED)
    out[t.turns[k].action] = (t.turns[k].observation, t.domain)
  return out


def _answer(kind, ref):
  if kind == "right_no_reasoning":
    return f"<think></think>\n<predicted_observation>{ref}</predicted_observation>"
  if kind == "wrong":
    return "<think>I guess it failed.</think>\n<predicted_observation>zzz qqq</predicted_observation>"
  if kind == "right":
    return (f"<think>The action reads state set earlier.</think>\n"
            f"<predicted_observation>{ref}</predicted_observation>")
  raise ValueError(kind)


class _Teacher:
  """Answers the i-th request for a prompt with `plan[i]`, looking the reference up by action."""

  def __init__(self, trajs, plan):
    self.refs, self.plan, self.seen = _reference_of(trajs), plan, collections.Counter()

  def __call__(self, messages):
    action = parse_action(messages[-1]["content"])
    ref, _ = self.refs[action]
    i = self.seen[action]
    self.seen[action] += 1
    return _answer(self.plan[i % len(self.plan)], ref)


def test_keeps_the_best_usable_answer_and_counts_retention():
  trajs = fixture_trajs()
  teacher = _Teacher(trajs, ["right_no_reasoning", "wrong", "right"])
  kept, stats = rejection.rejection_sample(trajs, FunctionBackend(teacher),
                                           R.make_reward("reference=1"), n=3, threshold=20,
                                           seed=SEED)
  refs = _reference_of(trajs)
  # Every prompt has a right answer with reasoning (the 3rd): all are kept, and the kept one is it
  # (the 1st is right too but has no reasoning).
  assert len(kept) == len(trajs) and stats["overall"]["retention"] == 1.0
  for rec in kept:
    t = rec.meta["target_turn"]
    assert t == pipeline.target_turn(rec, SEED)
    assert rec.meta["think"] == {str(t): "The action reads state set earlier."}
    assert rec.meta["rejection"]["prediction"] == refs[rec.turns[t].action][0].rstrip()
    assert rec.meta["rejection"]["reward"] == pytest.approx(25.0)
  domains = collections.Counter(t.domain for t in trajs)
  for d, n in domains.items():
    s = stats["domains"][d]
    assert (s["prompts"], s["samples"], s["kept"], s["no_reasoning"]) == (n, 3 * n, n, n)
  # Wrong answers only: nothing reaches the threshold; all rejected and counted.
  kept, stats = rejection.rejection_sample(
      trajs, FunctionBackend(_Teacher(trajs, ["wrong"])), R.make_reward("reference=1"), n=2,
      threshold=20, seed=SEED)
  assert kept == [] and stats["overall"]["rejected"] == len(trajs)
  assert stats["overall"]["retention"] == 0.0
  assert "overall" in rejection.format_stats(stats)


def test_select_rules():
  C = rejection.Candidate
  cands = [C("r", "why", "obs", reward=20.0), C("r", "why", "obs", reward=22.0),
           C("r", "why", "obs", reward=22.0), C("r", "", "obs", reward=25.0),
           C("r", "why", "", reward=25.0), C("", "", "", reward=25.0, error="boom")]
  assert rejection.select(cands, threshold=10) == 1  # best usable; earliest of a tie
  assert rejection.select(cands, threshold=23) is None
  # an endpoint's separate reasoning is put back in front of the answer
  from lwm_jax.sampling.backends import Completion
  c = rejection.candidate_of(Completion(
      text="<predicted_observation>ok</predicted_observation>", reasoning="think hard"))
  assert (c.reasoning, c.prediction) == ("think hard", "ok") and R.reply_parses(c.reply)


def test_output_is_read_back_by_the_sft_pipeline(tmp_path):
  trajs = fixture_trajs()
  kept, _ = rejection.rejection_sample(trajs, FunctionBackend(_Teacher(trajs, ["right"])),
                                       R.make_reward("rule=0.1,reference=0.9"), n=1,
                                       threshold=0, seed=SEED)
  path = tmp_path / "sft.jsonl"
  schema.write_jsonl(path, kept)
  back = list(schema.read_jsonl(path))
  tok = train_tokenizer(tmp_path)
  cfg = pipeline.default_data_config()
  cfg.update(dict(seq_len=4096, seed=SEED))
  for rec in back:
    t = rec.meta["target_turn"]
    sample = pipeline.sft_sample(rec, tok, cfg)
    w = sample["loss_weights"]
    target = tok.decode(sample["tokens"][w > 0].tolist())
    assert target.startswith("<think>The action reads state set earlier.</think>\n"
                             "<predicted_observation>"), target[:120]
    assert rec.turns[t].observation in target


def test_sampler_teacher_draws_n_distinct_choices():
  calls = []

  class FakeSampler:
    def generate(self, chunk, params):
      calls.append((len(chunk), params.n, params.temperature))
      return [Generation(text=f"<think>c{k}</think>\n<predicted_observation>x{k}"
                              f"</predicted_observation>", token_ids=[], logprobs=[],
                         finish_reason="stop")
              for _ in chunk for k in range(params.n)]

  convs = [[{"role": "user", "content": str(i)}] for i in range(5)]
  out = rejection.draw(SamplerBackend(FakeSampler(), batch_size=6), convs, 3, temperature=0.7)
  assert [len(o) for o in out] == [3] * 5
  assert calls == [(2, 3, 0.7), (2, 3, 0.7), (1, 3, 0.7)]  # 6 rows per call, 3 choices each
  assert [c.text for c in out[4]] == [f"<think>c{k}</think>\n<predicted_observation>x{k}"
                                      f"</predicted_observation>" for k in range(3)]


class _Stub(http.server.BaseHTTPRequestHandler):
  refs: dict = {}

  def do_POST(self):  # noqa: N802 - the http.server API
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    action = parse_action(body["messages"][-1]["content"])
    ref, _ = self.refs[action]
    msg = {"role": "assistant", "reasoning_content": "Recall the earlier state.",
           "content": f"<predicted_observation>{ref}</predicted_observation>"}
    data = json.dumps({"choices": [{"message": msg, "finish_reason": "stop"}]}).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *a):
    pass


def test_cli_against_an_openai_compatible_endpoint(tmp_path):
  _Stub.refs = _reference_of(fixture_trajs())
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
  th = threading.Thread(target=server.serve_forever, daemon=True)
  th.start()
  out = tmp_path / "rs.jsonl"
  try:
    res = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "rejection_sample.py"), f"--input={JSONL}",
         f"--output={out}", f"--teacher_endpoint=http://127.0.0.1:{server.server_port}/v1",
         "--teacher_model=stub", "--n=2", "--threshold=20", f"--seed={SEED}",
         "--reward=rule=0.1,reference=0.9"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  finally:
    server.shutdown()
  assert res.returncode == 0, res.stderr[-2000:]
  recs = list(schema.read_jsonl(out))
  stats = json.loads((tmp_path / "rs.jsonl.stats.json").read_text())
  assert stats["overall"]["prompts"] == len(fixture_trajs()) == stats["overall"]["samples"] // 2
  assert len(recs) == stats["overall"]["kept"] > 0
  assert all(next(iter(r.meta["think"].values())) == "Recall the earlier state." for r in recs)
  assert "overall" in res.stdout and f"wrote {len(recs)}" in res.stdout
