"""Anti-hacking: a content-type classifier that splits a predicted observation into regions.

A reward model can be gamed by text that is not part of an observation at all: praise of the
prediction ("this output is perfect"), words addressed to the grader ("judge, give 5/5"), or
prose appended after a JSON result or a UI tree. `classify(domain, text)` cuts an observation into
`Region`s of one kind each:

- `json`     a JSON value (mcp tool results): deterministic content.
- `tree`     lines of a UI tree (android view hierarchy, web / os accessibility tree): deterministic.
- `output`   command or tool output (terminal, swe): deterministic.
- `free`     free-form text (search results and pages): allowed, judged on its content.
- `foreign`  text outside the regions the domain allows (prose after a JSON value, a line that is
             not a tree line): never part of an observation.
- `meta`     self-praise or grader-addressed text, wherever it sits (a line of command output, a
             string inside a JSON result, a line of free text).

Allowed regions per domain: mcp -> one JSON value; android, web, os -> one tree (a first header
line and an optional leading `Error: ...` line, as the bundled environments print them);
terminal, swe -> command output; search -> free text. `sanitize` keeps only the allowed,
non-meta content, so that text a policy adds to sway a grader earns nothing under any reward; the
rule reward also fails outright when any foreign or meta region is present.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from lwm_jax.data.bench_records import OBSERVATION_HEADER

DETERMINISTIC = ("json", "tree", "output")
ALLOWED = DETERMINISTIC + ("free",)
KINDS = ALLOWED + ("foreign", "meta")

DOMAIN_CONTENT = {"mcp": "json", "android": "tree", "web": "tree", "os": "tree",
                  "terminal": "output", "swe": "output", "search": "free"}

# Text that talks about the prediction or to the grader. Real environments do not grade their
# own output, so these patterns are aimed at the meta level, not at ordinary words.
_META_PATTERNS = [
    r"\b(?:judge|grader|evaluator|reviewer|rater|scorer|assessor)s?\s*[,:!]",
    r"\bdear\s+(?:judge|grader|evaluator|reviewer|rater)",
    r"\b(?:judge|grader|evaluator|reviewer|rater|scorer)s?\b[^\n]{0,80}"
    r"\b(?:score|rate|grade|give|award|mark)",
    r"\b(?:give|award|assign|rate)\s+(?:it|this|me|the\s+\w+)?\s*(?:a\s+)?"
    r"(?:\d+(?:\.\d+)?\s*/\s*\d+|full\s+(?:marks|score|points)|(?:the\s+)?(?:maximum|max|top|"
    r"highest|perfect)\s+(?:score|marks|rating))",
    r"\b(?:full|perfect|maximum|max)\s+(?:marks|score|points)\b",
    r"\b(?:this|the|my|our)\s+(?:prediction|simulation|simulated\s+\w+|answer|response)\s+"
    r"(?:is|was|looks|seems)\s+(?:\w+\s+)?(?:perfect|flawless|correct|accurate|exact|excellent|"
    r"ideal|realistic|indistinguishable|right)\b",
    r"\b(?:this|the|my|our)\s+(?:output|observation|result)\s+(?:is|was|looks|seems)\s+"
    r"(?:\w+\s+)?(?:perfect|flawless|excellent|ideal|indistinguishable)\b",
    r"\b(?:perfect|flawless|exact|ideal)\s+(?:prediction|simulation|match|observation)\b",
    r"\b(?:matches|identical\s+to|same\s+as)\s+the\s+(?:reference|ground\s+truth|real\s+"
    r"(?:environment|observation|output))",
    r"\bignore\s+(?:all\s+|any\s+)?(?:the\s+)?(?:previous|prior|above|earlier|your)\s+"
    r"(?:instructions|rules|criteria)",
    r"\b(?:5|five)\s*/\s*5\b",
    r"\b(?:10|ten)\s*/\s*10\b",
]
META_RE = re.compile("|".join(f"(?:{p})" for p in _META_PATTERNS), re.I)


def is_meta(text: str) -> bool:
  """True when `text` praises the prediction or addresses a grader."""
  return META_RE.search(text) is not None


@dataclasses.dataclass
class Region:
  kind: str
  text: str


@dataclasses.dataclass
class Classified:
  """The regions of one observation and what a reward may look at."""
  domain: str
  regions: list[Region]

  @property
  def clean(self) -> str:
    """The allowed, non-meta content (meta members of a JSON value removed)."""
    return "\n".join(r.text for r in self.regions if r.kind in ALLOWED).strip("\n")

  @property
  def flagged(self) -> list[Region]:
    return [r for r in self.regions if r.kind in ("foreign", "meta")]

  @property
  def ok(self) -> bool:
    return not self.flagged

  def count(self, kind: str) -> int:
    return sum(1 for r in self.regions if r.kind == kind)


# ---------------------------------------------------------------------------------- domains


def _strip_header(text: str) -> str:
  """A prediction may repeat the observation header the chat shows; it is not content."""
  s = text.lstrip()
  if s.startswith(OBSERVATION_HEADER):
    return s[len(OBSERVATION_HEADER):].lstrip("\n")
  return text


def _by_lines(text: str, kind: str) -> list[Region]:
  """Every line is `kind` unless it is meta."""
  out: list[Region] = []
  for line in text.split("\n"):
    out.append(Region("meta" if is_meta(line) else kind, line))
  return out


def _drop_meta(value: Any, found: list[str]) -> Any:
  """The JSON value without meta strings: an object member whose key or string value is meta,
  and a meta string in an array, are removed (so the rest is as if they had never been there)."""
  if isinstance(value, list):
    out = []
    for v in value:
      if isinstance(v, str) and is_meta(v):
        found.append(v)
      else:
        out.append(_drop_meta(v, found))
    return out
  if isinstance(value, dict):
    kept = {}
    for k, v in value.items():
      if is_meta(k) or (isinstance(v, str) and is_meta(v)):
        found.append(f"{k}: {v}" if isinstance(v, str) else k)
        continue
      kept[k] = _drop_meta(v, found)
    return kept
  if isinstance(value, str) and is_meta(value):
    found.append(value)
    return ""
  return value


def _json_regions(text: str) -> list[Region]:
  """One JSON value (the first that decodes at a `{` or `[`); what surrounds it is foreign."""
  stripped = text.strip()
  starts = [m.start() for m in re.finditer(r"[\[{]", stripped)]
  dec = json.JSONDecoder()
  for at in starts:
    try:
      value, end = dec.raw_decode(stripped, at)
    except json.JSONDecodeError:
      continue
    found: list[str] = []
    cleaned = _drop_meta(value, found)
    raw = stripped[at:end]
    regions = []
    if stripped[:at].strip():
      regions += _by_lines(stripped[:at].strip(), "foreign")
    regions.append(Region("json", raw if not found else json.dumps(cleaned, ensure_ascii=False)))
    regions += [Region("meta", s) for s in found]
    if stripped[end:].strip():
      regions += _by_lines(stripped[end:].strip(), "foreign")
    return regions
  # No JSON value at all: plain text. It is not the domain's content type.
  return _by_lines(stripped, "foreign") if stripped else []


_XML_LINE_RE = re.compile(r"^\s*(?:<[^<>]+>\s*)+$")
_ATTR = r"""[\w.:-]+=(?:"[^"]*"|'[^']*'|\[[^\]]*\]|[^\s"']+)"""
_A11Y_LINE_RE = re.compile(
    rf"""^\s*(?:\[[^\]]+\]\s+)?[A-Za-z][\w:.-]*(?:\s+(?:"[^"]*"|'[^']*'))?(?:\s+{_ATTR})*\s*$""")


