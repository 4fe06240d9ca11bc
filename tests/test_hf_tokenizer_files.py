"""The tokenizer files of a Hugging Face folder we write from a SentencePiece model: tokenizer.json
(converted) and tokenizer_config.json (our ChatML template), checked against the SentencePiece model
itself on every observation and action of the bundled test split, and against what our server
builds for a chat. The `transformers` checks skip when it is not installed (a test-only dependency,
as for the parity tests)."""
from __future__ import annotations

import glob
import json
import logging
import os

import pytest
from flax import nnx

from lwm_jax import hf_tokenizer
from lwm_jax.data import prompts, schema
from lwm_jax.data import tokenizer as tok_lib
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.chat_template import ChatTemplate, chatml_ids
from lwm_jax.sampling.sampler import Sampler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "data", "world_model")
TRAJS = os.path.join(ROOT, "tests", "fixtures", "data", "trajectories.jsonl")


def _test_split():
  files = sorted(glob.glob(os.path.join(ROOT, "data", "corpus", "*_test.jsonl.gz")))
  assert len(files) == 7, files
  return [t for f in files for t in schema.read_jsonl(f)]


@pytest.fixture(scope="module")
def test_split():
  return _test_split()


@pytest.fixture(scope="module")
def ours():
  return tok_lib.load_tokenizer(os.path.join(SHIPPED, hf_tokenizer.SP_MODEL))


def _texts(trajs):
  return [s for t in trajs for x in t.turns for s in (x.observation, x.action)]


def _chats(trajs):
  """Per test trajectory, the prompt of its last turn (system prompt, whole history) and a chat
  whose last user message is each observation's text (odd spacing and newlines included)."""
  out = []
  for t in trajs:
    out.append(prompts.prompt_messages(t, len(t.turns) - 1, 0))
    for x in t.turns[:3]:
      out.append([{"role": "system", "content": t.task},
                  {"role": "user", "content": x.observation},
                  {"role": "assistant", "content": x.observation + " "}])
  return out


def test_converted_tokenizer_json_encodes_as_sentencepiece(ours, test_split):
  from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel
  converted = Tokenizer.from_file(os.path.join(SHIPPED, "tokenizer.json"))
  with open(os.path.join(SHIPPED, "tokenizer.json"), encoding="utf-8") as f:
    assert f.read() == hf_tokenizer.sentencepiece_tokenizer_json(ours.path)  # regenerated
  texts = _texts(test_split)
  assert len(texts) > 2500
  for s in texts:
    ids = converted.encode(s, add_special_tokens=False).ids
    assert ids == ours.encode(s), s[:80]
    assert converted.decode(ids) == s
  for msgs in _chats(test_split):  # a rendered prompt tokenized whole = our turn-by-turn ids
    text = ours.chat_text(msgs, add_generation_prompt=True)
    assert converted.encode(text, add_special_tokens=False).ids == chatml_ids(ours, msgs)
  for s, i in ours.special_tokens.items():
    assert converted.token_to_id(s) == i


