"""The dataset build as an Apache Beam pipeline (the `beam` path of `tfds_trajectories.build`).

Needs the optional extra `.[beam]` (apache-beam). The steps are those of `corpus_build`, run where
the data lives and on as many workers as the runner gives:

    shards (planned on the launcher) -> Reshuffle -> read_shard on each worker
      -> records                      -> group by id (a repeated id fails the build)
                                       -> group by (domain, action digest): resolve_duplicates
      -> kept records -> partition by split -> TFDS writes each split (its own Beam steps)
      -> quarantine lines -> group by input file -> written in line order
      -> summaries, duplicate counts, per-split tallies, distinct (split, world) pairs
         -> combined into one JSON file in the work folder; `tfds_trajectories.build` turns it
            into MANIFEST.json after the pipeline has run.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any, Sequence

import apache_beam as beam
from etils import epath

from lwm_jax.data import corpus_build as cb
from lwm_jax.data import schema

SUMMARY_FILE = "beam_summary.json"


def options(args: Sequence[str] | str | None) -> beam.options.pipeline_options.PipelineOptions:
  """PipelineOptions from a list of flags or one comma/space separated string of them."""
  if isinstance(args, str):
    args = [a for a in args.replace(",", " ").split() if a]
  opts = beam.options.pipeline_options.PipelineOptions(list(args or []))
  std = opts.view_as(beam.options.pipeline_options.StandardOptions)
  direct = opts.view_as(beam.options.pipeline_options.DirectOptions)
  if (std.runner in (None, "DirectRunner", "BundleBasedDirectRunner")
      and (direct.direct_num_workers or 1) != 1
      and direct.direct_running_mode == "multi_threading"):
    # Measured with apache-beam 2.78 on the bundled corpus: with two threads the DirectRunner's
    # GroupByKey lost whole keys of large records in 3 runs out of 10 (2077 records in, 2065-2077
    # out), and TFDS's writer after it lost more; one worker, or worker processes, never did.
    raise ValueError(
        "--direct_running_mode=multi_threading with --direct_num_workers="
        f"{direct.direct_num_workers} loses records in Beam's DirectRunner (GroupByKey drops "
        "keys of large elements at random); use --direct_running_mode=multi_processing "
        "for several local workers")
  return opts


class _ReadShard(beam.DoFn):
  """Records (main output), quarantine lines ('bad') and the shard's summary ('summary')."""

  def __init__(self, cfg: cb.BuildConfig):
    self._cfg = cfg

  def process(self, shard: cb.Shard):
    bad: list[tuple[int, str]] = []
    q = self._cfg.quarantine_for(shard.path)
    for item in cb.read_shard(shard, self._cfg, quarantine_sink=lambda line, text: bad.append(
        (line, text))):
      if isinstance(item, dict):
        yield beam.pvalue.TaggedOutput("summary", item)
      else:
        yield item
    for line, text in bad:
      yield beam.pvalue.TaggedOutput("bad", (q, (shard.file_index, line, text)))


def _check_ids(kv: tuple[str, Any], paths: Sequence[str]):
  traj_id, orders = kv
  orders = list(orders)
  if len(orders) > 1:
    cb.duplicate_id_error(traj_id, [(tuple(o), paths[o[0]]) for o in orders])
  return []


def _resolve(kv: tuple[tuple[str, str], Any]):
  key, recs = kv
  recs = list(recs)
  dropped, reasons = cb.resolve_duplicates(key, [(r.order, r.dedup_world, r.split) for r in recs])
  gone = set(dropped)
  for r in recs:
    if r.order not in gone:
      yield r
  for reason, n in reasons.items():
    yield beam.pvalue.TaggedOutput("dups", (reason, n))


def _write_quarantine(kv: tuple[str, Any]) -> None:
  path, entries = kv
  lines = [text for _, _, text in sorted(entries)]
  p = epath.Path(path)
  p.parent.mkdir(parents=True, exist_ok=True)
  if "://" not in path:  # local: append, as the other paths do
    with schema._open_text(path, "a") as f:  # noqa: SLF001
      f.write("".join(t + "\n" for t in lines))
  else:  # object stores cannot append: read what is there and write it back with the new lines
    old = p.read_text() if p.exists() else ""
    p.write_text(old + "".join(t + "\n" for t in lines))


