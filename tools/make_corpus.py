"""Regenerates the bundled corpus (data/corpus) and the mini benchmark (evals/mini_bench).

For each of the seven domains: collect episodes with the scripted agents until `--per_domain`
trajectories pass hygiene, split them by a hash of their WORLD id (`meta["world"]`, 80% train,
10% validation, 10% test; every episode of one world stays in one split), drop duplicated action
sequences (`hygiene.DuplicateFilter`: same world, or across splits; counted), and write
`data/corpus/{domain}_{split}.jsonl.gz` (gzip with a zero timestamp, so a re-run gives the same
bytes). The test split is also written in AgentWorldBench format (first, last
and three evenly spaced middle turns of each trajectory, system prompt variant 0) to
`evals/mini_bench/{domain}_test.jsonl`, in the published layout (whole trajectory in `prompt` and
`response`, `turn_idx` marking the turn; each record's `world` names its world). `--bench_only`
rewrites only the mini benchmark from the corpus's existing test split, without collecting
anything. A trajectory without a world id stops
the run with an error that counts them (no fallback to the trajectory id). MANIFEST.json records,
per domain, trajectories and distinct worlds per split, test worlds seen in train (0 by
construction, measured on the split trajectories) and the duplicates dropped.

`--perturb_share=F` (default 0: the corpus as it is) makes about that share of the episodes of
each domain with real perturbations (mcp, search, web) follow one from the domain's fixed menu
(`lwm_jax.envs.perturb.corpus_menu()`), chosen from the episode index and the seed, so a re-run
still writes the same bytes; those trajectories carry the instruction in their system prompt's
simulation-instruction section, and MANIFEST.json counts them per spec. See
docs/perturbations.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lwm_jax.data import schema, splits
from lwm_jax.envs import base, corpus, perturb, sandbox

SPLITS = splits.SPLITS
bench_turns, write_gz, write_bench = corpus.bench_turns, corpus.write_gz, corpus.write_bench
collect_split = corpus.collect_split


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--per_domain", type=int, default=300)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--workers", type=int, default=2)
  ap.add_argument("--domains", default=",".join(base.env_names()))
  ap.add_argument("--corpus_dir", default="data/corpus")
  ap.add_argument("--bench_dir", default="evals/mini_bench")
  ap.add_argument("--perturb_share", type=float, default=0.0,
                  help="share of the episodes of mcp, search and web that follow a perturbation "
                       "from the domain's fixed menu (0: none)")
  ap.add_argument("--menu", default="",
                  help="the perturbations drawn instead of each domain's fixed menu: "
                       "DOMAIN=SPEC|SPEC entries separated by && (a domain left out gets none)")
  ap.add_argument("--bench_only", action="store_true",
                  help="rewrite the mini benchmark from the corpus test split; collect nothing")
  ap.add_argument("--unsafe_no_sandbox", action="store_true",
                  help="run the terminal and swe commands WITHOUT isolation where bubblewrap is "
                       "unavailable (they can then read and change this machine's files)")
  args = ap.parse_args()
  if args.per_domain < 1:
    ap.error(f"--per_domain must be at least 1, got {args.per_domain}")
  if args.workers < 1:
    ap.error(f"--workers must be at least 1, got {args.workers}")
  unknown = [d for d in args.domains.split(",") if d not in base.env_names()]
  if unknown:
    ap.error(f"--domains: unknown domain '{unknown[0]}' (expected some of "
             f"{', '.join(base.env_names())})")
  if not 0.0 <= args.perturb_share <= 1.0:
    ap.error(f"--perturb_share must be in [0, 1], got {args.perturb_share}")
  menus = None
  if args.menu:
    try:
      menus = perturb.parse_menu(args.menu, [d for d in args.domains.split(",")
                                             if d in perturb.corpus_menu()], "--menu")
    except (ValueError, NotImplementedError) as e:
      ap.error(str(e))
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
    try:
      kept, dropped, dups = collect_split(name, args.per_domain, args.seed, args.workers,
                                          args.perturb_share,
                                          None if menus is None else menus.get(name, []))
    except splits.MissingWorldError as e:  # one clear line; nothing of this domain is written
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    by_split = {s: [t for t, sp in kept if sp == s] for s in SPLITS}
    for s, trajs in by_split.items():
      write_gz(os.path.join(args.corpus_dir, f"{name}_{s}.jsonl.gz"), trajs)
    n_bench = write_bench(os.path.join(args.bench_dir, f"{name}_test.jsonl"), by_split["test"])
    turns = [len(t.turns) for t, _ in kept]
    row = splits.split_table(kept)[name]
    report[name] = {"trajectories": len(kept), **{s: len(v) for s, v in by_split.items()},
                    "worlds": row["worlds"], "test_worlds_in_train": row["test_worlds_in_train"],
                    "test_actions_in_train": row["test_actions_in_train"],
                    "duplicates_dropped": dict(sorted(dups.items())),
                    "bench_records": n_bench, "dropped": len(dropped),
                    "turns_min": min(turns), "turns_max": max(turns),
                    "turns_mean": round(sum(turns) / len(turns), 2), "seconds": round(time.time() - t0, 1)}
    perturbed: dict[str, int] = {}
    for t, _ in kept:
      if t.meta.get("perturb"):
        perturbed[t.meta["perturb"]] = perturbed.get(t.meta["perturb"], 0) + 1
    if perturbed:  # only then: a corpus without perturbations keeps its manifest's bytes
      report[name]["perturbed"] = dict(sorted(perturbed.items()))
    print(json.dumps({name: report[name]}), flush=True)
  manifest_path = os.path.join(args.corpus_dir, "MANIFEST.json")
  domains = {}
  if os.path.exists(manifest_path):  # a run over some domains keeps the others' entries
    with open(manifest_path) as f:
      domains = json.load(f).get("domains", {})
  domains.update({k: {x: v[x] for x in v if x != "seconds"} for k, v in report.items()})
  with open(manifest_path, "w") as f:
    head = {"split_by": "world", "seed": args.seed, "per_domain": args.per_domain,
            "python": sys.version.split()[0]}
    if args.perturb_share:
      head["perturb_share"] = args.perturb_share
    if menus is not None:
      head["perturb_menu"] = menus
    json.dump({**head, "domains": domains}, f, indent=1, sort_keys=True)
    f.write("\n")


if __name__ == "__main__":
  main()
