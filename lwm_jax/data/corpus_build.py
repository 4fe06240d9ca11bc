"""The corpus-wide build steps as per-shard and per-key parts, and the streaming local build.

A build turns trajectory JSONL files into the TFDS dataset (`tfds_trajectories`). Three paths run
it and give the same records, splits, counts and MANIFEST:

- `memory`: the original builder; every trajectory of every input is held at once;
- `stream`: this module's `StreamingBuild`, in bounded memory on one machine;
- `beam`:   `build_beam.py`, the same parts as a Beam pipeline (DirectRunner, Dataflow, Spark, Flink).

The stream and Beam paths share the parts defined here:

1. `plan_shards` cuts the inputs into shards: one per file, and for a plain (not gzip) file in the
   trajectory format that is larger than `shard_bytes`, one per byte range that starts at a line
   start (the planner counts the lines before each cut, so error messages and quarantine entries
   keep their file line numbers). AgentWorldBench files (merged per trajectory id within a file)
   and chat files (ids numbered per file) are always one shard, and so is a file on an object
   store (gs://..., read through etils.epath), which is not cut into ranges.
2. `read_shard` validates (strict/skip, quarantine entries), applies the hygiene filters, draws the
   split (by id hash, or by world hash) and yields one `Rec` per kept trajectory, then a `Summary`
   (load counts per file and hygiene counts), which merges with `merge_summaries` in any order.
3. Records are grouped by key: by trajectory id (a repeated id is an error, as in the original
   builder) and, with de-duplication, by (domain, action digest): `resolve_duplicates` replays a
   group in collection order (file index, then line) through `hygiene.DuplicateFilter`, so a group
   gets the same decisions as the one-process filter gets for the whole corpus.
4. `manifest` turns the merged counts into MANIFEST.json: kept, dropped by reason, duplicates,
   trajectories, turns and distinct worlds per split, trajectories per domain and split.

Memory of the streaming build (`StreamingBuild`): pass 1 reads one shard at a time and writes
each kept record to a spill file of its split and a small key line (id, de-duplication key, order)
to one of P hash partitions on disk; the resolve step loads one partition at a time (about 1/P of
the key lines) and keeps only the orders of the dropped duplicates (8 bytes each); pass 2 streams
the split files to the TFDS writer, skipping dropped orders, and writes (split, world) lines to P
more partitions, counted one at a time for the distinct worlds. Peak memory is then one shard's
reader, one partition's keys, the dropped orders and the TFDS writer's own buffer (TFDS spills its
shuffle to disk past a fixed size); never the corpus. P grows with the input size (`partitions_for`).
"""
from __future__ import annotations

import array
import collections
import dataclasses
import json
import os
import shutil
import tempfile
import zlib
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from lwm_jax.data import hygiene as hygiene_lib
from lwm_jax.data import importers, schema, splits
from lwm_jax.data.schema import LoadReport, Trajectory

SPLITS = ("train", "validation", "test")
DEFAULT_SHARD_BYTES = 64 << 20
_ORDER_SHIFT = 40  # a packed order is file_index << 40 | position (lines per file < 2**40)


@dataclasses.dataclass(frozen=True)
class BuildConfig:
  """What a build does with its inputs (the same for every path)."""
  fmt: str = "auto"
  mode: str = "strict"
  quarantine_dir: str | None = None
  apply_hygiene: bool = True
  split_by: str = "id"          # "id": hash of (seed, id) with `fractions`; "world": splits.split_of_world
  fractions: tuple[float, float, float] = (0.9, 0.05, 0.05)
  split_seed: int = 0
  dedup: bool = False           # drop repeated action sequences (hygiene.DuplicateFilter)

  def __post_init__(self):
    if self.mode not in ("strict", "skip"):
      raise ValueError(f"mode must be 'strict' or 'skip', got '{self.mode}'")
    if self.split_by not in ("id", "world"):
      raise ValueError(f"split_by must be 'id' or 'world', got '{self.split_by}'")
    f = self.fractions
    if len(f) != 3 or abs(sum(f) - 1.0) > 1e-6 or min(f) < 0:
      raise ValueError(f"split_fractions must be 3 non-negative numbers summing to 1, got {f}")

  def quarantine_for(self, path: str) -> str | None:
    if self.quarantine_dir and self.mode == "skip":
      return schema.quarantine_path(self.quarantine_dir, path)
    return None

  def split_for(self, traj: Trajectory, path: str) -> str:
    """The split of a kept trajectory; with split_by='world' a missing world id is an error."""
    if self.split_by == "world":
      world = splits.world_of(traj)
      if world is None:
        raise splits.MissingWorldError(
            f"{path}: trajectory id '{traj.id}' has no meta['{splits.WORLD_KEY}'] (split_by=world "
            "draws splits by world id)")
      return splits.split_of_world(world)
    from lwm_jax.data.tfds_trajectories import split_of  # the original builder's rule
    return split_of(traj.id, self.fractions, self.split_seed)

  def as_dict(self) -> dict[str, Any]:
    d = {"split_by": self.split_by, "dedup": self.dedup, "mode": self.mode,
         "hygiene": self.apply_hygiene, "fmt": self.fmt}
    if self.split_by == "id":
      d.update(fractions=list(self.fractions), split_seed=self.split_seed)
    return d


