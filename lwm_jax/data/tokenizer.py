"""Tokenizers behind one interface: SentencePiece (trained on our corpus) and HF `tokenizer.json`.

Chat format is ChatML: `<|im_start|>role\\n{content}<|im_end|>\\n` per message. Ids are built per
rendered segment (header, content, end marker, newline) and concatenated, so a loss weight given
per message lands on exactly that message's tokens. `encode` never turns text into control tokens:
an observation that contains the string `<|im_end|>` is encoded as ordinary characters. Inside
assistant content the thinking tags (`<think>`, `</think>`, `<predicted_observation>`,
`</predicted_observation>`) become their single ids when the vocabulary has them.
"""
from __future__ import annotations

import os
import re
from typing import Callable, Iterable, Sequence

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TAGS = ("<think>", "</think>", "<predicted_observation>", "</predicted_observation>")
SPECIAL_TOKENS = (IM_START, IM_END, ENDOFTEXT) + TAGS

Message = dict  # {"role": str, "content": str}
WeightFn = Callable[[int, Message], float]


class Tokenizer:
  """Base: subclasses set `special_tokens` and implement `encode` / `decode` / `vocab_size`."""

  special_tokens: dict[str, int]

  def encode(self, text: str) -> list[int]:
    raise NotImplementedError

  def decode(self, ids: Sequence[int]) -> str:
    raise NotImplementedError

  @property
  def vocab_size(self) -> int:
    raise NotImplementedError

  @property
  def im_start_id(self) -> int:
    return self.special_tokens[IM_START]

  @property
  def im_end_id(self) -> int:
    return self.special_tokens[IM_END]

  @property
  def eos_id(self) -> int:
    return self.special_tokens[IM_END]

  @property
  def pad_id(self) -> int:
    return self.special_tokens.get(ENDOFTEXT, 0)

  # --- chat -------------------------------------------------------------------------------
  def chat_text(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")

  def encode_content(self, role: str, content: str) -> list[int]:
    """Content ids; thinking tags in assistant content map to their ids when they exist."""
    if role != "assistant" or "<" not in content:
      return self.encode(content)
    tag_re = self._tag_re()
    if tag_re is None:
      return self.encode(content)
    ids: list[int] = []
    for piece in tag_re.split(content):
      if piece in self.special_tokens:
        ids.append(self.special_tokens[piece])
      elif piece:
        ids.extend(self.encode(piece))
    return ids

  def _tag_re(self) -> re.Pattern | None:
    """Splits at the thinking tags this vocabulary has as single tokens (others stay text)."""
    if not hasattr(self, "_tag_re_cache"):
      tags = [t for t in TAGS if t in self.special_tokens]
      self._tag_re_cache = (re.compile("(" + "|".join(re.escape(t) for t in tags) + ")")
                            if tags else None)
    return self._tag_re_cache

  def encode_message(self, message: Message, weight: float = 0.0, unweighted_prefix: str = ""
                     ) -> tuple[list[int], list[float]]:
    """One message's ids and weights: `weight` on its content and its `<|im_end|>`, 0 elsewhere.

    When the content starts with `unweighted_prefix` (a fixed header such as the observation
    marker), the tokens spelling that header get weight 0 too. The ids are those of the whole
    content either way; a token that holds the header's end and the content's start is weighted.
    """
    head = [self.im_start_id] + self.encode(message["role"] + "\n")
    body = self.encode_content(message["role"], message["content"])
    tail = self.encode("\n")
    ids = head + body + [self.im_end_id] + tail
    skip = 0
    if weight and unweighted_prefix and message["content"].startswith(unweighted_prefix):
      skip = self.prefix_tokens(body, unweighted_prefix)
    weights = ([0.0] * (len(head) + skip) + [weight] * (len(body) - skip + 1)
               + [0.0] * len(tail))
    return ids, weights

  def prefix_tokens(self, ids: Sequence[int], prefix: str) -> int:
    """How many leading tokens of `ids` spell only characters of `prefix` (its text is a prefix
    of what `ids` decode to)."""
    for k in range(1, len(ids) + 1):
      text = self.decode(ids[:k])
      if len(text) >= len(prefix):
        return k if text == prefix else k - 1
    return len(ids)

  def generation_prompt(self) -> list[int]:
    return [self.im_start_id] + self.encode("assistant\n")

  def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = False
                  ) -> list[int]:
    ids: list[int] = []
    for m in messages:
      ids.extend(self.encode_message(m)[0])
    return ids + (self.generation_prompt() if add_generation_prompt else [])

  def encode_chat_with_weights(self, messages: Sequence[Message], weight_fn: WeightFn
                               ) -> tuple[list[int], list[float]]:
    """Ids of the chat and, aligned with them, `weight_fn(i, message)` on message i's content."""
    ids: list[int] = []
    weights: list[float] = []
    for i, m in enumerate(messages):
      a, w = self.encode_message(m, float(weight_fn(i, m)))
      ids.extend(a)
      weights.extend(w)
    return ids, weights