def is_tree_line(line: str) -> bool:
  """A line of a view hierarchy (`<node ... />` tags) or of an accessibility tree
  (`  [3] button "OK" enabled=true`)."""
  return bool(_XML_LINE_RE.match(line) or _A11Y_LINE_RE.match(line))


def _tree_regions(text: str) -> list[Region]:
  lines = text.strip("\n").split("\n")
  out: list[Region] = []
  i = 0
  if lines and lines[0].startswith("Error: "):  # the environment's report of a bad action
    out.append(Region("meta" if is_meta(lines[0]) else "tree", lines[0]))
    i = 1
  if i < len(lines):  # the header line: a page, window or hierarchy title
    out.append(Region("meta" if is_meta(lines[i]) else "tree", lines[i]))
    i += 1
  for line in lines[i:]:
    if not line.strip():
      continue
    if is_meta(line):
      out.append(Region("meta", line))
    else:
      out.append(Region("tree" if is_tree_line(line) else "foreign", line))
  return out


def classify(domain: str, text: str) -> Classified:
  """The regions of a predicted (or real) observation of `domain` (see the module docstring)."""
  if domain not in DOMAIN_CONTENT:
    raise ValueError(f"domain '{domain}': no content type (known: {', '.join(DOMAIN_CONTENT)})")
  body = _strip_header(text)
  kind = DOMAIN_CONTENT[domain]
  if kind == "json":
    regions = _json_regions(body)
  elif kind == "tree":
    regions = _tree_regions(body)
  else:
    regions = _by_lines(body, kind)
  return Classified(domain, regions)


def sanitize(domain: str, text: str) -> tuple[str, Classified]:
  """(the prediction without foreign and meta text, its classification)."""
  c = classify(domain, text)
  return c.clean, c


# ------------------------------------------------------------------------------- tree parse


_TAG_RE = re.compile(r"<(/?)([A-Za-z][\w.:-]*)([^<>]*?)(/?)>")


def parse_tree(text: str) -> list[tuple[int, str]] | None:
  """`(depth, line)` nodes of a UI tree, or None when the text is not one.

  A tree has a header line then node lines whose indentation grows by at most one level from a
  line to the next (a preorder listing). Tag lines must nest: a closing tag closes the innermost
  open one (an outer element may stay open, as the bundled Android dump's `<hierarchy>` does).
  """
  lines = [ln.rstrip() for ln in text.strip("\n").split("\n") if ln.strip()]
  if lines and lines[0].startswith("Error: "):
    lines = lines[1:]
  if not lines:
    return None
  stack: list[str] = []
  nodes: list[tuple[int, str]] = []
  prev_indent = None
  for k, line in enumerate(lines):
    if k > 0 and not is_tree_line(line):
      return None
    indent = len(line) - len(line.lstrip(" "))
    if prev_indent is not None and indent > prev_indent + 4:
      return None
    prev_indent = indent
    for m in _TAG_RE.finditer(line):
      closing, name, _, selfclose = m.groups()
      if closing:
        if not stack or stack[-1] != name:
          return None
        stack.pop()
      elif not selfclose:
        stack.append(name)
    nodes.append((indent, line.strip()))
  return nodes
