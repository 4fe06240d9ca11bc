"""Collecting a corpus from the real environments: episodes in order until a domain has enough
that pass collection hygiene and the duplicate filter, each put in its world's split, and the
mini benchmark's records of the test split. `tools/make_corpus.py` is the command line over it.
"""
from __future__ import annotations

import gzip
import os
import tempfile

from lwm_jax.data import bench_records, hygiene, prompts, schema, splits
from lwm_jax.envs import collect, perturb

SPLITS = splits.SPLITS


def bench_turns(n: int) -> list[int]:
  """0-based indices: first, last and three evenly spaced middle turns (unique, sorted)."""
  return sorted({0, n - 1, *(round(k * (n - 1) / 4) for k in (1, 2, 3))})


def write_gz(path: str, trajs: list[schema.Trajectory]) -> None:
  """schema.write_jsonl's bytes, gzip-compressed with mtime 0 and no file name (reproducible)."""
  with tempfile.TemporaryDirectory() as tmp:
    plain = os.path.join(tmp, "part.jsonl")
    schema.write_jsonl(plain, trajs)
    with open(plain, "rb") as src, open(path, "wb") as raw:
      with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        gz.write(src.read())


def write_bench(path: str, test: list[schema.Trajectory]) -> int:
  """The mini benchmark's records of one domain (system prompt variant 0); returns their count."""
  records = []
  for t in test:
    recs = bench_records.trajectory_to_records(t, prompts.system_prompt(t, 0),
                                               bench_turns(len(t.turns)))
    world = splits.world_of(t)
    if world is not None:  # evaluation reports count the worlds a benchmark covers
      for r in recs:
        r.extra[splits.WORLD_KEY] = world
    records += recs
  return bench_records.write_awb_jsonl(path, records)


def collect_split(name: str, per_domain: int, seed: int, workers: int, perturb_share: float = 0.0,
                  menu: list[str] | None = None
                  ) -> tuple[list[tuple[schema.Trajectory, str]], dict[str, str], dict[str, int]]:
  """Collects `name` episodes in order until `per_domain` pass hygiene and the duplicate filter.

  Returns ([(trajectory, split)], {id: why dropped by collection hygiene}, {duplicate reason:
  count}). Raises splits.MissingWorldError when an episode has no world id."""
  kept: list[tuple[schema.Trajectory, str]] = []
  dropped: dict[str, str] = {}
  dups = hygiene.DuplicateFilter()
  start = 0
  while len(kept) < per_domain:
    if start >= 20 * per_domain:
      raise RuntimeError(f"make_corpus {name}: only {len(kept)} of {per_domain} trajectories kept "
                         f"after {start} episodes (hygiene drops {len(dropped)}, duplicates "
                         f"{dict(dups.report.dropped)}); the environment repeats itself")
    need = per_domain - len(kept)
    extra = {}
    if perturb_share > 0:  # without a share, collection runs exactly as before
      extra["perturb"] = lambda i: perturb.corpus_choice(name, i, perturb_share, seed, menu)
    batch, stats = collect.collect(name, need + max(4, need // 20), seed, workers, start=start,
                                   **extra)
    worlds = splits.require_worlds(batch, f"make_corpus {name} (episodes {start}.."
                                          f"{start + stats['episodes'] - 1})")
    start += stats["episodes"]
    dropped.update(stats["dropped"])
    for t, w in zip(batch, worlds):
      split = splits.split_of_world(w)
      if len(kept) < per_domain and dups.admit(t, w, split):
        kept.append((t, split))
  return kept, dropped, dict(dups.report.dropped)
