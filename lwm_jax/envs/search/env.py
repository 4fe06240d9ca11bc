"""The `search` environment: a real full-text search engine over a per-world document collection.

The standard-library part comes from this interpreter's own documentation (pydoc's plain-text
rendering of a fixed list of modules; one document per module overview, function and class),
rendered once into an SQLite FTS5 file in a cache directory. Each world (see `search_worlds`)
indexes a seeded subset of those modules plus a generated company wiki (people, projects,
releases, incidents) into its own small FTS5 file, built at reset in a few tens of milliseconds;
queries are ranked with FTS5's bm25. Actions:
`search(query="...", page=1)` returns ranked snippets five per page, `open(doc_id="...", page=1)`
returns a page of the document. The collection depends on the Python version (kept in `meta`).

Perturbations (`set_perturb(spec)` or `SearchEnv(perturb=spec)`; see docs/perturbations.md):
`errors` fails that share of calls with a timeout/500/503 message, drawn per call from the episode
seed; `page_size` lists that many results per page; `withhold` leaves the named result fields
(title, snippet, score) out; `rate_limit` rejects the calls after the first `limit`.
"""
from __future__ import annotations

import importlib
import inspect
import os
import pydoc
import re
import sqlite3
import subprocess
import sys
import tempfile
import warnings
from typing import Any

import lwm_jax
from lwm_jax.envs import base
from lwm_jax.envs.search import worlds as search_worlds
from lwm_jax.envs.perturb import Perturbable

MODULES = (
    "abc argparse array base64 bisect calendar collections colorsys contextlib copy csv dataclasses "
    "datetime decimal difflib enum filecmp fnmatch fractions functools getopt glob gzip hashlib heapq "
    "hmac html inspect io ipaddress itertools json keyword linecache locale logging math mimetypes "
    "numbers operator os.path pathlib pickle pprint queue random re reprlib sched secrets shelve shlex "
    "shutil signal socket sqlite3 statistics string struct subprocess tarfile tempfile textwrap "
    "threading time timeit tokenize traceback types typing unicodedata urllib.parse uuid warnings "
    "weakref zipfile zlib").split()
PER_PAGE = 5
LINES_PER_PAGE = 40
INDEX_VERSION = "2"  # 2: built in a fresh process (1 could list `__slotnames__`)
MAX_QUERY_CHARS = 1000
MAX_TERMS = 32
ACTION_SPACE = """\
One call per turn, Python call syntax with literal arguments:
  search(query="words", page=1)   full-text search (all words must match; "quoted phrases" allowed),
                                  ranked by BM25, 5 results per page
  open(doc_id="json.dumps", page=1)  show one page (40 lines) of a document
Observation: the ranked result list with doc ids, titles and snippets, or the document page."""


