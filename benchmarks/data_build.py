"""Dataset build at scale: time and peak RSS of the three build paths, and reading from the result.

  nice -n 10 python benchmarks/data_build.py --sizes=10000,100000 --paths=memory,stream,beam
  nice -n 10 python benchmarks/data_build.py --sizes=1000000 --paths=stream --append

Inputs: the bundled corpus (data/corpus, 2,100 trajectories) replicated with new ids and new worlds
(`<id>~r<k>`, `<world>~r<k>`) up to each size, written as 4 plain JSONL files (so the stream and
Beam paths also read line ranges of them). Every build uses split_by=world with de-duplication,
and runs in its own process; its peak RSS is the largest sum over that process and its children
(Beam workers included), sampled every 0.1 s. Reading: 100 CPT batches (batch 8, seq 1024, a
SentencePiece tokenizer trained on the corpus) from the train split of a built dataset, in a fresh
process: batches/s and peak RSS. Results: benchmarks/results/data_build.json (`--append` adds rows
to the file instead of replacing it).
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parent.parent

import common

BUILD = r"""
import json, logging, sys, time
logging.disable(logging.WARNING)
from lwm_jax.data import tfds_trajectories
files, out, path, workers = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
kw = {}
if path == "beam":
  kw["beam_options"] = [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
t = time.perf_counter()
res = tfds_trajectories.build(files, out, build_path=path, split_by="world", dedup=True, **kw)
print(json.dumps({"seconds": time.perf_counter() - t, "splits": res.split_sizes,
                  "manifest": res.manifest}))
"""

READ = r"""
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
from lwm_jax.data import pipeline, tokenizer as tk
c = pipeline.default_data_config()
c.update(dict(tfds_dir=sys.argv[2], split="train", seq_len=1024, batch_size=8, seed=0))
it = pipeline.make_train_iterator(c, tk.load_tokenizer(sys.argv[3]), "cpt")
next(it)
t = time.perf_counter()
for _ in range(int(sys.argv[4])):
  next(it)
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "batches_per_s": int(sys.argv[4]) / dt,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def tree_rss(proc: psutil.Process) -> int:
  total = 0
  for p in [proc] + proc.children(recursive=True):
    try:
      total += p.memory_info().rss
    except psutil.Error:
      pass
  return total


def run_measured(cmd: list[str]) -> tuple[dict, float, str]:
  """(the JSON the command prints last, peak RSS of its process tree in MB, stderr tail).

  Output goes to temporary files, not pipes: a build's progress bars fill a pipe that nobody reads
  while we poll, and the build then blocks on its next write."""
  import tempfile  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
    proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, cwd=ROOT)
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
      try:
        peak = max(peak, tree_rss(ps))
      except psutil.Error:
        pass
      time.sleep(0.1)
    fo.seek(0)
    fe.seek(0)
    out, err = fo.read(), fe.read()
  if proc.returncode:
    raise RuntimeError(f"{cmd[:3]} failed ({proc.returncode}): {err[-3000:]}")
  return json.loads(out.strip().splitlines()[-1]), peak / 2**20, err[-500:]


