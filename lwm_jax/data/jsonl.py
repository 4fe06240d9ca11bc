"""One reader for every JSON-lines file of the project (plain or gzip).

`iter_jsonl(path)` yields `(line number, value)` for each non-blank line. A line that cannot be
used is never a crash and never silently lost:

- not UTF-8, bad JSON, nesting too deep for the parser, or a string holding a lone UTF-16
  surrogate (`"\\ud800"`, which no UTF-8 file or tokenizer can carry) -> a `BadLine` with a
  short `reason`;
- a gzip file that is truncated, or a `.gz` that is not gzip at all -> one `BadLine` with reason
  `truncated_file` after the last readable line; reading stops there and every record before the
  break has already been yielded.

With `strict=True` (the default) the first bad line raises `ValueError("path:line: why")`
instead of being yielded.

`byte_range=(start, end, lines_before)` reads only the lines that start in [start, end) of a plain
(not gzip) file, numbering them from `lines_before + 1`; `start` must be a line start (see
`lwm_jax.data.corpus_build.plan_shards`, which cuts big files into such ranges). `end=None` reads
to the end of the file.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import re
import zlib
from typing import Any, Iterator

# A \uD800-\uDFFF escape in the raw text; only then can a parsed string hold a lone surrogate.
_SURROGATE_ESCAPE_RE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclasses.dataclass
class BadLine(ValueError):
  """A line that holds no usable value; `reason` is a short key used for counting."""
  lineno: int
  reason: str
  message: str
  text: str

  def __str__(self) -> str:
    return self.message


def open_text(path: str | os.PathLike, mode: str) -> io.TextIOBase:
  """UTF-8 text; gzip when the name ends in .gz (written with mtime 0: same records, same bytes)."""
  path = os.fspath(path)
  if path.endswith(".gz"):
    if mode in ("w", "a"):
      return io.TextIOWrapper(gzip.GzipFile(path, mode + "b", mtime=0), encoding="utf-8")
    return gzip.open(path, mode + "t", encoding="utf-8")
  return open(path, mode, encoding="utf-8")


def _open_bytes(path: str) -> io.BufferedIOBase:
  if "://" in path:  # an object store (gs://, s3://, ...): read through etils.epath (needs its
    from etils import epath  # backend, e.g. gcsfs, where the build runs)
    raw = epath.Path(path).open("rb")
    return gzip.GzipFile(fileobj=raw, mode="rb") if path.endswith(".gz") else raw
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _find_surrogate(value: Any) -> str | None:
  """The first string (key or value) inside `value` that holds a lone surrogate, or None."""
  stack = [value]
  while stack:
    v = stack.pop()
    if isinstance(v, str):
      if any("\ud800" <= c <= "\udfff" for c in v):
        return v
    elif isinstance(v, dict):
      stack.extend(v.keys())
      stack.extend(v.values())
    elif isinstance(v, list):
      stack.extend(v)
  return None


def _no_constant(name: str) -> Any:
  raise ValueError(f"{name} is not a JSON number (NaN and Infinity are not allowed here)")


def parse_line(raw: bytes, lineno: int, allow_nan: bool = True) -> Any:
  """The JSON value of one line; raises `BadLine` for the cases listed in the module docstring
  (and, with `allow_nan=False`, for NaN / Infinity, which strict JSON does not have)."""
  text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
  try:
    line = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise BadLine(lineno, "bad_utf8", f"not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                  f"{e.start + 1})", text) from None
  try:
    value = json.loads(line) if allow_nan else json.loads(line, parse_constant=_no_constant)
  except json.JSONDecodeError as e:
    raise BadLine(lineno, "bad_json", f"bad JSON: {e}", text) from None
  except ValueError as e:  # _no_constant
    raise BadLine(lineno, "not_finite", f"bad JSON: {e}", text) from None
  except RecursionError:
    raise BadLine(lineno, "too_deep", "bad JSON: nested too deeply to parse", text) from None
  if _SURROGATE_ESCAPE_RE.search(raw):
    try:
      bad = _find_surrogate(value)
    except RecursionError:
      raise BadLine(lineno, "too_deep", "bad JSON: nested too deeply to read", text) from None
    if bad is not None:
      raise BadLine(lineno, "lone_surrogate", f"string {bad[:40]!r} holds a lone UTF-16 "
                    "surrogate (not representable in UTF-8)", text)
  return value


def iter_jsonl(path: str | os.PathLike, strict: bool = True,
               allow_nan: bool = True,
               byte_range: tuple[int, int | None, int] | None = None
               ) -> Iterator[tuple[int, Any]]:
  """Yields (line number, value) per non-blank line; see the module docstring for bad lines.
  Data records read with `allow_nan=False` (a metrics log may hold a NaN loss)."""
  name = os.fspath(path)
  lineno = 0
  pos, end = 0, None
  if byte_range is not None:
    if name.endswith(".gz"):
      raise ValueError(f"{name}: a byte range needs a plain file, not gzip")
    pos, end, lineno = byte_range
  with _open_bytes(name) as f:
    if pos:
      f.seek(pos)
    lines = iter(f)
    while True:
      if end is not None and pos >= end:
        return
      try:
        raw = next(lines)
      except StopIteration:
        return
      except (EOFError, OSError, zlib.error) as e:
        if isinstance(e, gzip.BadGzipFile) and lineno == 0:
          why = "not a gzip file, although its name ends in .gz"
        else:
          why = (f"the compressed data breaks off after line {lineno} ({e}); "
                 f"the {lineno} lines before the break were read")
        bad = BadLine(lineno + 1, "truncated_file", why, "")
        if strict:
          raise ValueError(f"{name}:{bad.lineno}: {bad}") from None
        yield bad.lineno, bad
        return
      lineno += 1
      pos += len(raw)
      if not raw.strip():
        continue
      try:
        value = parse_line(raw, lineno, allow_nan)
      except BadLine as bad:
        if strict:
          raise ValueError(f"{name}:{lineno}: {bad}") from None
        yield lineno, bad
        continue
      yield lineno, value