def _split_specials(text: str, specials: Sequence[str]) -> list[str]:
  """Cuts `text` inside every occurrence of a special string, so no piece contains one."""
  pieces, start = [], 0
  while True:
    hits = [(text.find(s, start), s) for s in specials]
    hits = [(p, s) for p, s in hits if p >= 0]
    if not hits:
      break
    p, _ = min(hits)
    pieces.append(text[start:p + 1])
    start = p + 1
  pieces.append(text[start:])
  return [x for x in pieces if x]


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model trained by `train_sentencepiece` (identity normalisation, no dummy
  prefix, byte fallback), so decode(encode(x)) == x and per-segment encodings concatenate."""

  def __init__(self, model_path: str | os.PathLike):
    import sentencepiece as spm
    self.path = os.fspath(model_path)
    if not os.path.isfile(self.path):
      raise ValueError(f"tokenizer: {self.path} does not exist")
    try:
      self._sp = spm.SentencePieceProcessor(model_file=self.path)
    except (RuntimeError, OSError) as e:  # sentencepiece raises RuntimeError on a bad file
      raise ValueError(f"tokenizer: {self.path} is not a readable SentencePiece model "
                       f"(truncated or another kind of file?): {str(e).strip()[:200]}") from None
    self.special_tokens = {}
    for s in SPECIAL_TOKENS:
      i = self._sp.piece_to_id(s)
      if i != self._sp.unk_id() and self._sp.id_to_piece(i) == s:
        self.special_tokens[s] = i
    for s in (IM_START, IM_END):
      if s not in self.special_tokens:
        raise ValueError(f"{self.path}: SentencePiece model lacks the special token {s}")
    self._specials = [s for s in self.special_tokens]

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def pad_id(self) -> int:
    p = self._sp.pad_id()
    return p if p >= 0 else super().pad_id

  def encode(self, text: str) -> list[int]:
    if not text:
      return []
    if not any(s in text for s in self._specials):
      return self._sp.encode(text)
    ids: list[int] = []
    for piece in _split_specials(text, self._specials):
      ids.extend(self._sp.encode(piece))
    return ids

  def decode(self, ids: Sequence[int]) -> str:
    return self._sp.decode([int(i) for i in ids])


def train_sentencepiece(texts: Iterable[str], vocab_size: int, model_prefix: str | os.PathLike,
                        model_type: str = "bpe", input_sentence_size: int = 0) -> str:
  """Trains a SentencePiece model with the chat special tokens; returns the `.model` path.

  Settings that keep text exact: identity normalisation, no dummy prefix, extra whitespace kept,
  byte fallback for characters outside the vocabulary, digits split. Ids 0 and 1 are pad and unk.
  """
  import sentencepiece as spm
  prefix = os.fspath(model_prefix)
  os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_prefix=prefix, vocab_size=vocab_size,
        model_type=model_type, user_defined_symbols=list(SPECIAL_TOKENS), byte_fallback=True,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, normalization_rule_name="identity",
        add_dummy_prefix=False, remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, hard_vocab_limit=False, character_coverage=0.9995,
        max_sentence_length=1 << 16, input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True, minloglevel=2, num_threads=2)
  except RuntimeError as e:  # sentencepiece reports bad settings as INTERNAL errors
    m = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", str(e))
    if m:
      raise ValueError(f"train_sentencepiece: vocab_size {vocab_size} is too small for this text, "
                       f"which needs at least {m.group(2)} pieces for its characters and the "
                       "special tokens") from None
    raise
  return prefix + ".model"


class HFTokenizer(Tokenizer):
  """A Hugging Face `tokenizer.json` (e.g. Qwen's byte-level BPE), loaded with `tokenizers`."""

  def __init__(self, path: str | os.PathLike):
    from tokenizers import Tokenizer as _Tok
    path = os.fspath(path)
    if os.path.isdir(path):
      path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no tokenizer.json at {path}")
    self.path = path
    self._full = _Tok.from_file(path)
    # The same pipeline without added tokens: text is never parsed into control tokens.
    self._plain = _Tok(self._full.model)
    self._plain.normalizer = self._full.normalizer
    self._plain.pre_tokenizer = self._full.pre_tokenizer
    self._plain.decoder = self._full.decoder
    self.special_tokens = {}
    for s in SPECIAL_TOKENS:
      i = self._full.token_to_id(s)
      if i is not None:
        self.special_tokens[s] = i
    for s in (IM_START, IM_END):
      if s not in self.special_tokens:
        raise ValueError(f"{path}: tokenizer has no {s} token (ChatML is required)")
    self._vocab_size = self._full.get_vocab_size(with_added_tokens=True)

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  def encode(self, text: str) -> list[int]:
    if not text:
      return []
    return self._plain.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self._full.decode([int(i) for i in ids], skip_special_tokens=False)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """A `.model` file (or a folder holding one, even beside a tokenizer.json) -> SentencePiece;
  tokenizer.json or its folder -> HF."""
  path = os.fspath(path)
  if path.endswith(".model"):
    return SentencePieceTokenizer(path)
  if path.endswith(".json"):
    return HFTokenizer(path)
  if os.path.isdir(path):
    has_json = os.path.isfile(os.path.join(path, "tokenizer.json"))
    models = sorted(f for f in os.listdir(path) if f.endswith(".model"))
    if len(models) == 1:
      # Our exports carry the SentencePiece model and a tokenizer.json converted from it (for
      # other readers); the model itself is what we trained with. A folder whose .model lacks
      # our chat tokens (another project's) is read through its tokenizer.json.
      try:
        return SentencePieceTokenizer(os.path.join(path, models[0]))
      except ValueError:
        if not has_json:
          raise
    if has_json:
      return HFTokenizer(path)
  raise ValueError(f"cannot tell the tokenizer type of '{path}': expected a SentencePiece .model, "
                   "a tokenizer.json, or a folder holding one of them")
