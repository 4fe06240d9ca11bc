"""One JSONL reader: hostile bytes, broken gzip, deep nesting, lone surrogates, quarantine files."""
import gzip
import json
import os
import subprocess
import sys

import pytest

from lwm_jax.data import importers, jsonl, schema, tfds_trajectories

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(REPO, "tests", "fixtures", "data", "trajectories.jsonl")
GOOD = [line for line in open(FIX, encoding="utf-8") if line.strip()]
IDS = [json.loads(line)["id"] for line in GOOD]


def _write(path, data: bytes):
  path.write_bytes(data)
  return str(path)


def _load(path, mode="skip", **kw):
  trajs, rep = importers.load_any(path, mode=mode, **kw)
  return [t.id for t in trajs], rep


def test_non_utf8_line_is_skipped_with_file_and_line(tmp_path):
  p = _write(tmp_path / "x.jsonl", GOOD[0].encode() + b'{"id": "caf\xe9"}\n' + GOOD[1].encode())
  ids, rep = _load(p)
  assert ids == IDS[:2] and dict(rep.bad) == {"bad_utf8": 1}
  assert f"{p}:2: not UTF-8 (byte 0xe9 at column 12)" in rep.summary()
  with pytest.raises(ValueError, match=r"x\.jsonl:2: not UTF-8"):
    _load(p, mode="strict")


def test_truncated_gzip_keeps_the_records_before_the_break(tmp_path):
  whole = gzip.compress("".join(GOOD).encode())
  p = _write(tmp_path / "t.jsonl.gz", whole[:len(whole) * 2 // 3])
  # Independent reference: the complete lines zlib can recover from the same bytes.
  readable = gzip.zlib.decompressobj(31).decompress(whole[:len(whole) * 2 // 3]).count(b"\n")
  assert 0 < readable < len(GOOD)
  ids, rep = _load(p, fmt="trajectory")
  assert ids == IDS[:readable] and dict(rep.bad) == {"truncated_file": 1}
  assert f"{p}:{readable + 1}: the compressed data breaks off after line {readable}" in rep.summary()
  with pytest.raises(ValueError, match=rf"t\.jsonl\.gz:{readable + 1}: the compressed data"):
    _load(p, mode="strict", fmt="trajectory")


def test_gz_name_without_gzip_is_a_clear_error(tmp_path):
  p = _write(tmp_path / "plain.jsonl.gz", "".join(GOOD).encode())
  with pytest.raises(ValueError, match=r"plain\.jsonl\.gz:1: not a gzip file"):
    _load(p, mode="strict")
  ids, rep = _load(p)
  assert ids == [] and dict(rep.bad) == {"truncated_file": 1}


def test_deep_nesting_and_lone_surrogate_are_bad_lines(tmp_path):
  deep = "[" * 100_000 + "]" * 100_000 + "\n"
  rec = json.loads(GOOD[2])
  rec["task"] = "half a pair: \ud83d"
  surrogate = json.dumps(rec) + "\n"  # json.dumps writes the escape \ud83d
  assert "\\ud83d" in surrogate
  pair = json.loads(GOOD[3])
  pair["task"] = "a whole pair \ud83d\ude00 is fine"
  p = _write(tmp_path / "h.jsonl", (GOOD[0] + deep + surrogate + json.dumps(pair) + "\n").encode())
  ids, rep = _load(p)
  assert ids == [IDS[0], IDS[3]]
  assert dict(rep.bad) == {"too_deep": 1, "lone_surrogate": 1}
  assert [line for line, _ in jsonl.iter_jsonl(p, strict=False)] == [1, 2, 3, 4]


def test_quarantine_files_of_same_named_inputs_do_not_overwrite(tmp_path):
  bad = ['{"id": 1}\n', 'not json\n', '{"id": "x", "domain": "mars"}\n']
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  pa = _write(tmp_path / "a" / "x.jsonl", ("".join(GOOD[:2]) + "".join(bad)).encode())
  pb = _write(tmp_path / "b" / "x.jsonl", (GOOD[4] + "".join(bad[:2])).encode())
  qdir = str(tmp_path / "q")
  res = tfds_trajectories.build([pa, pb], str(tmp_path / "out"), mode="skip", quarantine_dir=qdir)
  reported = sum(r.num_bad for r in res.load_reports)
  assert reported == 5
  files = sorted(os.listdir(qdir))
  assert len(files) == 2 and all(f.startswith("x.jsonl.") for f in files)
  on_disk = [json.loads(line) for f in files for line in open(os.path.join(qdir, f))]
  assert len(on_disk) == reported
  assert sorted((os.path.basename(os.path.dirname(r["path"])), r["line"]) for r in on_disk) == [
      ("a", 3), ("a", 4), ("a", 5), ("b", 2), ("b", 3)]
  # A second load appends to the same file instead of replacing it.
  q = schema.quarantine_path(qdir, pb)
  schema.load_jsonl(pb, mode="skip", quarantine=q)
  assert sum(1 for _ in open(q)) == 4


def _cli(*args):
  return subprocess.run([sys.executable, os.path.join(REPO, "launch", "data.py"), *args],
                        capture_output=True, text=True, timeout=300, cwd=REPO)


def test_cli_skip_mode_survives_every_bad_input(tmp_path):
  whole = gzip.compress("".join(GOOD[4:8]).encode())
  _write(tmp_path / "a.jsonl", GOOD[0].encode() + b"\xff\xfe\n" + GOOD[1].encode())
  _write(tmp_path / "b.jsonl.gz", whole[:len(whole) // 2])
  _write(tmp_path / "c.jsonl.gz", GOOD[2].encode())
  _write(tmp_path / "d.jsonl", ("[" * 50_000 + "\n" + '{"t": "\\udc00"}\n' + GOOD[3]).encode())
  proc = _cli("stats", f"--inputs={tmp_path}", "--mode=skip", "--sp_vocab=600")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert f"{tmp_path}/a.jsonl:2: not UTF-8" in proc.stdout
  assert f"{tmp_path}/c.jsonl.gz:1: not a gzip file" in proc.stdout
  assert "bad 2 [lone_surrogate=1, too_deep=1]" in proc.stdout
  assert "truncated_file=1" in proc.stdout


def test_build_on_an_empty_file_is_a_clear_error(tmp_path):
  # `launch/data.py build` prints a ValueError as one "error: ..." line and exits 2.
  empty = _write(tmp_path / "empty.jsonl", b"")
  with pytest.raises(ValueError, match=rf"nothing to build from {empty}: 0 records loaded, 0 bad"):
    tfds_trajectories.build([empty], str(tmp_path / "out"))
