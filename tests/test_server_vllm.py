"""The server as vLLM users expect it (issue 66): text as generated in both modes, vLLM's request
fields (min_tokens, stop_token_ids, include_stop_str_in_output, add_generation_prompt,
continue_final_message, a request chat_template, the developer role, lax numbers, streamed
logprobs), max_tokens errors, generation_config's max_new_tokens as the default, stop_reason, added
tokens in /v1/completions prompts, and the endpoints /tokenize, /detokenize, /version,
/v1/models/{id}, /metrics and /ping. A tiny random model with the shipped world model's tokenizer
folder (its 2,048-piece vocabulary keeps the steps cheap)."""
from __future__ import annotations

import json
import os
import shutil

import httpx
import openai
import pytest
from flax import nnx

from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.background import BackgroundServer
from lwm_jax.sampling.chat_template import ChatTemplate, GenerationDefaults, chatml_ids
from lwm_jax.sampling.openai_request import BadRequest, parse_request
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler
from lwm_jax.sampling.server import create_app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "data", "world_model")
MODEL = "tiny-sp"
GEN_DEFAULT = 7  # generation_config.json max_new_tokens of the served folder
CHAT = [{"role": "system", "content": "You simulate a Linux terminal."},
        {"role": "user", "content": "ls -la /tmp"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  folder = tmp_path_factory.mktemp("folder")
  for f in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(SHIPPED, f), folder / f)
  gen = json.load(open(os.path.join(SHIPPED, "generation_config.json")))
  (folder / "generation_config.json").write_text(json.dumps(gen | {"max_new_tokens": GEN_DEFAULT}))
  tok = load_tokenizer(str(folder))
  cfg = get_preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=512)
  sampler = Sampler(Transformer(cfg, rngs=nnx.Rngs(0)), tok,
                    chat_template=ChatTemplate.from_folder(tok, str(folder)),
                    defaults=GenerationDefaults.from_folder(str(folder)), max_batch=4,
                    min_batch_bucket=4, min_prompt_bucket=128, chunk_steps=8)
  app = create_app(sampler, MODEL, max_batch=4, window_ms=5)
  with BackgroundServer(app) as server:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)
    yield sampler, client, server.url


def _post(base, path, body):
  return httpx.post(base + path, json=body, timeout=300)


GREEDY = dict(model=MODEL, messages=CHAT, temperature=0, extra_body={"ignore_eos": True})


def test_text_as_generated_in_both_modes_and_stop_reason(served):
  sampler, client, _ = served
  full = sampler.generate([CHAT], SamplingParams(temperature=0, max_new_tokens=24,
                                                 ignore_eos=True))[0].text
  # A stop string right after whitespace: the text before it ends with that whitespace.
  at = next(i for i in range(1, len(full) - 2) if full[i - 1].isspace()
            and not full[i].isspace() and full.find(full[i:i + 2]) == i)
  stop = full[at:at + 2]
  r = client.chat.completions.create(max_tokens=24, stop=[stop], **GREEDY)
  assert r.choices[0].message.content == full[:at] and full[:at] != full[:at].strip()
  assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == stop
  parts, reasons = [], []
  for c in client.chat.completions.create(max_tokens=24, stop=[stop], stream=True, **GREEDY):
    if c.choices:
      parts.append(c.choices[0].delta.content or "")
      reasons.append((c.choices[0].model_extra or {}).get("stop_reason"))
  assert "".join(parts) == full[:at] and reasons[-1] == stop
  # include_stop_str_in_output keeps it; completions report it too.
  extra = {"ignore_eos": True, "include_stop_str_in_output": True}
  r = client.chat.completions.create(max_tokens=24, stop=[stop], **(GREEDY | {"extra_body": extra}))
  assert r.choices[0].message.content == full[:at + 2]


def test_stop_token_ids_and_min_tokens(served):
  sampler, client, _ = served
  g = sampler.generate([CHAT], SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))[0]
  third = g.token_ids[2]
  k = g.token_ids.index(third)  # its first occurrence ends the reply
  r = client.chat.completions.create(max_tokens=8, **(GREEDY | {"extra_body": {
      "ignore_eos": True, "stop_token_ids": [third]}}))
  assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == third
  assert r.usage.completion_tokens == k + 1
  # min_tokens: the first token may not be a stop id, so a stop id that greedy decoding picks
  # first is skipped: the reply is the greedy reply with that token banned at step 1.
  first = g.token_ids[0]
  want = sampler.engine.generate([sampler.encode_prompt(CHAT)],
                                 [SamplingParams(temperature=0, max_new_tokens=3, min_tokens=3)],
                                 [[first]])[0]
  r = client.chat.completions.create(max_tokens=3, **(GREEDY | {"extra_body": {
      "ignore_eos": True, "stop_token_ids": [first], "min_tokens": 3}}))
  assert r.usage.completion_tokens == 3 and want.token_ids[0] != first
  assert r.choices[0].message.content == sampler.tokenizer.decode(want.token_ids)
  with pytest.raises(openai.BadRequestError, match="min_tokens"):
    client.chat.completions.create(max_tokens=3, **(GREEDY | {"extra_body": {"min_tokens": 4}}))


