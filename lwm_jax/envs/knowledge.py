"""The bundled environments' knowledge text as plain documents for CPT (full loss).

The pages the search environment indexes (module overviews, functions and classes of the standard
library, read back from its index so they are byte for byte what its episodes show) and each
environment's action-space description. `lwm_jax/data/documents.py` reads, writes and tokenizes
documents; docs/reproduce.md describes how CPT mixes them in.
"""
from __future__ import annotations

import importlib
import inspect
import sqlite3
from typing import Sequence

from lwm_jax import domains
from lwm_jax.data.documents import Document
from lwm_jax.data.drills import copy_drills, lookup_drills
from lwm_jax.envs.search import env as search

SOURCES = ("search", "actions", "copy", "lookup")
DEFAULT_SOURCES = ("search", "actions")  # the environments' own text; drills only when asked
COPY_DRILLS = 4000  # drills of the 'copy' source: about as many characters as the search pages
LOOKUP_DRILLS = 4000  # drills of the 'lookup' source


def search_collection(cache_dir: str | None = None) -> list[Document]:
  """Every page the search environment indexes (module overviews, functions, classes), read from
  its SQLite index (built on first use by `lwm_jax.envs.search.env.ensure_index`)."""
  path = search.ensure_index(cache_dir)
  con = sqlite3.connect(path)
  try:
    rows = con.execute("SELECT doc_id, title, body FROM docs ORDER BY doc_id").fetchall()
  finally:
    con.close()
  return [Document(f"search/{i}", body, title) for i, title, body in rows]


def action_spaces() -> list[Document]:
  """Each bundled environment's action-space description, as its episodes' prompts carry it."""
  docs = []
  # the built-in domains in the order their documents were first written, then any others
  first = {n: i for i, n in enumerate(("terminal", "swe", "search", "web", "android", "os"))}
  for d in sorted(domains.domains(), key=lambda d: first.get(d.name, len(first))):
    module = d.env.partition(":")[0]
    mod = importlib.import_module(module)
    name = module.rsplit(".", 2)[-2]  # the domain's folder (the document ids predate "os")
    text = getattr(mod, "ACTION_SPACE", "")
    if "{limit}" in text:  # the terminal's time limit, filled in as its episodes show it
      limit = inspect.signature(d.load("env")).parameters["time_limit"].default
      text = text.format(limit=limit)
    if text.strip():
      docs.append(Document(f"action_space/{name}", text, f"Actions of the {name} environment"))
  return docs


def knowledge_documents(cache_dir: str | None = None, sources: Sequence[str] = DEFAULT_SOURCES
                        ) -> list[Document]:
  """The knowledge text of `sources`: 'search' (the search collection), 'actions' (action
  spaces), 'copy' (`COPY_DRILLS` copy drills of seed 0, `lwm_jax.data.drills`: not knowledge of an
  environment but text that teaches copying from the context), 'lookup' (`LOOKUP_DRILLS` lookup
  drills of seed 0: listings of a made-up file tree looked up in its paths)."""
  unknown = sorted(set(sources) - set(SOURCES))
  if unknown:
    raise ValueError(f"unknown knowledge source {unknown[0]!r} (expected one of "
                     f"{', '.join(SOURCES)})")
  docs: list[Document] = []
  if "search" in sources:
    docs += search_collection(cache_dir)
  if "actions" in sources:
    docs += action_spaces()
  if "copy" in sources:
    docs += copy_drills(COPY_DRILLS, seed=0)
  if "lookup" in sources:
    docs += lookup_drills(LOOKUP_DRILLS, seed=0)
  return docs