def test_shipped_folder_serves_with_the_sentencepiece_model_and_training_ids(ours, test_split):
  tok = tok_lib.load_tokenizer(SHIPPED)  # the folder now also holds tokenizer.json
  assert isinstance(tok, tok_lib.SentencePieceTokenizer) and tok.pad_id == 0
  template = ChatTemplate.from_folder(tok, SHIPPED)
  assert template is not None and template.source == hf_tokenizer.CHATML_TEMPLATE
  model = Transformer(get_preset("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
  sampler = Sampler(model, tok, chat_template=template, max_batch=4)
  msgs = prompts.prompt_messages(test_split[0], 1, 0)
  assert sampler.encode_prompt(msgs) == chatml_ids(ours, msgs)
  ids, _ = sampler.prepare(msgs, {"enable_thinking": False})
  assert ids == chatml_ids(ours, msgs, enable_thinking=False)
  # The template renders the text our ids spell, with and without thinking.
  for think in (None, False):
    kw = {} if think is None else {"enable_thinking": think}
    text = template.render(msgs, True, **kw).replace("\ue000", "")  # its escape mark
    assert text == ours.decode(chatml_ids(ours, msgs, think))


def test_a_unigram_model_is_not_converted_and_the_export_says_so(tmp_path, caplog):
  texts = [t.task + "\n" + x.observation for t in schema.read_jsonl(TRAJS) for x in t.turns]
  sp = tok_lib.train_sentencepiece(texts * 3, 400, tmp_path / "uni", model_type="unigram")
  with pytest.raises(hf_tokenizer.CheckpointError, match="uni.model: the tokenizer.json conversion"):
    hf_tokenizer.sentencepiece_tokenizer_json(sp)
  with caplog.at_level(logging.WARNING, logger="lwm_jax.hf_tokenizer"):
    written = hf_tokenizer.save_tokenizer(sp, str(tmp_path / "out"))
  assert written == [hf_tokenizer.SP_MODEL]
  assert any("no tokenizer.json" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------- transformers
def test_autotokenizer_on_the_shipped_folder_gives_our_ids_and_prompt(ours, test_split):
  transformers = pytest.importorskip("transformers")
  hf = transformers.AutoTokenizer.from_pretrained(SHIPPED)
  assert hf.encode("hello world", add_special_tokens=False) == [933, 356, 316, 283, 1071]
  texts = _texts(test_split)
  got = hf(texts, add_special_tokens=False)["input_ids"]
  bad = [s[:60] for s, g in zip(texts, got) if g != ours.encode(s)]
  assert not bad, f"{len(bad)} of {len(texts)} differ, e.g. {bad[:3]}"
  assert hf.batch_decode(got) == texts
  chats = _chats(test_split)
  texts = [hf.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in chats]
  assert texts == [ours.chat_text(m, add_generation_prompt=True) for m in chats]
  got = hf(texts, add_special_tokens=False)["input_ids"]  # what tokenize=True does with the text
  assert [i for i, (g, m) in enumerate(zip(got, chats)) if g != chatml_ids(ours, m)] == []
  ids = hf.apply_chat_template(chats[0], add_generation_prompt=True)
  assert (ids if isinstance(ids, list) else ids["input_ids"]) == chatml_ids(ours, chats[0])
  # enable_thinking=false: the same text; Hugging Face reads the tags of the closing block as
  # text (they are not added tokens, see hf_tokenizer._sp_added_tokens), so only its ids differ.
  msgs = _chats(test_split)[0]
  text = hf.apply_chat_template(msgs, add_generation_prompt=True, enable_thinking=False,
                                tokenize=False)
  assert text == ours.decode(chatml_ids(ours, msgs, enable_thinking=False))
  assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
  # End and padding tokens; special tokens dropped on request, thinking tags kept (as Qwen's).
  assert hf.eos_token == "<|im_end|>" and hf.pad_token_id == 0
  reply = ours.encode_content("assistant", "<think>x</think>ok") + [ours.im_end_id]
  assert hf.decode(reply, skip_special_tokens=True) == "<think>x</think>ok"


def test_every_sentencepiece_export_loads_in_transformers(tmp_path):
  """A run trained with a fresh SentencePiece model, exported by save_tokenizer: AutoTokenizer
  reads the folder with the model's ids, and our loader still reads the .model."""
  transformers = pytest.importorskip("transformers")
  texts = [t.task + "\n" + x.action + "\n" + x.observation
           for t in schema.read_jsonl(TRAJS) for x in t.turns]
  sp = tok_lib.train_sentencepiece(texts * 3, 400, tmp_path / "sp")
  written = hf_tokenizer.save_tokenizer(sp, str(tmp_path / "hf"))
  assert written == [hf_tokenizer.SP_MODEL, "tokenizer.json", hf_tokenizer.TOKENIZER_CONFIG]
  ours = tok_lib.load_tokenizer(sp)
  assert isinstance(tok_lib.load_tokenizer(str(tmp_path / "hf")), tok_lib.SentencePieceTokenizer)
  hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  for s in texts + ["  two  spaces\tand é ☃ 中文 😀\n"]:
    assert hf.encode(s, add_special_tokens=False) == ours.encode(s), s[:60]
  chat = [{"role": "system", "content": "sim"}, {"role": "user", "content": texts[0]}]
  assert hf.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == \
      ours.chat_text(chat, add_generation_prompt=True)
  with open(tmp_path / "hf" / "tokenizer_config.json") as f:
    assert json.load(f)["chat_template"] == hf_tokenizer.CHATML_TEMPLATE