def make_inputs(size: int, folder: pathlib.Path, parts: int = 4) -> list[str]:
  """The corpus replicated to `size` trajectories with new ids and worlds, in `parts` files."""
  folder.mkdir(parents=True, exist_ok=True)
  files = [str(folder / f"part{i}.jsonl") for i in range(parts)]
  if all(os.path.exists(f) for f in files):
    return files
  base = []
  for p in sorted(glob.glob(str(ROOT / "data" / "corpus" / "*.jsonl.gz"))):
    with gzip.open(p, "rt", encoding="utf-8") as f:
      base += [json.loads(line) for line in f if line.strip()]
  outs = [open(f, "w", encoding="utf-8") for f in files]
  for n in range(size):
    rec = dict(base[n % len(base)])
    k = n // len(base)
    rec["id"] = f"{rec['id']}~r{k}"
    rec["meta"] = {**rec.get("meta", {}), "world": f"{rec['meta']['world']}~r{k}"}
    outs[n * parts // size].write(json.dumps(rec, ensure_ascii=False) + "\n")
  for f in outs:
    f.close()
  return files


def tokenizer(work: pathlib.Path) -> str:
  model = work / "sp.model"
  if not model.exists():
    from lwm_jax.data import prompts, schema
    from lwm_jax.data import tokenizer as tk
    texts = []
    for p in sorted(glob.glob(str(ROOT / "data" / "corpus" / "*_train.jsonl.gz"))):
      for t in schema.read_jsonl(p):
        texts.append(prompts.system_prompt(t, 1))
        texts += [x for turn in t.turns for x in (turn.action, turn.observation)]
    tk.train_sentencepiece(texts, 2000, str(work / "sp"))
  return str(model)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--sizes", default="10000,100000")
  ap.add_argument("--paths", default="memory,stream,beam")
  ap.add_argument("--beam_workers", default="2", help="comma list: one beam row per count")
  ap.add_argument("--work", default="/tmp/lwm_data_build_bench")
  ap.add_argument("--read_batches", type=int, default=100)
  ap.add_argument("--read", default="stream", help="which path's build to read from ('' none)")
  ap.add_argument("--keep_inputs", action="store_true")
  ap.add_argument("--append", action="store_true")
  ap.add_argument("--note", default="")
  args = ap.parse_args()
  work = pathlib.Path(args.work)
  work.mkdir(parents=True, exist_ok=True)
  result_path = common.RESULTS / "data_build.json"
  old = json.loads(result_path.read_text()) if args.append and result_path.exists() else {}
  builds, reads = old.get("builds", []), old.get("reads", [])
  notes = old.get("notes", [])
  if args.note:
    notes.append(args.note)
  for size in [int(s) for s in args.sizes.split(",")]:
    inputs = make_inputs(size, work / f"in_{size}")
    in_mb = sum(os.path.getsize(f) for f in inputs) / 2**20
    manifests = {}
    for path in args.paths.split(","):
      for workers in ([int(w) for w in args.beam_workers.split(",")] if path == "beam" else [1]):
        out = work / f"out_{size}_{path}_{workers}"
        shutil.rmtree(out, ignore_errors=True)
        load = os.getloadavg()[0]
        name = path + (f" ({workers} workers)" if path == "beam" else "")
        try:
          got, peak, _ = run_measured([sys.executable, "-c", BUILD, str(ROOT),
                                       json.dumps(inputs), str(out), path, str(workers)])
        except RuntimeError as e:  # recorded as measured: a build that fails is a result too
          why = [l for l in str(e).splitlines() if "Error" in l]
          row = {"trajectories": size, "path": name, "failed": (why or [str(e)])[-1][:600],
                 "load_avg_1min_before": round(load, 1)}
          print(json.dumps(row), flush=True)
          builds.append(row)
          shutil.rmtree(out, ignore_errors=True)
          continue
        row = {"trajectories": size, "path": name,
               "seconds": round(got["seconds"], 1), "peak_rss_mb": round(peak),
               "trajectories_per_s": round(size / got["seconds"]),
               "input_mb": round(in_mb), "kept": got["manifest"]["kept"],
               "splits": got["splits"], "load_avg_1min_before": round(load, 1)}
        manifests[row["path"]] = got["manifest"]
        print(json.dumps(row), flush=True)
        builds.append(row)
        if path == args.read and args.read_batches:
          r, _, _ = run_measured([sys.executable, "-c", READ, str(ROOT), str(out),
                                  tokenizer(work), str(args.read_batches)])
          rrow = {"trajectories": size, "built_by": path, "batches": args.read_batches,
                  "batch": 8, "seq_len": 1024, "batches_per_s": round(r["batches_per_s"], 1),
                  "peak_rss_mb": round(r["peak_rss_mb"]),
                  "load_avg_1min_before": round(load, 1)}
          print(json.dumps(rrow), flush=True)
          reads.append(rrow)
        shutil.rmtree(out, ignore_errors=True)
    first = next(iter(manifests.values()), None)
    same = all(m == first for m in manifests.values())
    builds.append({"trajectories": size, "manifests_identical_across_paths": same,
                   "paths_compared": sorted(manifests)})
    if not args.keep_inputs:
      shutil.rmtree(work / f"in_{size}", ignore_errors=True)
  common.write_result("data_build", {"builds": builds, "reads": reads, "notes": notes})
  print(common.table([b for b in builds if "seconds" in b],
                     ["trajectories", "path", "seconds", "peak_rss_mb", "trajectories_per_s"]))


if __name__ == "__main__":
  main()