def default_cache_dir() -> str:
  return os.environ.get("LWM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "lwm_jax"))


def _clean(text: str) -> str:
  text = pydoc.plain(text)
  text = re.sub(r" at 0x[0-9a-fA-F]+", " at 0x0", text)
  return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")


def build_documents() -> list[tuple[str, str, str]]:
  """(doc_id, title, body) for every module overview, public function and class of MODULES."""
  docs = []
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for name in MODULES:
      mod = importlib.import_module(name)
      summary = (inspect.getdoc(mod) or "").strip()
      members = []
      for attr in sorted(vars(mod)):
        obj = getattr(mod, attr)
        if attr.startswith("_") or getattr(obj, "__module__", None) not in (mod.__name__, name):
          continue
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
          continue
        members.append(attr)
        doc = (inspect.getdoc(obj) or "").strip()
        title = f"{name}.{attr}: " + (doc.splitlines()[0] if doc else "(no docstring)")
        body = _clean(pydoc.plaintext.document(obj, attr))
        docs.append((f"{name}.{attr}", title[:120], body))
      overview = summary + "\n\nMembers: " + ", ".join(members) if members else summary
      first = summary.splitlines()[0] if summary else "(no docstring)"
      docs.append((name, f"{name}: {first}"[:120], f"Module {name}\n\n{overview}".strip()))
  docs.sort()
  return docs


def ensure_index(cache_dir: str | None = None) -> str:
  """Path of the FTS5 index, building it (atomically) on first use."""
  cache_dir = cache_dir or default_cache_dir()
  v = f"{sys.version_info.major}.{sys.version_info.minor}"
  path = os.path.join(cache_dir, f"search-stdlib-py{v}-v{INDEX_VERSION}.sqlite")
  if os.path.exists(path):
    return path
  os.makedirs(cache_dir, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
  os.close(fd)
  # Built by a fresh interpreter: pydoc's text depends on what the process did before (a class
  # that was pickled or copied gains a `__slotnames__` attribute, which pydoc then lists).
  env = {**os.environ, "PYTHONPATH": lwm_jax.child_pythonpath()}
  proc = subprocess.run([sys.executable, "-m", "lwm_jax.envs.search.env", "--build", tmp], env=env,
                        capture_output=True, text=True)
  if proc.returncode:
    os.remove(tmp)
    raise RuntimeError(f"building the search index failed:\n{proc.stderr}")
  os.replace(tmp, path)
  return path


def write_index(path: str) -> None:
  """Writes the FTS5 index of `build_documents()` to the (empty) SQLite file `path`."""
  con = sqlite3.connect(path)
  con.execute("CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, title, body, "
              "tokenize='porter unicode61')")
  con.executemany("INSERT INTO docs VALUES (?,?,?)", build_documents())
  con.commit()
  con.close()


def _fts_query(query: str) -> str:
  """User query -> FTS5 expression: every word (or quoted phrase) must match.

  Raises ValueError for a query longer than MAX_QUERY_CHARS or with more than MAX_TERMS terms
  (FTS5's cost grows with the square of the number of terms).
  """
  if len(query) > MAX_QUERY_CHARS:
    raise ValueError(f"query too long ({len(query)} characters; at most {MAX_QUERY_CHARS})")
  parts = re.findall(r'"([^"]+)"|(\S+)', query)
  terms = []
  for phrase, word in parts:
    t = phrase or word
    t = re.sub(r"[^\w\s.]", " ", t).strip()
    if t:
      terms.append('"' + t.replace('"', '""') + '"')
  if len(terms) > MAX_TERMS:
    raise ValueError(f"too many search terms ({len(terms)}; at most {MAX_TERMS})")
  return " AND ".join(terms)


def parse_call(action: str) -> tuple[str, dict[str, Any]]:
  """`search(...)` / `open(...)` -> (name, kwargs); raises ValueError saying why."""
  return base.parse_call(action, {"search": ("query", "page"), "open": ("doc_id", "page")})


def generate_world(seed: int) -> dict[str, Any]:
  """The document collection of world `seed` (see `search_worlds.generate_world`)."""
  return search_worlds.generate_world(seed, tuple(MODULES))


def error(observation: str) -> str:
  """The engine's error line when the observation is one ("" otherwise): every failed call is
  answered `Error: why` and nothing else."""
  return observation.split("\n", 1)[0] if observation.startswith("Error: ") else ""


class SearchEnv(Perturbable, base.Env):
  domain = "search"

  def __init__(self, cache_dir: str | None = None, root: str | None = None, perturb: Any = None
               ) -> None:
    super().__init__()
    self.set_perturb(perturb)
    self.per_page = PER_PAGE
    self.withheld: set[str] = set()
    self.root_parent = root
    con = sqlite3.connect(f"file:{ensure_index(cache_dir)}?mode=ro", uri=True)
    self.stdlib = con.execute("SELECT doc_id, title, body FROM docs ORDER BY doc_id").fetchall()
    con.close()
    self.con: sqlite3.Connection | None = None
    self.path = ""  # the current world's index file
    self.ids: list[str] = []

  def _build(self, docs: list[tuple[str, str, str]]) -> None:
    """Indexes the world's documents into a fresh FTS5 file in the episode directory."""
    self.path = os.path.join(self._make_dir("lwm_search_"), "index.sqlite")
    con = sqlite3.connect(self.path)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute("CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, title, body, "
                "tokenize='porter unicode61')")
    con.executemany("INSERT INTO docs VALUES (?,?,?)", docs)
    con.commit()
    con.close()
    self.con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
    self.ids = sorted(d[0] for d in docs)

  def reset(self, seed: int) -> str:
    rng = self._begin(seed)
    opts = self.begin_faults(seed)
    self.per_page = opts.get("page_size", PER_PAGE)
    self.withheld = set(opts.get("withhold", ()))
    world = generate_world(seed)
    self._set_world(world)
    mods = set(world["modules"])
    std = [d for d in self.stdlib if d[0] in mods or d[0].rsplit(".", 1)[0] in mods]
    wiki = [tuple(d) for d in world["wiki"]]
    self._build(std + wiki)
    self.world = world
    if rng.random() < 0.5:
      self.goal = self._stdlib_goal(rng, std)
    else:
      self.goal = self._wiki_goal(rng, world)
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    initial = (f"Search engine over {len(self.ids)} documents: {len(std)} pages of the Python {v} "
               f"standard library documentation (modules {', '.join(world['modules'])}) and "
               f"{len(wiki)} pages of the {world['org']} internal wiki (projects, people, releases, "
               "incidents). No query has been run yet.")
    return self._ready(self.goal["text"], ACTION_SPACE, initial)

  def _stdlib_goal(self, rng: Any, std: list[tuple[str, str, str]]) -> dict[str, Any]:
    funcs = [d for d in std if "." in d[0] and d[0].split(".")[-1][:1].islower()]
    target, title, _ = rng.choice(funcs)
    words = [w for w in re.findall(r"[a-z]{4,}", title.split(":", 1)[-1].lower()) if w not in _STOP]
    name = target.split(".")[-1]
    what = re.sub(rf"\b{re.escape(name)}\b", "...", title.split(": ", 1)[-1])
    return {"kind": "stdlib", "target": target, "words": words, "name": name,
            "module": target.rsplit(".", 1)[0],
            "text": f"Find the standard-library function or class documented as \"{what}\" "
                    "and read its signature."}

  def _wiki_goal(self, rng: Any, world: dict[str, Any]) -> dict[str, Any]:
    rels = [d for d in world["wiki"] if d[0].startswith("releases/")]
    target, title, body = rng.choice(rels)
    feature = rng.choice(re.findall(r"^  - (.+) for ", body, re.M))
    project = re.search(r"Project: \[(\S+)\]", body).group(1)
    code = project.split("/")[1]
    ask = rng.choice(["who managed it", "its release date", "which release it requires, if any"])
    return {"kind": "wiki", "target": target, "words": feature.split() + [code], "name": code,
            "module": project,
            "text": f"In the {world['org']} wiki, find the release of {code.title()} that introduced "
                    f"{feature} and read {ask}."}

  def episode_meta(self) -> dict[str, Any]:
    return {"target_doc": self.goal.get("target"), "task_kind": self.goal.get("kind"), "collection":
            f"pydoc text of {len(self.world['modules'])} stdlib modules, python {sys.version.split()[0]}, "
            f"and a generated wiki of {len(self.world['wiki'])} pages"}

  def step(self, action: str) -> str:
    if self.con is None:
      raise RuntimeError("call reset(seed) before step()")
    self.steps += 1
    self.step_error = ""
    try:
      name, kw = parse_call(action)
      fault = self.faults.call() if self.faults else None
      if fault:  # the engine received the call and failed it
        return self._fail(self.fault_text(fault), fault)
      if name == "search":
        return self.search(str(kw.get("query", "")), kw.get("page", 1))
      return self.open(str(kw.get("doc_id", "")), kw.get("page", 1))
    except ValueError as e:
      return self._fail(str(e), "invalid call")
    except sqlite3.Error as e:
      return self._fail(str(e), "engine error")

  def _fail(self, message: str, reason: str) -> str:
    """An error answer: the engine refused or failed the call (`step_error` says which)."""
    self.step_error = reason
    return f"Error: {message}"

  def state_digest(self) -> str | None:
    """Searching and opening documents change nothing: the collection is read-only."""
    return "read-only"

  def search(self, query: str, page: Any = 1) -> str:
    if not isinstance(page, int) or page < 1:
      return self._fail(f"page must be a positive integer, got {page!r}", "bad page")
    expr = _fts_query(query)
    if not expr:
      return self._fail("empty query", "empty query")
    n = self.con.execute("SELECT COUNT(*) FROM docs WHERE docs MATCH ?", (expr,)).fetchone()[0]
    if n == 0:
      return f'No results for "{query}".'
    per = self.per_page
    pages = (n + per - 1) // per
    if page > pages:
      return self._fail(f'page {page} is past the last page ({pages}) of results for "{query}".',
                        "bad page")
    rows = self.con.execute(
        "SELECT doc_id, title, snippet(docs, 2, '**', '**', ' ... ', 16), bm25(docs, 0, 5.0, 1.0) AS s "
        "FROM docs WHERE docs MATCH ? ORDER BY s, doc_id LIMIT ? OFFSET ?",
        (expr, per, (page - 1) * per)).fetchall()
    out = [f'Results {(page - 1) * per + 1}-{(page - 1) * per + len(rows)} of {n} for '
           f'"{query}" (page {page} of {pages})']
    hide = self.withheld
    for k, (doc_id, title, snip, score) in enumerate(rows, (page - 1) * per + 1):
      snip = " ".join(snip.split())
      head = f"\n{k}. [{doc_id}]" + ("" if "title" in hide else f" {title}")
      detail = [x for f, x in (("score", f"score {-score:.2f}"), ("snippet", snip)) if f not in hide]
      out.append(head + (f"\n   {' | '.join(detail)}" if detail else ""))
    return "\n".join(out)

  def open(self, doc_id: str, page: Any = 1) -> str:
    if not isinstance(page, int) or page < 1:
      return self._fail(f"page must be a positive integer, got {page!r}", "bad page")
    row = self.con.execute("SELECT title, body FROM docs WHERE doc_id=?", (doc_id,)).fetchone()
    if row is None:
      return self._fail(f"no document with id '{doc_id}'.", "no such document")
    lines = row[1].splitlines()
    pages = max(1, (len(lines) + LINES_PER_PAGE - 1) // LINES_PER_PAGE)
    if page > pages:
      return self._fail(f"document '{doc_id}' has {pages} page(s); page {page} does not exist.",
                        "bad page")
    chunk = "\n".join(lines[(page - 1) * LINES_PER_PAGE: page * LINES_PER_PAGE])
    return base.truncate(f"[{doc_id}] page {page} of {pages}\n\n{chunk}", self.max_obs_chars)

  def close(self) -> None:
    if self.con is not None:
      self.con.close()
      self.con = None
    self._remove_dir()


_STOP = {"return", "returns", "with", "from", "that", "this", "into", "given", "object", "objects",
         "none", "true", "false", "which", "their", "each", "when", "than", "them", "they", "over"}


class SearchAgent(base.Agent):
  """Searches with words from the task, pages on, reformulates, opens the best-looking hit."""

  def begin(self, env: base.Env, initial_state: str) -> None:
    r, g = self.rng, env.goal
    self.g = g
    words = g["words"] or [g["name"]]
    q = " ".join(r.sample(words, min(len(words), r.randint(1, 3))))
    self.queries = []
    if r.random() < 0.4:  # a broad first query: many pages of results
      self.queries.append(r.choice(words))
    if r.random() < 0.25:  # a typo or an over-specific query that finds nothing
      self.queries.append(q + " " + r.choice(["asynchronously recursively", "zzqx", "frobnicate"]))
    self.queries.append(q)
    self.queries.append(f"{g['name']} {g['module'].split('.')[-1]}")
    self.follow = r.randint(1, 5)
    self.pages_seen = 0
    self.opened = False
    self.budget = r.randint(8, 16)
    self.last_query = ""
    self.page = 1
    self.doc_page = 1

  def act(self, observation: str) -> str | None:
    r, g = self.rng, self.g
    self.budget -= 1
    if self.budget < 0:
      return None
    if self.opened:
      if "page 1 of" in observation and "page 1 of 1\n" not in observation and r.random() < 0.5:
        self.doc_page += 1
        return f'open(doc_id="{g["target"]}", page={self.doc_page})'
      if self.follow <= 0:
        return None
      self.follow -= 1
      return self._follow_up()
    return self._look(observation)

  def _follow_up(self) -> str:
    r, g = self.rng, self.g
    if not hasattr(self, "options"):
      self.options = r.sample([f'open(doc_id="{g["module"]}")', f'open(doc_id="{g["target"]}", page=9)',
                       f'open(doc_id="{g["name"]}")', f'search(query="{g["name"]} example")',
                       f'search(query="{g["module"]}", page=2)', f'search(query="{g["name"]}")',
                       f'search(query="{r.choice(g["words"] or [g["name"]])} {g["module"]}")',
                       f'open(doc_id="{g["module"]}.{r.choice(["load", "open", "run", "copy", "get"])}")'], 8)
    return self.options.pop()

  def _look(self, observation: str) -> str:
    r, g = self.rng, self.g
    ids = re.findall(r"^\d+\. \[([^\]]+)\]", observation, re.M)
    if g["target"] in ids:
      self.opened = True
      if r.random() < 0.3 and ids[0] != g["target"]:
        self.opened = False
        return f'open(doc_id="{ids[0]}")'  # opens a wrong hit first
      return f'open(doc_id="{g["target"]}")'
    if ids and "(page " in observation and self.pages_seen < 2 and r.random() < 0.7:
      m = re.search(r"\(page (\d+) of (\d+)\)", observation)
      if m and int(m.group(1)) < int(m.group(2)):
        self.pages_seen += 1
        return f'search(query="{self.last_query}", page={int(m.group(1)) + 1})'
    if self.queries:
      self.last_query = self.queries.pop(0)
      self.pages_seen = 0
      if r.random() < 0.1:
        return f"search({self.last_query!r}, 0)"
      return f'search(query="{self.last_query}")'
    self.opened = True
    return f'open(doc_id="{g["target"]}")'


if __name__ == "__main__":
  if sys.argv[1:2] != ["--build"] or len(sys.argv) != 3:
    sys.exit("usage: python -m lwm_jax.envs.search.env --build INDEX_PATH")
  write_index(sys.argv[2])
