"""The files of a Hugging Face folder besides the weights: the tokenizer and `generation_config.json`
(and reading a folder's JSON files, with `CheckpointError` for what cannot be read).

`hf.save_pretrained(..., tokenizer=...)` calls these so that an exported training run can be served
from its folder alone (`launch/serve.py --checkpoint=RUN/hf`): `data.tokenizer.load_tokenizer` finds
`tokenizer.json` (Hugging Face) or the SentencePiece `tokenizer.model` there, and the server reads
the chat template from `tokenizer_config.json` and end tokens from `generation_config.json`.

A SentencePiece model is written three ways: `tokenizer.model` itself (what our code loads), and for
Hugging Face `transformers`, vLLM and other readers a `tokenizer.json` converted from it plus a
`tokenizer_config.json` with our ChatML template (`sentencepiece_tokenizer_json`). The converted
tokenizer is the same BPE (every vocabulary piece and its id; merges ordered by the score SentencePiece
gives each merged piece; byte fallback; spaces as U+2581), our chat tokens are its added tokens (the
thinking tags stay text, see `_sp_added_tokens`), and one pre-tokenizer rule keeps a chat turn's role header (`user\n`) apart from the turn's text, as
our ChatML encoding does (`Tokenizer.encode_message` encodes the two separately), so a rendered chat
prompt tokenized as a whole gives the ids the model was trained on.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from typing import Any

log = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SP_MODEL = "tokenizer.model"
# The ChatML layout our tokenizers encode (`Tokenizer.chat_text`), as a Jinja chat template;
# `enable_thinking=false` closes an empty thinking block after the generation prompt, as
# `chat_template.chatml_ids` does; a `developer` message is a system message (as our server reads it).
CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- set role = 'system' if m['role'] == 'developer' else m['role'] -%}"
    "{{- '<|im_start|>' + role + '\n' + m['content'] + '<|im_end|>' + '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}{%- endif -%}")
# The first revision of CHATML_TEMPLATE (no thinking switch); folders written with it are ours too.
_CHATML_TEMPLATE_V1 = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}")
OUR_TEMPLATES = (CHATML_TEMPLATE, _CHATML_TEMPLATE_V1)
# Roles whose header `role\n` starts a tokenizer segment after `<|im_start|>`.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class CheckpointError(ValueError):
  """A checkpoint folder that cannot be read into (or written from) the model."""


def read_json(path: str) -> dict[str, Any]:
  """A JSON file of a checkpoint folder; a bad or unreadable file is a CheckpointError naming it."""
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") \
        from None
  except OSError as e:
    raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None


# Sampling defaults carried over from a base checkpoint's generation_config.json.
_SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "presence_penalty", "max_new_tokens")


def _copy(src: str, dst: str) -> None:
  if not (os.path.exists(dst) and os.path.samefile(src, dst)):  # exporting into its own folder
    shutil.copyfile(src, dst)


def save_tokenizer(tokenizer: Any, path: str) -> list[str]:
  """Writes a tokenizer (object or path) into an HF folder so that the folder serves on its own:
  a Hugging Face tokenizer as `tokenizer.json` plus `tokenizer_config.json` (its own, with our
  ChatML template added when it has none), a SentencePiece model as `tokenizer.model`. Returns the
  file names written."""
  from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  if isinstance(tokenizer, (str, os.PathLike)):
    tokenizer = tok_lib.load_tokenizer(tokenizer)
  os.makedirs(path, exist_ok=True)
  if isinstance(tokenizer, tok_lib.SentencePieceTokenizer):
    _copy(tokenizer.path, os.path.join(path, SP_MODEL))
    try:
      converted = sentencepiece_tokenizer_json(tokenizer.path)
    except CheckpointError as e:
      log.warning("save_tokenizer %s: wrote only %s, no tokenizer.json for other readers: %s",
                  path, SP_MODEL, e)
      return [SP_MODEL]
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
      f.write(converted)
    with open(os.path.join(path, TOKENIZER_CONFIG), "w", encoding="utf-8") as f:
      json.dump(sentencepiece_tokenizer_config(tokenizer), f, indent=2, ensure_ascii=False)
    return [SP_MODEL, "tokenizer.json", TOKENIZER_CONFIG]
  if not isinstance(tokenizer, tok_lib.HFTokenizer):
    raise TypeError(f"save_tokenizer: cannot write a {type(tokenizer).__name__} (expected a "
                    "SentencePiece or Hugging Face tokenizer, or the path of one)")
  src = os.path.dirname(tokenizer.path)
  _copy(tokenizer.path, os.path.join(path, "tokenizer.json"))
  written = ["tokenizer.json"]
  own = os.path.join(src, TOKENIZER_CONFIG)
  tc = read_json(own) if os.path.isfile(own) else {}
  if os.path.isfile(os.path.join(src, "chat_template.jinja")):  # newer transformers keep it apart
    _copy(os.path.join(src, "chat_template.jinja"), os.path.join(path, "chat_template.jinja"))
    written.append("chat_template.jinja")
  elif not tc.get("chat_template"):
    tc["chat_template"] = CHATML_TEMPLATE
  tc.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
  tc.setdefault("eos_token", tok_lib.IM_END)
  if tok_lib.ENDOFTEXT in tokenizer.special_tokens:
    tc.setdefault("pad_token", tok_lib.ENDOFTEXT)
  with open(os.path.join(path, TOKENIZER_CONFIG), "w") as f:
    json.dump(tc, f, indent=2, ensure_ascii=False)
  return written + [TOKENIZER_CONFIG]


def _sp_added_tokens(sp) -> list[tuple[int, str, bool]]:
  """(id, text, special) of the pieces that become added tokens: our chat tokens. The thinking
  tags are not added tokens: in a system or user message our encoding reads `<think>` as text
  (world-model prompts describe the reply format in those words), and a Hugging Face tokenizer
  cannot tell the roles apart, so it reads them as text everywhere; their ids still decode to
  the tags."""
  from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  out = []
  for t in (tok_lib.IM_START, tok_lib.IM_END, tok_lib.ENDOFTEXT):
    i = sp.piece_to_id(t)
    if i != sp.unk_id() and sp.id_to_piece(i) == t:
      out.append((i, t, t not in tok_lib.TAGS))
  return out


def sentencepiece_tokenizer_json(model_path: str | os.PathLike) -> str:
  """The `tokenizer.json` text of a Hugging Face fast tokenizer that encodes as our SentencePiece
  BPE model at `model_path` does (see the module docstring). Raises CheckpointError for a model
  this conversion does not cover (a unigram model, a normaliser other than identity, a dummy
  prefix)."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, \
      pre_tokenizers  # pylint: disable=import-outside-toplevel
  path = os.fspath(model_path)
  sp = spm.SentencePieceProcessor(model_file=path)
  n = sp.get_piece_size()
  vocab = {sp.id_to_piece(i): i for i in range(n)}
  merges = []
  for piece, i in vocab.items():
    if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i) or len(piece) < 2:
      continue
    if piece in tok_lib.SPECIAL_TOKENS:
      continue  # matched whole by SentencePiece, never built by merges
    for k in range(1, len(piece)):
      a, b = piece[:k], piece[k:]
      if a in vocab and b in vocab:
        merges.append((-sp.get_score(i), i, vocab[a], vocab[b], a, b))
  merges.sort()  # SentencePiece merges the pair whose piece scores highest first
  bpe = models.BPE(vocab=vocab, merges=[(m[4], m[5]) for m in merges],
                   unk_token=sp.id_to_piece(sp.unk_id()), fuse_unk=True, byte_fallback=True)
  tok = Tokenizer(bpe)
  tok.normalizer = normalizers.Replace(" ", "\u2581")
  roles = "|".join(CHAT_ROLES)
  tags = "|".join(re.escape(t[1:]) for t in tok_lib.SPECIAL_TOKENS)
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(rf"\A(?:{roles})\n"), behavior="isolated"),
      # A tag's text inside ordinary text is cut after its "<", as SentencePieceTokenizer.encode
      # cuts it (the model never saw such text as one piece).
      pre_tokenizers.Split(Regex(f"<(?={tags})"), behavior="merged_with_previous")])
  tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                   decoders.Fuse()])
  _check_conversion(tok, sp, path)
  for i, text, special in _sp_added_tokens(sp):
    tok.add_tokens([AddedToken(text, special=special, normalized=False)])
    if tok.token_to_id(text) != i:
      raise CheckpointError(f"{path}: added token {text} did not keep its id {i}")
  return tok.to_str(pretty=True)


