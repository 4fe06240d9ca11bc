"""The OpenAI-compatible server, driven by the official `openai` client against a real uvicorn
server on a loopback port. Answers are compared with direct greedy generation through the Python
API (itself checked against a no-cache reference in test_sampling.py) and with hand-cut strings."""
from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest
from flax import nnx

from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.background import BackgroundServer
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler
from lwm_jax.sampling.server import create_app
from tests.test_sampling import qwen_tokenizer_path

MODEL = "tiny-lwm"


@pytest.fixture(scope="module")
def served():
  tok = load_tokenizer(qwen_tokenizer_path())
  model = Transformer(get_preset("tiny", vocab_size=151936), rngs=nnx.Rngs(0))
  # Batches pad to 4, 8, 16 or 32 rows: a few more compilations than one 32-row shape, but a lone
  # request decodes 4 rows instead of 32 (each row's step spans Qwen's 152k-piece vocabulary).
  sampler = Sampler(model, tok, max_batch=32, min_batch_bucket=4)
  app = create_app(sampler, MODEL, max_batch=32, window_ms=30, default_max_tokens=16)
  with BackgroundServer(app) as server:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)
    yield sampler, client, server.url


def _chat(i: int) -> list[dict]:
  return [{"role": "system", "content": "You simulate a Linux terminal."},
          {"role": "user", "content": f"echo {i} && ls /tmp/dir{i}"}]


GREEDY = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)


def test_models_and_health(served):
  _, client, base = served
  assert [m.id for m in client.models.list().data] == [MODEL]
  assert httpx.get(base + "/health").json()["status"] == "ok"


def test_chat_equals_direct_greedy_and_streams_the_same(served):
  sampler, client, _ = served
  direct = sampler.generate([_chat(0)], GREEDY)[0]
  r = client.chat.completions.create(model=MODEL, messages=_chat(0), temperature=0, max_tokens=10,
                                     extra_body={"ignore_eos": True})
  assert r.choices[0].message.content == direct.raw_content
  assert r.choices[0].finish_reason == "length"
  assert r.usage.completion_tokens == 10
  assert r.usage.prompt_tokens == len(sampler.tokenizer.encode_chat(_chat(0), True))
  # Streaming: the deltas add up to the same reply.
  parts, finish = [], None
  for ch in client.chat.completions.create(model=MODEL, messages=_chat(0), temperature=0,
                                           max_tokens=10, stream=True,
                                           extra_body={"ignore_eos": True}):
    for c in ch.choices:
      parts.append(c.delta.content or "")
      finish = c.finish_reason or finish
  assert "".join(parts) == direct.raw_content and finish == "length"  # as generated, both ways


def test_completions_endpoint(served):
  sampler, client, _ = served
  direct = sampler.generate(["cat /etc/hostname"], GREEDY)[0]
  r = client.completions.create(model=MODEL, prompt="cat /etc/hostname", temperature=0,
                                max_tokens=10, extra_body={"ignore_eos": True})
  assert r.choices[0].text == direct.text == sampler.tokenizer.decode(direct.token_ids)


def test_n_choices_are_seeded_samples(served):
  sampler, client, _ = served
  r = client.chat.completions.create(model=MODEL, messages=_chat(1), temperature=1.0, n=3, seed=11,
                                     max_tokens=8, extra_body={"ignore_eos": True})
  assert [c.index for c in r.choices] == [0, 1, 2]
  direct = sampler.generate([_chat(1)], SamplingParams(temperature=1.0, n=3, seed=11,
                                                       max_new_tokens=8, ignore_eos=True))
  assert [c.message.content for c in r.choices] == [g.raw_content for g in direct]
  assert len({g.text for g in direct}) == 3  # different choices, not copies


def test_stop_strings(served):
  sampler, client, _ = served
  full = sampler.generate([_chat(2)], GREEDY)[0].text
  stop = full[6:9]
  expected = full[:full.find(stop)]
  r = client.chat.completions.create(model=MODEL, messages=_chat(2), temperature=0, max_tokens=10,
                                     stop=[stop], extra_body={"ignore_eos": True})
  assert r.choices[0].message.content == expected
  assert r.choices[0].finish_reason == "stop" and r.choices[0].stop_reason == stop


def test_bad_requests_get_400_and_the_server_keeps_serving(served):
  _, client, base = served
  with pytest.raises(openai.BadRequestError, match="temperature"):
    client.chat.completions.create(model=MODEL, messages=_chat(3), temperature=-1)
  with pytest.raises(openai.BadRequestError, match="context"):
    client.chat.completions.create(model=MODEL, max_tokens=4,
                                   messages=[{"role": "user", "content": "word " * 3000}])
  resp = httpx.post(base + "/v1/chat/completions", json={"messages": "not a list"})
  assert resp.status_code == 400 and "messages" in resp.json()["error"]["message"]
  resp = httpx.post(base + "/v1/chat/completions", content=b"{broken")
  assert resp.status_code == 400
  r = client.chat.completions.create(model=MODEL, messages=_chat(3), temperature=0, max_tokens=4)
  assert r.choices[0].finish_reason in ("stop", "length")


def test_32_concurrent_requests_are_batched_and_correct(served):
  sampler, client, base = served
  chats = [_chat(100 + i) for i in range(32)]
  direct = sampler.generate(chats, GREEDY)
  before = httpx.get(base + "/health").json()["batches"]

  def ask(i):
    return client.chat.completions.create(model=MODEL, messages=chats[i], temperature=0,
                                          max_tokens=10, extra_body={"ignore_eos": True})

  with concurrent.futures.ThreadPoolExecutor(32) as pool:
    answers = list(pool.map(ask, range(32)))
  assert [a.choices[0].message.content for a in answers] == [g.raw_content for g in direct]
  batches = httpx.get(base + "/health").json()["batches"] - before
  assert batches < 32  # requests that arrived together were decoded together


def test_sampler_from_hf_folder(served, tmp_path):
  import shutil
  from lwm_jax import hf
  sampler, _, _ = served
  hf.save_pretrained(sampler.model, str(tmp_path))
  shutil.copy(qwen_tokenizer_path(), tmp_path / "tokenizer.json")
  loaded = Sampler.from_checkpoint(str(tmp_path), max_batch=32, min_batch_bucket=4)
  a = loaded.generate([_chat(5)], GREEDY)[0]
  b = sampler.generate([_chat(5)], GREEDY)[0]
  assert a.token_ids == b.token_ids and len(a.token_ids) == 10
  assert a.text == loaded.tokenizer.decode(a.token_ids)