def dedup_world(traj: Trajectory) -> str:
  """The world a duplicate check compares: the recorded id, else the initial-state stand-in."""
  return splits.world_of(traj) or splits.stand_in_world(traj)


# --- shards -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Shard:
  path: str
  file_index: int
  fmt: str
  start: int = 0
  end: int | None = None      # None: to the end of the file
  lines_before: int = 0

  @property
  def byte_range(self) -> tuple[int, int | None, int] | None:
    if self.start == 0 and self.end is None:
      return None
    return (self.start, self.end, self.lines_before)


def _cuts(path: str, shard_bytes: int) -> list[tuple[int, int]]:
  """(byte offset, lines before it) of each line start at or after every `shard_bytes` step."""
  cuts, pos, lines, target = [(0, 0)], 0, 0, shard_bytes
  with open(path, "rb") as f:
    while True:
      block = f.read(1 << 24)
      if not block:
        break
      while target < pos + len(block):
        nl = block.find(b"\n", max(0, target - pos))
        if nl < 0:
          target = pos + len(block)
          break
        cut = pos + nl + 1
        cuts.append((cut, lines + block.count(b"\n", 0, nl + 1)))
        target = cut + shard_bytes
      lines += block.count(b"\n")
      pos += len(block)
  return [c for c in cuts if c[0] < pos] or [(0, 0)]


def _isfile(path: str) -> bool:
  if "://" in path:
    from etils import epath  # pylint: disable=import-outside-toplevel
    return epath.Path(path).is_file()
  return os.path.isfile(path)