def _check_conversion(tok, sp, path: str) -> None:
  """Encodes probe texts both ways (every piece's own text, pieces glued together, sentences with
  runs of spaces, digits, accents and characters outside the vocabulary); any difference is a
  CheckpointError: the model is not one this conversion covers (a unigram model, a normaliser
  other than identity, a dummy prefix)."""
  from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  texts = [sp.decode([i]) for i in range(sp.get_piece_size())
           if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))]
  texts = [t for t in texts if t not in tok_lib.SPECIAL_TOKENS]
  texts += ["".join(texts[i:i + 7]) for i in range(0, len(texts), 7)]
  texts += ["Hello  world,\n\tx = 1234567 ;  ", "  caf\u00e9 na\u00efve \u2603 \U0001f600 \u4e2d\u6587\n\n"]
  for t in texts:
    want = sp.encode(t)
    got = tok.encode(t, add_special_tokens=False).ids
    if got != want:
      raise CheckpointError(f"{path}: the tokenizer.json conversion encodes {t[:40]!r} as {got[:8]} "
                            f"but SentencePiece as {want[:8]}; only BPE models trained as "
                            "`train_sentencepiece` trains them (identity normalisation, no dummy "
                            "prefix) convert")


def sentencepiece_tokenizer_config(tokenizer: Any) -> dict[str, Any]:
  """`tokenizer_config.json` for a converted SentencePiece tokenizer: our ChatML template, end and
  padding tokens, and the added tokens' flags (what `transformers.AutoTokenizer` reads)."""
  from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  sp = tokenizer._sp  # pylint: disable=protected-access
  added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                    "single_word": False, "special": special}
           for i, t, special in _sp_added_tokens(sp)}
  pad = sp.id_to_piece(tokenizer.pad_id)
  return {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML_TEMPLATE,
          "added_tokens_decoder": added, "bos_token": None, "eos_token": tok_lib.IM_END,
          "pad_token": pad, "unk_token": sp.id_to_piece(sp.unk_id()),
          "clean_up_tokenization_spaces": False, "split_special_tokens": False,
          "model_max_length": 1 << 30}


def generation_config(tokenizer: Any = None, base: Any = None) -> dict[str, Any]:
  """`generation_config.json` contents: end tokens and padding from the tokenizer (`<|im_end|>`,
  then `<|endoftext|>` when it has one), sampling defaults from `base` (a dict, or the folder or
  file of a base checkpoint's generation config)."""
  out: dict[str, Any] = {}
  if isinstance(base, (str, os.PathLike)):
    f = os.path.join(base, GENERATION_CONFIG) if os.path.isdir(base) else os.fspath(base)
    base = read_json(f) if os.path.isfile(f) else {}
  out.update({k: v for k, v in (base or {}).items() if k in _SAMPLING_KEYS})
  if tokenizer is not None:
    from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
    if isinstance(tokenizer, (str, os.PathLike)):
      tokenizer = tok_lib.load_tokenizer(tokenizer)
    ends = [tokenizer.special_tokens[t] for t in (tok_lib.IM_END, tok_lib.ENDOFTEXT)
            if t in tokenizer.special_tokens]
    out.update(eos_token_id=ends if len(ends) > 1 else ends[0], pad_token_id=tokenizer.pad_id)
  return out