def test_max_tokens_limit_and_generation_config_default(served):
  sampler, client, _ = served
  n = len(sampler.encode_prompt(CHAT))
  with pytest.raises(openai.BadRequestError, match=f"context is 512 tokens and the prompt takes "
                                                   f"{n}, which leaves room for {512 - n}"):
    client.chat.completions.create(max_tokens=512 - n + 1, **GREEDY)
  r = client.chat.completions.create(max_tokens=512 - n, **GREEDY)  # exactly fits
  assert r.usage.completion_tokens == 512 - n
  r = client.chat.completions.create(**GREEDY)  # no max_tokens: generation_config's 7
  assert r.usage.completion_tokens == GEN_DEFAULT and r.choices[0].finish_reason == "length"


def test_special_tokens_in_a_completions_prompt_are_their_ids(served):
  sampler, client, base = served
  tok = sampler.tokenizer
  text = tok.chat_text(CHAT, add_generation_prompt=True)
  r = client.completions.create(model=MODEL, prompt=text, max_tokens=2, temperature=0,
                                extra_body={"ignore_eos": True})
  assert r.usage.prompt_tokens == len(chatml_ids(tok, CHAT))
  chat = client.chat.completions.create(max_tokens=2, **GREEDY)
  assert r.choices[0].text == chat.choices[0].message.content
  t = _post(base, "/tokenize", {"prompt": text}).json()
  assert t["tokens"] == chatml_ids(tok, CHAT) and t["count"] == len(t["tokens"])
  assert t["max_model_len"] == 512


