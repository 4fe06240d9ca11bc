"""Checkpoint chat templates (jinja2, as transformers renders them), generation_config.json
defaults, and how a request body picks them up; no model involved."""
from __future__ import annotations

import json

import pytest

from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.sampling.chat_template import ChatTemplate, GenerationDefaults, TemplateError
from lwm_jax.sampling.openai_request import BadRequest, parse_request
from tests.test_sampling import qwen_tokenizer_path

TEMPLATE = "tests/fixtures/chat/thinking_template.jinja"


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(qwen_tokenizer_path())


def test_template_variables_helpers_and_sandbox(tok):
  src = ("{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
         "{{ {'a': 1} | tojson }}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
         "{{ flavour }}")
  ct = ChatTemplate(src, tok, bos_token="<|endoftext|>")
  text = ct.render([{"role": "user", "content": "hi"}], True, flavour="mint")
  assert text == '<|endoftext|>[user:hi]{"a": 1}<|im_start|>assistant\nmint'
  assert ct.encode(text) == ([tok.special_tokens["<|endoftext|>"]] + tok.encode('[user:hi]{"a": 1}')
                            + [tok.im_start_id] + tok.encode("assistant\nmint"))
  # The sandbox refuses Python internals; the template's own refusal names the file.
  with pytest.raises(TemplateError, match="rendering failed"):
    ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}", tok).render(
        [{"role": "user", "content": "x"}])
  with open(TEMPLATE) as f:
    ct = ChatTemplate(f.read(), tok, origin="my/tokenizer_config.json")
  with pytest.raises(TemplateError, match="my/tokenizer_config.json: role narrator"):
    ct.render([{"role": "narrator", "content": "x"}])
  with pytest.raises(ValueError, match="does not parse"):
    ChatTemplate("{% for %}", tok)


def test_template_from_folder_named_list_and_jinja_file(tok, tmp_path):
  with open(TEMPLATE) as f:
    src = f.read()
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"chat_template": [{"name": "tool_use", "template": "x"},
                         {"name": "default", "template": src}],
       "bos_token": {"content": "<|endoftext|>"}}))
  ct = ChatTemplate.from_folder(tok, str(tmp_path))
  assert ct.bos_token == "<|endoftext|>" and "world model" in ct.render(
      [{"role": "user", "content": "x"}])
  other = tmp_path / "b"
  other.mkdir()
  (other / "tokenizer_config.json").write_text("{}")
  assert ChatTemplate.from_folder(tok, str(other)) is None
  (other / "chat_template.jinja").write_text(src)
  assert ChatTemplate.from_folder(tok, str(other)) is not None
  (other / "tokenizer_config.json").write_text('{"chat_template": 5}')
  with pytest.raises(ValueError, match="tokenizer_config.json: 'chat_template' must be"):
    ChatTemplate.from_folder(tok, str(other))


def test_generation_config_defaults_and_errors(tmp_path):
  (tmp_path / "generation_config.json").write_text(json.dumps(
      {"temperature": 0.7, "top_p": 0.8, "top_k": -1, "repetition_penalty": 1.05,
       "eos_token_id": 151645, "bos_token_id": 151643}))
  d = GenerationDefaults.from_folder(str(tmp_path))
  assert d.sampling() == {"temperature": 0.7, "top_p": 0.8, "top_k": 0,
                          "repetition_penalty": 1.05}
  assert d.eos_token_ids == (151645,)
  assert GenerationDefaults.from_dict({"do_sample": False, "temperature": 0.9}).temperature == 0
  with pytest.raises(ValueError, match="gc.json: 'top_p' must be a number, got '0.9'"):
    GenerationDefaults.from_dict({"top_p": "0.9"}, "gc.json")
  with pytest.raises(ValueError, match="'eos_token_id' must be a token id"):
    GenerationDefaults.from_dict({"eos_token_id": ["</s>"]}, "gc.json")
  assert GenerationDefaults.from_folder(str(tmp_path / "none")).sampling() == {}


def test_request_fields_take_generation_defaults_only_when_left_out():
  defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1}
  msgs = [{"role": "user", "content": "hi"}]
  p = parse_request({"messages": msgs}, True, "m", 64, 32, defaults).params
  assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.6, 0.95, 20, 1.1)
  p = parse_request({"messages": msgs, "temperature": 0, "top_k": -1, "top_p": 1,
                     "repetition_penalty": 1.0}, True, "m", 64, 32, defaults).params
  assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.0, 1.0, 0, 1.0)
  assert p.max_new_tokens == 64
  with pytest.raises(BadRequest, match="unknown field 'prompt' \\(it belongs to /v1/completions"):
    parse_request({"messages": msgs, "prompt": "x"}, True, "m", 64, 32)
  with pytest.raises(BadRequest, match="'top_logprobs' needs 'logprobs'"):
    parse_request({"messages": msgs, "top_logprobs": 2}, True, "m", 64, 32)
