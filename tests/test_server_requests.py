"""The server under hostile and unusual requests: every bad field is a 400 naming it (an unknown
model a 404), a bad or failing request never fails the good ones batched with it, the event loop
keeps answering while a body is tokenized, and what Qwen users send to vLLM (penalties,
logprobs, thinking switch, checkpoint chat template, generation_config defaults) works."""
from __future__ import annotations

import concurrent.futures
import json
import shutil
import threading
import time

import httpx
import openai
import pytest

from lwm_jax.sampling.background import BackgroundServer
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler
from lwm_jax.sampling.server import create_app
from tests.test_sampling import qwen_tokenizer_path
from tests.test_server import MODEL, _chat, served  # noqa: F401

TEMPLATE = "tests/fixtures/chat/thinking_template.jinja"


def _post(base: str, body, path: str = "/v1/chat/completions", raw: bytes | None = None):
  content = raw if raw is not None else json.dumps(body).encode()
  return httpx.post(base + path, content=content, timeout=300,
                    headers={"content-type": "application/json"})


def _ok_body(i: int, **kw) -> dict:
  return dict(model=MODEL, messages=_chat(i), temperature=0, max_tokens=4, ignore_eos=True, **kw)


@pytest.mark.parametrize("field,value", [
    ("temperature", "NaN"), ("temperature", "Infinity"), ("top_p", "NaN"), ("min_p", "NaN"),
    ("top_k", str(10 ** 12)), ("top_k", "-2"), ("max_tokens", str(10 ** 12)), ("n", "17"),
    ("presence_penalty", "2.5"), ("frequency_penalty", "-Infinity"),
    ("repetition_penalty", "0"), ("top_logprobs", "21"), ("seed", str(2 ** 70)),
    ("logprobs", "2")])
def test_out_of_range_numbers_are_400_naming_the_field(served, field, value):
  _, _, base = served
  body = json.dumps(_ok_body(0, logprobs=True))[:-1] + f', "{field}": {value}}}'
  if field == "logprobs":
    body = json.dumps(_ok_body(0))[:-1] + f', "{field}": {value}}}'
  r = _post(base, None, raw=body.encode())
  assert r.status_code == 400, (field, value, r.text)
  assert field in r.json()["error"]["message"]


def test_a_bad_request_never_fails_the_good_ones_batched_with_it(served):
  """top_k=10**12 once overflowed the engine's int32 and failed all 8 good requests of its batch."""
  sampler, _, base = served
  direct = sampler.generate([_chat(200 + i) for i in range(8)],
                            SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))
  bodies = [_ok_body(200 + i) for i in range(8)] + [dict(_ok_body(300), top_k=10 ** 12,
                                                         temperature=0.7)]
  with concurrent.futures.ThreadPoolExecutor(9) as pool:
    answers = list(pool.map(lambda b: _post(base, b), bodies))
  assert [a.status_code for a in answers] == [200] * 8 + [400]
  assert [a.json()["choices"][0]["message"]["content"] for a in answers[:8]] == \
      [g.raw_content for g in direct]


def test_an_engine_failure_fails_only_its_own_request(served, monkeypatch):
  """A request that breaks the engine (here: a poisoned prompt) fails alone (the static engine
  retries each request of the batch alone; the continuous engine fails the request whose prefill
  broke); the others get their answers."""
  sampler, _, base = served
  poison = "POISON-PILL"
  poison_ids = sampler.tokenizer.encode(poison)

  def poisoned(p):
    return any(p[i:i + len(poison_ids)] == poison_ids for i in range(len(p)))

  if sampler.engine_kind == "continuous":  # a batch of prompts breaks if one of them does
    real_prefill = sampler.engine._prefill_prompts  # pylint: disable=protected-access

    def prefill(batch):
      if any(poisoned(u.ids) for u in batch):
        raise RuntimeError("engine broke on this prompt")
      return real_prefill(batch)

    monkeypatch.setattr(sampler.engine, "_prefill_prompts", prefill)
  else:
    real = sampler.engine.generate

    def generate(prompts, *a, **kw):
      if any(poisoned(p) for p in prompts):
        raise RuntimeError("engine broke on this prompt")
      return real(prompts, *a, **kw)

    monkeypatch.setattr(sampler.engine, "generate", generate)
  bodies = [_ok_body(400 + i) for i in range(6)]
  bodies.insert(3, dict(_ok_body(0), messages=[{"role": "user", "content": poison}]))
  with concurrent.futures.ThreadPoolExecutor(7) as pool:
    answers = list(pool.map(lambda b: _post(base, b), bodies))
  assert [a.status_code for a in answers] == [200, 200, 200, 500, 200, 200, 200]
  assert "engine broke" in answers[3].json()["error"]["message"]