def plan_shards(paths: Sequence[str], fmt: str = "auto",
                shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[Shard]:
  """Shards of the inputs in collection order (see the module docstring)."""
  shards = []
  for i, path in enumerate(paths):
    path = os.fspath(path)
    if not _isfile(path):
      raise FileNotFoundError(f"{path}: no such input file")
    f = importers.sniff_format(path) if fmt == "auto" else fmt
    if (f == "trajectory" and not path.endswith(".gz") and "://" not in path
        and os.path.getsize(path) > shard_bytes):
      cuts = _cuts(path, shard_bytes)
      for k, (start, before) in enumerate(cuts):
        end = cuts[k + 1][0] if k + 1 < len(cuts) else None
        shards.append(Shard(path, i, f, start, end, before))
    else:
      shards.append(Shard(path, i, f))
  return shards


# --- one shard ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Rec:
  """A kept trajectory: its order in the collection, its keys and its example text."""
  order: tuple[int, int]      # (file index, line, or position in a merged AgentWorldBench file)
  id: str
  domain: str
  split: str
  world: str | None           # the recorded world id (None when there is none)
  dedup_world: str
  digest: str                 # action digest ("" without de-duplication)
  num_turns: int
  json: str

  def example(self) -> dict[str, Any]:
    return {"id": self.id, "domain": self.domain, "num_turns": self.num_turns, "json": self.json}


def empty_summary() -> dict[str, Any]:
  return {"files": {}, "hygiene": {"kept": 0, "dropped": {}, "turns_dropped": {}}}


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
  out = dict(a)
  for k, v in b.items():
    out[k] = out.get(k, 0) + v
  return out


def merge_summaries(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
  """Load and hygiene counts of two sets of shards (associative and commutative)."""
  files = dict(a["files"])
  for fi, r in b["files"].items():
    if fi in files:
      o = files[fi]
      ex = sorted({tuple(e) for e in o["examples"]} | {tuple(e) for e in r["examples"]})
      files[fi] = {"path": r["path"], "quarantine": r["quarantine"],
                   "loaded": o["loaded"] + r["loaded"], "bad": _add(o["bad"], r["bad"]),
                   "examples": [list(e) for e in ex[:schema.MAX_EXAMPLES]]}
    else:
      files[fi] = r
  ha, hb = a["hygiene"], b["hygiene"]
  return {"files": files, "hygiene": {
      "kept": ha["kept"] + hb["kept"], "dropped": _add(ha["dropped"], hb["dropped"]),
      "turns_dropped": _add(ha["turns_dropped"], hb["turns_dropped"])}}


def _shard_trajectories(shard: Shard, cfg: BuildConfig, report: LoadReport,
                        sink: Callable[[int, str], None] | None
                        ) -> Iterator[tuple[int, Trajectory]]:
  q = cfg.quarantine_for(shard.path)
  kw = dict(mode=cfg.mode, report=report, quarantine=q if sink is None else None,
            quarantine_sink=sink)
  if shard.fmt == "trajectory":
    yield from schema.iter_records(shard.path, Trajectory.from_dict, byte_range=shard.byte_range,
                                   **kw)
  elif shard.fmt == "awb":  # merged per id within the file, as importers.load_awb_jsonl does
    best: dict[str, Trajectory] = {}
    for _, t in schema.iter_records(shard.path, importers._parse_awb, **kw):  # noqa: SLF001
      if t.id not in best or len(t.turns) > len(best[t.id].turns):
        best[t.id] = t
    yield from enumerate(best.values())
  elif shard.fmt == "chat":
    base, counter = os.path.basename(shard.path), iter(range(1, 1 << 62))

    def parse(obj: Any) -> Trajectory:
      return importers.trajectory_from_chat(obj, None, f"{base}:{next(counter)}")

    yield from schema.iter_records(shard.path, parse, **kw)
  else:
    raise ValueError(f"unknown format '{shard.fmt}' (expected auto, trajectory, awb or chat)")


def read_shard(shard: Shard, cfg: BuildConfig,
               quarantine_sink: Callable[[int, str], None] | None = None
               ) -> Iterator[Rec | dict[str, Any]]:
  """Yields a `Rec` per kept trajectory of the shard, then its summary (a dict, last)."""
  q = cfg.quarantine_for(shard.path)
  if q is not None and quarantine_sink is None:
    os.makedirs(cfg.quarantine_dir, exist_ok=True)
  report = LoadReport(path=shard.path, quarantine=q)
  hyg = hygiene_lib.HygieneReport()
  for pos, traj in _shard_trajectories(shard, cfg, report, quarantine_sink):
    if cfg.apply_hygiene:
      kept = hygiene_lib.filter_trajectories([traj], hyg)
      if not kept:
        continue
      traj = kept[0]
    yield Rec(order=(shard.file_index, pos), id=traj.id, domain=traj.domain,
              split=cfg.split_for(traj, shard.path), world=splits.world_of(traj),
              dedup_world=dedup_world(traj) if cfg.dedup else "",
              digest=hygiene_lib.action_digest(traj) if cfg.dedup else "",
              num_turns=len(traj.turns), json=json.dumps(traj.to_dict(), ensure_ascii=False))
  examples = []
  for e in report.examples:  # "path:line: why" -> [line, text] (merged across shards by line)
    line = int(e[len(shard.path) + 1:].split(":", 1)[0])
    examples.append([line, e])
  yield {"files": {shard.file_index: {
      "path": shard.path, "quarantine": q, "loaded": report.loaded, "bad": dict(report.bad),
      "examples": examples}},
         "hygiene": {"kept": hyg.kept, "dropped": dict(hyg.dropped),
                     "turns_dropped": dict(hyg.turns_dropped)}}


# --- keys ---------------------------------------------------------------------------------------
def duplicate_id_error(traj_id: str, entries: Iterable[tuple[tuple[int, int], str]]) -> None:
  """Raises the original builder's error when an id occurs more than once; entries are
  (order, path) of every kept record with that id."""
  entries = sorted(entries)
  if len(entries) > 1:
    raise ValueError(f"{entries[1][1]}: trajectory id '{traj_id}' also appears in {entries[0][1]}")


def resolve_duplicates(key: tuple[str, str],
                       entries: Iterable[tuple[tuple[int, int], str, str]]
                       ) -> tuple[list[tuple[int, int]], dict[str, int]]:
  """(dropped orders, drops by reason) of one (domain, action digest) group of (order, world,
  split) entries, replayed in collection order through `hygiene.DuplicateFilter`."""
  filt = hygiene_lib.DuplicateFilter()
  dropped = [order for order, world, split in sorted(entries)
             if not filt.admit_key(key, world, split)]
  return dropped, dict(filt.report.dropped)


def summary_of(reports: Sequence[LoadReport], hyg: hygiene_lib.HygieneReport) -> dict[str, Any]:
  """The summary of a whole-corpus load (the memory path's reports, one per input in order)."""
  files = {}
  for i, r in enumerate(reports):
    files[i] = {"path": r.path, "quarantine": r.quarantine, "loaded": r.loaded,
                "bad": dict(r.bad), "examples": [[0, e] for e in r.examples]}
  return {"files": files, "hygiene": {"kept": hyg.kept, "dropped": dict(hyg.dropped),
                                      "turns_dropped": dict(hyg.turns_dropped)}}


def load_reports(summary: dict[str, Any]) -> list[LoadReport]:
  out = []
  for fi in sorted(summary["files"], key=int):
    r = summary["files"][fi]
    out.append(LoadReport(path=r["path"], loaded=r["loaded"], bad=collections.Counter(r["bad"]),
                          quarantine=r["quarantine"], examples=[e[1] for e in r["examples"]]))
  return out


def hygiene_report(summary: dict[str, Any]) -> hygiene_lib.HygieneReport:
  h = summary["hygiene"]
  return hygiene_lib.HygieneReport(kept=h["kept"], dropped=collections.Counter(h["dropped"]),
                                   turns_dropped=collections.Counter(h["turns_dropped"]))


def empty_tally() -> dict[str, Any]:
  return {"splits": {s: {"trajectories": 0, "turns": 0, "missing_world": 0} for s in SPLITS},
          "domains": {}}


def tally_add(tally: dict[str, Any], split: str, domain: str, num_turns: int,
              has_world: bool) -> None:
  row = tally["splits"][split]
  row["trajectories"] += 1
  row["turns"] += num_turns
  row["missing_world"] += 0 if has_world else 1
  dom = tally["domains"].setdefault(domain, {s: 0 for s in SPLITS})
  dom[split] += 1


def merge_tallies(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
  out = empty_tally()
  for t in (a, b):
    for s, row in t["splits"].items():
      for k, v in row.items():
        out["splits"][s][k] += v
    for d, row in t["domains"].items():
      dom = out["domains"].setdefault(d, {s: 0 for s in SPLITS})
      for s, v in row.items():
        dom[s] += v
  return out


def manifest(cfg: BuildConfig, summary: dict[str, Any], duplicates: dict[str, int],
             tally: dict[str, Any], worlds: dict[str, int]) -> dict[str, Any]:
  """MANIFEST.json of a build (the same figures whichever path built it)."""
  reports = load_reports(summary)
  bad: collections.Counter = collections.Counter()
  for r in reports:
    bad.update(r.bad)
  h = summary["hygiene"]
  split_rows = {s: {**tally["splits"][s], "worlds": int(worlds.get(s, 0))} for s in SPLITS}
  return {
      "config": cfg.as_dict(),
      "inputs": [{"path": r.path, "loaded": r.loaded, "bad": dict(sorted(r.bad.items()))}
                 for r in reports],
      "loaded": sum(r.loaded for r in reports),
      "bad": dict(sorted(bad.items())),
      "hygiene": {"kept": h["kept"], "dropped": dict(sorted(h["dropped"].items())),
                  "turns_dropped": dict(sorted(h["turns_dropped"].items()))},
      "duplicates": dict(sorted((k, v) for k, v in duplicates.items() if v)),
      "kept": sum(r["trajectories"] for r in split_rows.values()),
      "splits": split_rows,
      "domains": {d: tally["domains"][d] for d in sorted(tally["domains"])},
  }


def check_conservation(man: dict[str, Any], written: dict[str, int] | None = None,
                       where: str = "") -> None:
  """Every trajectory that passed hygiene is either dropped as a duplicate or kept in one split,
  and (given `written`, the split sizes the writer reports) the writer wrote each split's kept
  count: otherwise records went missing between reading and writing, and the build fails loudly
  rather than ship a silently smaller dataset."""
  passed = man["hygiene"]["kept"]
  dups = sum(man["duplicates"].values())
  per_split = {s: man["splits"][s]["trajectories"] for s in SPLITS}
  problems = []
  if passed != dups + man["kept"] or man["kept"] != sum(per_split.values()):
    problems.append(f"{passed} trajectories passed hygiene, {dups} were dropped as duplicates, "
                    f"but {sum(per_split.values())} were kept ({per_split})")
  if written is not None:
    got = {s: int(written.get(s, 0)) for s in SPLITS}
    if got != per_split:
      problems.append(f"the counts say {per_split} but the writer wrote {got}")
  if problems:
    raise RuntimeError(
        f"the dataset build{' (' + where + ')' if where else ''} lost records: "
        + "; ".join(problems) + ". Nothing was kept silently smaller: rebuild into a fresh "
        "folder; on Beam's DirectRunner use --direct_running_mode=multi_processing.")


def nothing_to_build(paths: Sequence[str], summary: dict[str, Any]) -> ValueError:
  reports = load_reports(summary)
  return ValueError(
      f"nothing to build from {', '.join(paths)}: {sum(r.loaded for r in reports)} records "
      f"loaded, {sum(r.num_bad for r in reports)} bad, hygiene: "
      f"{hygiene_report(summary).summary()}")


# --- the streaming local build ------------------------------------------------------------------
def partitions_for(paths: Sequence[str]) -> int:
  """Hash partitions of the key spill: about one per 256 MB of (uncompressed) input, 4..256."""
  est = sum(os.path.getsize(p) * (8 if os.fspath(p).endswith(".gz") else 1) for p in paths
            if "://" not in os.fspath(p))
  return int(min(256, max(4, -(-est // (256 << 20)))))


def _part(key: str, n: int) -> int:
  return zlib.crc32(key.encode("utf-8", "surrogatepass")) % n


def _pack(order: tuple[int, int]) -> int:
  return (order[0] << _ORDER_SHIFT) | order[1]


class _Partitions:
  """P append-only text files of one kind of key line."""

  def __init__(self, folder: str, prefix: str, n: int):
    self.paths = [os.path.join(folder, f"{prefix}{i:04d}.txt") for i in range(n)]
    self._files = [open(p, "w", encoding="utf-8", buffering=1 << 16) for p in self.paths]

  def write(self, key: str, line: str) -> None:
    self._files[_part(key, len(self._files))].write(line)

  def close(self) -> None:
    for f in self._files:
      f.close()


class StreamingBuild:
  """Pass 1 and the resolve step of the streaming build, then the split generators of pass 2.

      sb = StreamingBuild(paths, cfg)
      sb.prepare()                       # pass 1 + resolve: counts known, records spilled
      for key, example in sb.examples("train"): ...      # pass 2, one split at a time
      sb.manifest()                      # after every split was generated
      sb.close()                         # removes the spill folder
  """

  def __init__(self, paths: Sequence[str], cfg: BuildConfig, work_dir: str | None = None,
               shard_bytes: int = DEFAULT_SHARD_BYTES, partitions: int | None = None):
    self.paths = [os.fspath(p) for p in paths]
    self.cfg = cfg
    self.shard_bytes = shard_bytes
    self.num_parts = partitions or partitions_for(self.paths)
    self.dir = tempfile.mkdtemp(prefix="lwm_build_", dir=work_dir)
    self.summary = empty_summary()
    self.duplicates: dict[str, int] = {}
    self.split_sizes: dict[str, int] = {}
    self._dropped = np.zeros(0, np.int64)
    self._tally = empty_tally()
    self._worlds: _Partitions | None = None

  def _split_file(self, split: str) -> str:
    return os.path.join(self.dir, f"records_{split}.txt")

  def prepare(self) -> None:
    if not self.paths:
      raise ValueError("LwmTrajectories needs jsonl_paths to build")
    shards = plan_shards(self.paths, self.cfg.fmt, self.shard_bytes)
    keys = _Partitions(self.dir, "keys", self.num_parts)
    outs = {s: open(self._split_file(s), "w", encoding="utf-8", buffering=1 << 20)
            for s in SPLITS}
    per_split = collections.Counter()
    try:
      for shard in shards:
        for item in read_shard(shard, self.cfg):
          if isinstance(item, dict):
            self.summary = merge_summaries(self.summary, item)
            continue
          r = item
          fi, pos = r.order
          per_split[r.split] += 1
          jid = json.dumps(r.id)
          keys.write("i" + r.id, f"i\t{fi}\t{pos}\t{jid}\n")
          if self.cfg.dedup:
            keys.write(f"d{r.domain}\x1f{r.digest}", f"d\t{fi}\t{pos}\t{r.split}\t{r.domain}\t"
                       f"{r.digest}\t{json.dumps(r.dedup_world)}\n")
          outs[r.split].write(f"{fi}\t{pos}\t{jid}\t{r.domain}\t{r.num_turns}\t"
                              f"{json.dumps(r.world)}\t{r.json}\n")
    finally:
      keys.close()
      for f in outs.values():
        f.close()
    if not per_split:
      raise nothing_to_build(self.paths, self.summary)
    self._resolve(keys.paths, per_split)

  def _resolve(self, part_paths: list[str], per_split: collections.Counter) -> None:
    """One partition at a time: repeated ids (error), duplicate groups (dropped orders)."""
    dropped = array.array("q")
    dups: collections.Counter = collections.Counter()
    dropped_per_split: collections.Counter = collections.Counter()
    for p in part_paths:
      ids: dict[str, list] = collections.defaultdict(list)
      groups: dict[tuple[str, str], list] = collections.defaultdict(list)
      with open(p, encoding="utf-8") as f:
        for line in f:
          parts = line.rstrip("\n").split("\t")
          order = (int(parts[1]), int(parts[2]))
          if parts[0] == "i":
            ids[json.loads(parts[3])].append(order)
          else:
            groups[(parts[4], parts[5])].append((order, json.loads(parts[6]), parts[3]))
      for traj_id, orders in ids.items():
        if len(orders) > 1:
          duplicate_id_error(traj_id, [(o, self.paths[o[0]]) for o in orders])
      for key, entries in groups.items():
        split_of = {e[0]: e[2] for e in entries}
        drop, reasons = resolve_duplicates(key, entries)
        dups.update(reasons)
        for o in drop:
          dropped.append(_pack(o))
          dropped_per_split[split_of[o]] += 1
      os.remove(p)
    self.duplicates = dict(dups)
    self._dropped = np.sort(np.frombuffer(dropped.tobytes(), np.int64)) if dropped else \
        np.zeros(0, np.int64)
    self.split_sizes = {s: per_split[s] - dropped_per_split[s] for s in SPLITS}

  def examples(self, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Pass 2 for one split: (key, example) in collection order, duplicates left out."""
    if self._worlds is None:
      self._worlds = _Partitions(self.dir, "worlds", self.num_parts)
    drops, k = self._dropped, 0
    with open(self._split_file(split), encoding="utf-8") as f:
      for line in f:
        fi, pos, jid, domain, nt, jworld, text = line.rstrip("\n").split("\t", 6)
        packed = (int(fi) << _ORDER_SHIFT) | int(pos)
        while k < len(drops) and drops[k] < packed:
          k += 1
        if k < len(drops) and drops[k] == packed:
          continue
        traj_id, world = json.loads(jid), json.loads(jworld)
        tally_add(self._tally, split, domain, int(nt), world is not None)
        if world is not None:
          self._worlds.write(world, f"{split}\t{jworld}\n")
        yield traj_id, {"id": traj_id, "domain": domain, "num_turns": int(nt), "json": text}
    os.remove(self._split_file(split))

  def manifest(self) -> dict[str, Any]:
    worlds: collections.Counter = collections.Counter()
    if self._worlds is not None:
      self._worlds.close()
      for p in self._worlds.paths:
        with open(p, encoding="utf-8") as f:
          for pair in {line for line in f}:
            worlds[pair.split("\t", 1)[0]] += 1
        os.remove(p)
      self._worlds = None
    return manifest(self.cfg, self.summary, self.duplicates, self._tally, worlds)

  def close(self) -> None:
    if self._worlds is not None:
      self._worlds.close()
      self._worlds = None
    shutil.rmtree(self.dir, ignore_errors=True)
