"""Plain documents for CPT: knowledge text trained with FULL loss, mixed into the trajectories.

A document file is JSONL, one `{"id": str, "text": str, "title": str (optional)}` per line; a
`.txt` or `.md` file is one document whose id is the file name. A bad line raises ValueError naming
the file and line. Empty documents are skipped and counted (`DocumentStats`).

A document becomes `[<|endoftext|>] + encode(title + "\\n\\n" + text) + [<|endoftext|>]`: weight 0
on the opening marker (it is never a prediction target) and weight 1 on every other token, the
closing marker included. A document longer than `seq_len` is cut into consecutive windows of
`seq_len - 1` tokens, each opened by the marker again (no text is lost, the cuts are counted in
`n_split`).

`lwm_jax/envs/knowledge.py` gathers the knowledge text of the bundled environments; `write_documents`
saves documents as a file for `data.pipeline.knowledge_jsonl`, and `pipeline.make_train_iterator`
mixes them into CPT at `knowledge_share` of the tokens (docs/reproduce.md).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np

from lwm_jax.data import jsonl
from lwm_jax.data.tokenizer import ENDOFTEXT, Tokenizer


@dataclasses.dataclass(frozen=True)
class Document:
  id: str
  text: str
  title: str = ""

  def full_text(self) -> str:
    return f"{self.title}\n\n{self.text}" if self.title else self.text


@dataclasses.dataclass
class DocumentStats:
  files: int = 0
  documents: int = 0
  empty_skipped: int = 0
  characters: int = 0


def read_documents(paths: str | Sequence[str], stats: DocumentStats | None = None
                   ) -> list[Document]:
  """Documents of comma-separated (or listed) files; see the module docstring for the format."""
  if isinstance(paths, str):
    paths = [p.strip() for p in paths.split(",") if p.strip()]
  stats = stats if stats is not None else DocumentStats()
  docs: list[Document] = []
  seen: dict[str, str] = {}
  for path in paths:
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path}: no such document file")
    stats.files += 1
    base = os.path.basename(path)
    if base.endswith((".txt", ".md", ".txt.gz", ".md.gz")):
      with jsonl.open_text(path, "r") as f:
        rows = [(1, {"id": base.split(".")[0], "text": f.read()})]
    else:
      with jsonl.open_text(path, "r") as f:
        rows = list(_json_rows(path, f))
    for line, row in rows:
      where = f"{path}:{line}"
      doc = _document(row, where)
      if not doc.text.strip():
        stats.empty_skipped += 1
        continue
      if doc.id in seen:
        raise ValueError(f"{where}: duplicate document id {doc.id!r} (first at {seen[doc.id]})")
      seen[doc.id] = where
      docs.append(doc)
      stats.documents += 1
      stats.characters += len(doc.text)
  return docs


def _json_rows(path: str, f) -> Iterable[tuple[int, Any]]:
  for n, line in enumerate(f, 1):
    if not line.strip():
      continue
    try:
      yield n, json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None


def _document(row: Any, where: str) -> Document:
  if not isinstance(row, dict):
    raise ValueError(f"{where}: a document must be a JSON object, got {type(row).__name__}")
  for field in ("id", "text"):
    if not isinstance(row.get(field), str):
      raise ValueError(f"{where}: field '{field}' must be a string")
  title = row.get("title", "")
  if not isinstance(title, str):
    raise ValueError(f"{where}: field 'title' must be a string")
  return Document(row["id"], row["text"], title)


def write_documents(docs: Iterable[Document], path: str) -> int:
  """Writes a document file (gzip when `path` ends in .gz); returns the number written."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  n = 0
  with jsonl.open_text(path, "w") as f:
    for d in docs:
      f.write(json.dumps(dataclasses.asdict(d), ensure_ascii=False) + "\n")
      n += 1
  return n


# Per-sample counters of the training pipeline's samples (lwm_jax/data/pipeline.py): each is an
# int32 array as long as the sample, its value at position 0 and zeros after, so that packing
# carries it along and a packed batch's sum is the count.
COUNTS = ("n_dropped", "n_cut", "n_split", "n_overlong", "n_knowledge", "n_drill")


def sample_arrays(ids, weights, **counts: int) -> dict[str, np.ndarray]:
  """One training sample in the pipeline's layout: `tokens`, `loss_weights` and every counter of
  `COUNTS` (those not given are 0)."""
  unknown = set(counts) - set(COUNTS)
  if unknown:
    raise ValueError(f"sample_arrays: unknown counters {sorted(unknown)}")
  n = len(ids)
  out = {"tokens": np.asarray(ids, np.int32), "loss_weights": np.asarray(weights, np.float32)}
  for key in COUNTS:
    out[key] = np.zeros(n, np.int32)
    out[key][0] = counts.get(key, 0)
  return out


def document_samples(doc: Document, tok: Tokenizer, seq_len: int) -> list[dict[str, np.ndarray]]:
  """Packed-ready samples of one document: full loss on every token after the opening marker."""
  if seq_len < 3:
    raise ValueError(f"seq_len must be >= 3 for a document window, got {seq_len}")
  marker = tok.special_tokens.get(ENDOFTEXT, tok.pad_id)
  body = tok.encode(doc.full_text()) + [marker]
  width = seq_len - 1
  out = []
  for i, start in enumerate(range(0, len(body), width)):
    ids = [marker] + body[start:start + width]
    weights = [0.0] + [1.0] * (len(ids) - 1)
    out.append(sample_arrays(ids, weights, n_split=int(i > 0), n_knowledge=len(ids)))
  return out
