"""Regenerates the bundled corpus (data/corpus) and the mini benchmark (evals/mini_bench).

For each of the seven domains: collect episodes with the scripted agents until `--per_domain`
trajectories pass hygiene, split them by a hash of the trajectory id (80% train, 10% validation,
10% test), and write `data/corpus/{domain}_{split}.jsonl.gz` (gzip with a zero timestamp, so a
re-run gives the same bytes). The test split is also written in AgentWorldBench format (first, last
and three evenly spaced middle turns of each trajectory, system prompt variant 0) to
`evals/mini_bench/{domain}_test.jsonl`, in the published layout (whole trajectory in `prompt` and
`response`, `turn_idx` marking the turn). `--bench_only` rewrites only the mini benchmark from the
corpus's existing test split, without collecting anything.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lwm_jax.data import bench_records, prompts, schema  # noqa: E402
from lwm_jax.envs import base, collect, sandbox  # noqa: E402

SPLITS = ("train", "validation", "test")


def split_of(traj_id: str) -> str:
  h = int(hashlib.sha256(traj_id.encode()).hexdigest()[:8], 16) % 10
  return "test" if h == 0 else "validation" if h == 1 else "train"


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
    records += bench_records.trajectory_to_records(t, prompts.system_prompt(t, 0),
                                                   bench_turns(len(t.turns)))
  return bench_records.write_awb_jsonl(path, records)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--per_domain", type=int, default=300)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--workers", type=int, default=2)
  ap.add_argument("--domains", default=",".join(base.ENV_NAMES))
  ap.add_argument("--corpus_dir", default="data/corpus")
  ap.add_argument("--bench_dir", default="evals/mini_bench")
  ap.add_argument("--bench_only", action="store_true",
                  help="rewrite the mini benchmark from the corpus test split; collect nothing")
  ap.add_argument("--unsafe_no_sandbox", action="store_true",
                  help="run the terminal and swe commands WITHOUT isolation where bubblewrap is "
                       "unavailable (they can then read and change this machine's files)")
  args = ap.parse_args()
  if args.bench_only:
    for name in args.domains.split(","):
      test = list(schema.read_jsonl(os.path.join(args.corpus_dir, f"{name}_test.jsonl.gz")))
      n = write_bench(os.path.join(args.bench_dir, f"{name}_test.jsonl"), test)
      print(json.dumps({name: {"test": len(test), "bench_records": n}}), flush=True)
    return
  if args.unsafe_no_sandbox:
    os.environ[sandbox.UNSAFE_ENV] = "1"
  os.makedirs(args.corpus_dir, exist_ok=True)
  os.makedirs(args.bench_dir, exist_ok=True)
  report = {}
  for name in args.domains.split(","):
    t0 = time.time()
    kept: list[schema.Trajectory] = []
    dropped: dict[str, str] = {}
    start = 0
    while len(kept) < args.per_domain:
      need = args.per_domain - len(kept)
      batch, stats = collect.collect(name, need + max(4, need // 20), args.seed, args.workers, start=start)
      start += stats["episodes"]
      kept += batch
      dropped.update(stats["dropped"])
    kept = kept[:args.per_domain]
    by_split = {s: [t for t in kept if split_of(t.id) == s] for s in SPLITS}
    for s, trajs in by_split.items():
      write_gz(os.path.join(args.corpus_dir, f"{name}_{s}.jsonl.gz"), trajs)
    n_bench = write_bench(os.path.join(args.bench_dir, f"{name}_test.jsonl"), by_split["test"])
    turns = [len(t.turns) for t in kept]
    report[name] = {"trajectories": len(kept), **{s: len(v) for s, v in by_split.items()},
                    "bench_records": n_bench, "dropped": len(dropped),
                    "turns_min": min(turns), "turns_max": max(turns),
                    "turns_mean": round(sum(turns) / len(turns), 2), "seconds": round(time.time() - t0, 1)}
    print(json.dumps({name: report[name]}), flush=True)
  manifest_path = os.path.join(args.corpus_dir, "MANIFEST.json")
  domains = {}
  if os.path.exists(manifest_path):  # a run over some domains keeps the others' entries
    with open(manifest_path) as f:
      domains = json.load(f).get("domains", {})
  domains.update({k: {x: v[x] for x in v if x != "seconds"} for k, v in report.items()})
  with open(manifest_path, "w") as f:
    json.dump({"seed": args.seed, "per_domain": args.per_domain, "python": sys.version.split()[0],
               "domains": domains}, f, indent=1, sort_keys=True)
    f.write("\n")


if __name__ == "__main__":
  main()