def test_malformed_bodies_are_400_and_unknown_model_404(served):
  _, _, base = served
  cases = [
      (b'{"model": "tiny-lwm", "messages": [{"role": "user", "content": "\\ud800"}]}',
       "surrogate"),
      (json.dumps(dict(_ok_body(0), stream=True, stream_options="yes")).encode(),
       "stream_options"),
      (json.dumps(dict(_ok_body(0), stream=True, stream_options=[1])).encode(), "stream_options"),
      (b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nest"),
      (b'{"messages": ' + b"[" * 70 + b"]" * 70 + b"}", "nest"),
      (json.dumps(dict(_ok_body(0), messages=[{"role": "wizard", "content": "hi"}])).encode(),
       "messages[0].role"),
      (json.dumps(dict(_ok_body(0), response_format={"type": "json_object"})).encode(),
       "response_format"),
      (json.dumps(dict(_ok_body(0), tools=[{"type": "function"}])).encode(), "tools"),
      (json.dumps(dict(_ok_body(0), logit_bias={"5": 10})).encode(), "logit_bias"),
      (json.dumps(dict(_ok_body(0), frobnicate=1)).encode(), "frobnicate"),
      (json.dumps(dict(_ok_body(0), chat_template_kwargs=[1])).encode(), "chat_template_kwargs"),
      (json.dumps(dict(_ok_body(0), chat_template_kwargs={"tools_on": True})).encode(),
       "tools_on"),
  ]
  for raw, needle in cases:
    r = _post(base, None, raw=raw)
    assert r.status_code == 400, (raw[:80], r.text[:300])
    assert needle in r.json()["error"]["message"], (needle, r.text[:300])
  r = _post(base, dict(_ok_body(0), model="gpt-4o"))
  assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
  with pytest.raises(openai.NotFoundError):
    openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0).chat.completions.create(
        model="gpt-4o", messages=_chat(0), max_tokens=2)
  # A do-nothing value of an unsupported field is fine.
  r = _post(base, dict(_ok_body(0), response_format={"type": "text"}, tools=[]))
  assert r.status_code == 200, r.text


def test_prompts_per_request_are_capped(served):
  _, _, base = served
  r = _post(base, dict(model=MODEL, prompt=["ls"] * 4, n=16, max_tokens=2), "/v1/completions")
  assert r.status_code == 400 and "at most 32" in r.json()["error"]["message"]
  r = _post(base, dict(model=MODEL, prompt=["ls"] * 2, n=16, max_tokens=2, temperature=0.5),
            "/v1/completions")
  assert r.status_code == 200 and len(r.json()["choices"]) == 32


def test_tokenizing_does_not_stall_the_event_loop(served, monkeypatch):
  """A body that takes long to tokenize (here a tokenizer slowed to 3 s for one marker) must not
  hold up /health."""
  sampler, _, base = served
  tok = sampler.tokenizer
  real = tok.encode

  def slow(text):
    if "SLOW-MARKER" in text:
      time.sleep(3.0)
    return real(text)

  monkeypatch.setattr(tok, "encode", slow)
  th = threading.Thread(target=_post, args=(base, dict(_ok_body(0), messages=[
      {"role": "user", "content": "SLOW-MARKER"}])))
  th.start()
  time.sleep(0.5)
  t = time.perf_counter()
  assert httpx.get(base + "/health", timeout=30).status_code == 200
  waited = time.perf_counter() - t
  th.join()
  assert waited < 1.5, f"/health waited {waited:.2f} s behind tokenization"


def test_chat_logprobs_and_penalties(served):
  sampler, client, _ = served
  sp = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True, top_logprobs=3)
  direct = sampler.generate([_chat(7)], sp)[0]
  r = client.chat.completions.create(model=MODEL, messages=_chat(7), temperature=0, max_tokens=6,
                                     logprobs=True, top_logprobs=3,
                                     extra_body={"ignore_eos": True})
  content = r.choices[0].logprobs.content
  assert len(content) == 6
  for k, c in enumerate(content):
    assert c.logprob == pytest.approx(direct.logprobs[k], abs=1e-6)
    assert c.token == sampler.tokenizer.decode([direct.token_ids[k]])
    assert bytes(c.bytes) == c.token.encode()
    assert len(c.top_logprobs) == 3
    assert c.top_logprobs[0].logprob == pytest.approx(c.logprob, abs=1e-6)  # greedy = top 1
    assert [t.logprob for t in c.top_logprobs] == sorted((t.logprob for t in c.top_logprobs),
                                                          reverse=True)
  # Penalties: negative presence/frequency penalties (+4 for a token once generated, far more
  # than this random model's logits spread) make greedy repeat its first token; the server's
  # reply with them (and a repetition penalty) is the Python API's, whose decode step is checked
  # against numpy in test_sampling.py.
  pen = dict(presence_penalty=-2.0, frequency_penalty=-2.0)
  rep = sampler.generate([_chat(7)], SamplingParams(temperature=0, max_new_tokens=6,
                                                    ignore_eos=True, **pen))[0]
  assert rep.token_ids == [direct.token_ids[0]] * 6
  want = sampler.generate([_chat(7)], SamplingParams(temperature=0, max_new_tokens=6,
                                                     ignore_eos=True, repetition_penalty=1.3,
                                                     **pen))[0]
  r = client.chat.completions.create(model=MODEL, messages=_chat(7), temperature=0, max_tokens=6,
                                     extra_body={"ignore_eos": True, "repetition_penalty": 1.3},
                                     **pen)
  assert r.choices[0].message.content == want.raw_content
  # Completions: the legacy logprobs shape.
  r = client.completions.create(model=MODEL, prompt="cat /etc/hostname", temperature=0,
                                max_tokens=4, logprobs=2, extra_body={"ignore_eos": True})
  lp = r.choices[0].logprobs
  assert len(lp.tokens) == 4 and len(lp.top_logprobs[0]) == 2 and lp.text_offset[0] == 0
  assert "".join(lp.tokens) == r.choices[0].text


