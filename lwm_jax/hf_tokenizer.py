"""The files of a Hugging Face folder besides the weights: the tokenizer and `generation_config.json`
(and reading a folder's JSON files, with `CheckpointError` for what cannot be read).

`hf.save_pretrained(..., tokenizer=...)` calls these so that an exported training run can be served
from its folder alone (`launch/serve.py --checkpoint=RUN/hf`): `data.tokenizer.load_tokenizer` finds
`tokenizer.json` (Hugging Face) or the SentencePiece `tokenizer.model` there, and the server reads
the chat template from `tokenizer_config.json` and end tokens from `generation_config.json`.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any


GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SP_MODEL = "tokenizer.model"
# The ChatML layout our tokenizers encode (`Tokenizer.chat_text`), as a Jinja chat template.
CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}")


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
    return [SP_MODEL]
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