def test_tokenize_detokenize_chat_options_and_roles(served):
  sampler, _, base = served
  tok = sampler.tokenizer
  ids = _post(base, "/tokenize", {"messages": CHAT}).json()["tokens"]
  assert ids == chatml_ids(tok, CHAT)
  assert _post(base, "/detokenize", {"tokens": ids}).json()["prompt"] == tok.chat_text(CHAT, True)
  dev = [{"role": "developer", "content": CHAT[0]["content"]}, CHAT[1]]
  assert _post(base, "/tokenize", {"messages": dev}).json()["tokens"] == ids
  no_gen = _post(base, "/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()
  assert no_gen["tokens"] == tok.encode_chat(CHAT)
  cont = CHAT + [{"role": "assistant", "content": "total 0\ndrwx"}]
  r = _post(base, "/tokenize", {"messages": cont, "add_generation_prompt": False,
                                "continue_final_message": True}).json()
  assert tok.decode(r["tokens"]) == tok.chat_text(cont)[:-len("<|im_end|>\n")]
  own = _post(base, "/tokenize", {"messages": CHAT, "chat_template":
                                  "{% for m in messages %}[{{ m.content }}]{% endfor %}"}).json()
  assert own["tokens"] == tok.encode("[You simulate a Linux terminal.][ls -la /tmp]")
  bad = _post(base, "/detokenize", {"tokens": [tok.vocab_size]})
  assert bad.status_code == 400 and "outside the vocabulary" in bad.text
  both = _post(base, "/v1/chat/completions", {"messages": CHAT, "continue_final_message": True})
  assert both.status_code == 400 and "continue_final_message" in both.text


def test_fields_vllm_accepts(served):
  _, client, base = served
  body = {"model": MODEL, "messages": CHAT, "temperature": "0", "max_tokens": "3",
          "ignore_eos": "true", "skip_special_tokens": False, "reasoning_effort": "low",
          "parallel_tool_calls": True, "metadata": {"run": "a"}, "user": "u1",
          "spaces_between_special_tokens": True, "seed": 4.0}
  r = _post(base, "/v1/chat/completions", body)
  assert r.status_code == 200, r.text
  same = client.chat.completions.create(max_tokens=3, seed=4, **GREEDY)
  assert r.json()["choices"][0]["message"]["content"] == same.choices[0].message.content
  r = _post(base, "/v1/chat/completions", body | {"response_format": {"type": "json_object"}})
  assert r.status_code == 400 and "does not constrain generation to JSON" in r.text
  # Streamed logprobs: the same values as without streaming, with the choice's last chunk.
  lp = client.chat.completions.create(max_tokens=3, logprobs=True, top_logprobs=2, **GREEDY)
  got = [c for c in client.chat.completions.create(max_tokens=3, logprobs=True, top_logprobs=2,
                                                   stream=True, **GREEDY)
         if c.choices and c.choices[0].logprobs is not None]
  assert len(got) == 1
  assert [t.logprob for t in got[0].choices[0].logprobs.content] == \
      [t.logprob for t in lp.choices[0].logprobs.content]


def test_lax_numbers_as_pydantic_reads_them():
  def parse(**kw):
    return parse_request({"messages": CHAT, **kw}, True, "m", 16, 8)
  p = parse(temperature="0.5", top_k="20", max_tokens=12.0, stream="false", logprobs=1).params
  assert (p.temperature, p.top_k, p.max_new_tokens) == (0.5, 20, 12)
  for kw, field in [({"max_tokens": 12.5}, "max_tokens"), ({"temperature": "warm"}, "temperature"),
                    ({"stream": "maybe"}, "stream"), ({"logprobs": 2}, "logprobs"),
                    ({"metadata": {"a": 1}}, "metadata"), ({"user": 5}, "user")]:
    with pytest.raises(BadRequest, match=field):
      parse(**kw)


def test_endpoints_version_models_ping_metrics(served):
  _, client, base = served
  assert httpx.get(base + "/version").json()["version"]
  card = httpx.get(base + f"/v1/models/{MODEL}").json()
  assert card["id"] == MODEL and card["max_model_len"] == 512
  assert httpx.get(base + "/v1/models/other").status_code == 404
  assert httpx.get(base + "/ping").status_code == 200 and httpx.post(base + "/ping").status_code == 200

  def scrape() -> dict[str, float]:
    out = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
      if line and not line.startswith("#"):
        k, v = line.rsplit(" ", 1)
        out[k] = float(v)
    return out
  before = scrape()
  r = client.chat.completions.create(max_tokens=5, **GREEDY)
  after = scrape()
  lab = '{model_name="tiny-sp"}'
  assert after["vllm:prompt_tokens_total" + lab] - before["vllm:prompt_tokens_total" + lab] == \
      r.usage.prompt_tokens
  assert after["vllm:generation_tokens_total" + lab] - \
      before["vllm:generation_tokens_total" + lab] == 5
  assert after["vllm:e2e_request_latency_seconds_count" + lab] - \
      before["vllm:e2e_request_latency_seconds_count" + lab] == 1
  ok = 'vllm:http_requests_total{endpoint="/v1/chat/completions",model_name="tiny-sp",status="200"}'
  assert after[ok] - before.get(ok, 0) == 1
  assert after["vllm:num_requests_waiting" + lab] == 0


def test_readiness_gates_health_and_generation_then_background_warmup(served):
  from lwm_jax.sampling.server import BackgroundWarmup  # pylint: disable=import-outside-toplevel
  sampler, _, _ = served
  state = {"ok": False}
  app = create_app(sampler, MODEL, max_batch=4, window_ms=5,
                   ready=lambda: (state["ok"], "compiling warm-up shapes (0 of 1 before ready)"))
  with BackgroundServer(app) as server:
    h = httpx.get(server.url + "/health")
    assert h.status_code == 503 and h.json()["status"] == "loading"
    assert httpx.get(server.url + "/ping").status_code == 503
    r = _post(server.url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert r.status_code == 503 and "not ready" in r.text
    state["ok"] = True
    assert httpx.get(server.url + "/health").status_code == 200
    assert _post(server.url, "/v1/chat/completions",
                 {"messages": CHAT, "max_tokens": 2}).status_code == 200
  plans = sampler.engine.warmup_plans(16, [4], batch_sizes=[4])
  warm = BackgroundWarmup(sampler, plans[:1], plans[1:])
  assert warm.state()[0] is False
  warm.start()._thread.join(timeout=300)  # pylint: disable=protected-access
  assert warm.state() == (True, "") and warm.done == len(plans) and warm.error is None


def test_background_warmup_waits_for_requests_in_flight_and_lends_larger_shapes():
  """Between shapes, the background warm-up waits (up to YIELD_S) while the engine has requests
  in flight, and lets the engine run calls in larger compiled shapes only while it works."""
  import time
  from lwm_jax.sampling.server import BackgroundWarmup  # pylint: disable=import-outside-toplevel

  class Engine:
    reuse_larger_shapes = False

    def __init__(self):
      self.until = time.monotonic() + 0.6
      self.log = []

    def busy(self):
      return time.monotonic() < self.until

    def warmup_plan(self, plan):
      self.log.append((plan, self.reuse_larger_shapes, self.busy()))

    compile_plan = warmup_plan

  class S:
    engine = Engine()

  warm = BackgroundWarmup(S, ["first"], ["a", "b"])
  warm.start()._thread.join(timeout=30)  # pylint: disable=protected-access
  log = S.engine.log
  assert [p for p, _, _ in log] == ["first", "a", "b"] and all(r for _, r, _ in log)
  assert log[0][2] and not log[1][2]  # ready at once; the rest after the request finished
  assert S.engine.reuse_larger_shapes is False and warm.state() == (True, "")
  S.engine.until = float("inf")  # a request that never ends holds each shape up YIELD_S only
  BackgroundWarmup.YIELD_S, old = 0.2, BackgroundWarmup.YIELD_S
  try:
    t = time.monotonic()
    BackgroundWarmup(S, [], ["c", "d"]).start()._thread.join(timeout=30)  # pylint: disable=protected-access
    assert 0.4 <= time.monotonic() - t < 5 and [p for p, _, _ in S.engine.log[-2:]] == ["c", "d"]
  finally:
    BackgroundWarmup.YIELD_S = old