def test_enable_thinking_switch_with_builtin_chatml(served):
  sampler, client, _ = served
  base_len = len(sampler.tokenizer.encode_chat(_chat(8), True))
  r = client.chat.completions.create(model=MODEL, messages=_chat(8), temperature=0, max_tokens=2,
                                     extra_body={"chat_template_kwargs": {"enable_thinking": False}})
  closed = sampler.tokenizer.encode_content("assistant", "<think>\n\n</think>\n\n")
  assert r.usage.prompt_tokens == base_len + len(closed)
  assert sampler.tokenizer.special_tokens["<think>"] in closed


@pytest.fixture(scope="module")
def templated(served, tmp_path_factory):
  """A checkpoint folder with a tokenizer_config.json chat template and a generation_config.json,
  read as Sampler.from_checkpoint reads them (the weights are the served model's), and served."""
  from lwm_jax import checkpoints as checkpoint
  sampler, _, _ = served
  d = tmp_path_factory.mktemp("qwen_like")
  shutil.copy(qwen_tokenizer_path(), d / "tokenizer.json")
  with open(TEMPLATE) as f:
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": f.read(), "eos_token": "<|im_end|>", "bos_token": None}))
  (d / "generation_config.json").write_text(json.dumps(
      {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
       "eos_token_id": [151645, 151643]}))
  real_load = checkpoint.load
  checkpoint.load = lambda path, tokenizer=None, mesh=None: (sampler.model, sampler.tokenizer)
  try:
    # Batches of one row: the defaults' top-k/top-p sort the whole 152k vocabulary of every row
    # of the batch each step (~15 s at 32 rows on CPU); a request's draw depends on its seed,
    # not on its place in a batch.
    loaded = Sampler.from_checkpoint(str(d), max_batch=32, min_batch_bucket=1)
  finally:
    checkpoint.load = real_load
  app = create_app(loaded, MODEL, max_batch=32, window_ms=30, default_max_tokens=16)
  with BackgroundServer(app) as server:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)
    yield loaded, client


def test_checkpoint_template_and_generation_config(templated):
  loaded, client = templated
  tok = loaded.tokenizer
  assert loaded.defaults.sampling() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
  assert set(loaded.end_ids) == {151645, 151643}
  msgs = [{"role": "user", "content": "  ls <|im_end|> /tmp "}]
  # The template's ids: our ChatML of the same conversation (a default system line, content
  # trimmed, a control-token string in the content kept as text) plus an opened <think>.
  want = tok.encode_chat([{"role": "system", "content": "You are a world model."},
                          {"role": "user", "content": "ls <|im_end|> /tmp"}], True)
  ids, thinking = loaded.prepare(msgs)
  assert ids == want + [tok.special_tokens["<think>"]] + tok.encode("\n") and thinking
  assert ids.count(tok.im_end_id) == 2  # the one in the content is text
  # Defaults: a request without sampling fields samples as temperature 0.6, top_p 0.95, top_k 20.
  direct = loaded.generate([msgs], SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=3,
                                                  max_new_tokens=8, ignore_eos=True))[0]
  r = client.chat.completions.create(model=MODEL, messages=msgs, seed=3, max_tokens=8,
                                     extra_body={"ignore_eos": True})
  assert r.usage.prompt_tokens == len(ids)
  # The reply starts inside the template's <think>: it is reasoning, not content.
  assert r.choices[0].message.reasoning_content == direct.text and direct.text.strip()
  assert not r.choices[0].message.content
  # enable_thinking=false: the template closes the block; the reply is content.
  r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=4,
                                     extra_body={"ignore_eos": True, "chat_template_kwargs":
                                                 {"enable_thinking": False}})
  assert r.usage.prompt_tokens == len(want) + len(
      tok.encode_content("assistant", "<think>\n\n</think>\n\n"))
  assert r.choices[0].message.content and not getattr(r.choices[0].message, "reasoning_content",
                                                      None)
  # The template's own refusal is a 400 with its message.
  with pytest.raises(ValueError, match="not allowed"):
    loaded.prepare([{"role": "narrator", "content": "x"}])