class _Tally(beam.CombineFn):
  def create_accumulator(self):
    return cb.empty_tally()

  def add_input(self, acc, r: cb.Rec):
    cb.tally_add(acc, r.split, r.domain, r.num_turns, r.world is not None)
    return acc

  def merge_accumulators(self, accs):
    return functools.reduce(cb.merge_tallies, accs, cb.empty_tally())

  def extract_output(self, acc):
    return acc


def _write_summary(_, work_dir: str, summary, dups, tally, worlds) -> None:
  out = {"summary": summary, "duplicates": dict(dups), "tally": tally, "worlds": dict(worlds)}
  p = epath.Path(work_dir)
  p.mkdir(parents=True, exist_ok=True)
  (p / SUMMARY_FILE).write_text(json.dumps(out))


def kept_records(pipeline: beam.Pipeline, paths: Sequence[str], cfg: cb.BuildConfig,
                 work_dir: str, shard_bytes: int = cb.DEFAULT_SHARD_BYTES
                 ) -> dict[str, beam.PCollection]:
  """The kept records of each split as PCollections of `Rec`; the counts go to work_dir."""
  paths = [os.fspath(p) for p in paths]
  if not paths:
    raise ValueError("LwmTrajectories needs jsonl_paths to build")
  shards = cb.plan_shards(paths, cfg.fmt, shard_bytes)
  read = (pipeline
          | "Shards" >> beam.Create(shards)
          | "Spread" >> beam.Reshuffle()
          | "Read" >> beam.ParDo(_ReadShard(cfg)).with_outputs("bad", "summary", main="recs"))
  recs = read.recs
  _ = (recs
       | "ById" >> beam.Map(lambda r: (r.id, r.order))
       | "GroupIds" >> beam.GroupByKey()
       | "CheckIds" >> beam.FlatMap(_check_ids, paths))
  if cfg.dedup:
    res = (recs
           | "ByActions" >> beam.Map(lambda r: ((r.domain, r.digest), r))
           | "GroupActions" >> beam.GroupByKey()
           | "Dedup" >> beam.FlatMap(_resolve).with_outputs("dups", main="kept"))
    kept = res.kept
    dups = res.dups | "SumDups" >> beam.CombinePerKey(sum)
  else:
    kept = recs
    dups = pipeline | "NoDups" >> beam.Create([])
  _ = (read.bad
       | "GroupBad" >> beam.GroupByKey()
       | "Quarantine" >> beam.Map(_write_quarantine))
  summary = read.summary | "Summary" >> beam.CombineGlobally(
      lambda xs: functools.reduce(cb.merge_summaries, xs, cb.empty_summary()))
  tally = kept | "Tally" >> beam.CombineGlobally(_Tally())
  worlds = (kept
            | "Worlds" >> beam.FlatMap(lambda r: [(r.split, r.world)] if r.world is not None else [])
            | "DistinctWorlds" >> beam.Distinct()
            | "WorldsPerSplit" >> beam.Map(lambda sw: (sw[0], 1))
            | "CountWorlds" >> beam.CombinePerKey(sum))
  _ = (pipeline
       | "One" >> beam.Create([None])
       | "WriteSummary" >> beam.Map(
           _write_summary, work_dir,
           summary=beam.pvalue.AsSingleton(summary), dups=beam.pvalue.AsList(dups),
           tally=beam.pvalue.AsSingleton(tally), worlds=beam.pvalue.AsList(worlds)))
  parts = kept | "BySplit" >> beam.Partition(lambda r, n: cb.SPLITS.index(r.split), len(cb.SPLITS))
  return dict(zip(cb.SPLITS, parts))


def read_summary(work_dir: str) -> dict[str, Any]:
  return json.loads((epath.Path(work_dir) / SUMMARY_FILE).read_text())
