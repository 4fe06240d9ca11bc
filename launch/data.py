"""Trajectory data tools.

  python launch/data.py build   --inputs=a.jsonl,b.jsonl.gz --out=/tmp/lwm_tfds [--mode=skip]
                                [--build_path=memory|stream|beam] [--split_by=id|world] [--dedup]
                                [--beam_pipeline_options=--runner=DataflowRunner,--project=...]
  python launch/data.py stats   --inputs=data/corpus [--tokenizer=path] [--png=stats.png]
  python launch/data.py inspect --inputs=a.jsonl --stage=cpt --index=0 [--tokenizer=path]
  python launch/data.py agent-targets --inputs=data/corpus [--agent_layout=turns] [--tokenizer=path]
  python launch/data.py pools   --inputs=data/corpus --pool_fractions=cpt=0.6,sft=0.3,rl=0.1
  python launch/data.py worlds  --seeds=0:10000 [--domains=mcp,search]
  python launch/data.py goal-cut --inputs=data/corpus/search_train.jsonl.gz --out=cut.jsonl.gz

`worlds` generates each domain's world for every seed of the range and prints how many distinct
worlds they are and how many values each part of a world takes (`lwm_jax.envs.worlds`); no
inputs needed.

`build` writes the dataset and its MANIFEST.json (kept, dropped by reason, duplicates, trajectories,
turns and worlds per split). `--build_path=stream` streams the inputs in bounded memory;
`--build_path=beam` runs the build as an Apache Beam pipeline (the `.[beam]` extra) on the runner
`--beam_pipeline_options` names (default: the DirectRunner); all paths give the same dataset
(docs/data_at_scale.md).

`goal-cut` writes the inputs' trajectories to `--out`, each cut after the first turn at which
it meets its task (the real environments' transcript rules,
`lwm_jax.envs.verify_transcript.cut_at_goal`; a trajectory that never meets it is kept whole),
and prints how many were cut: the data of agent behaviour cloning that stops at the goal
(docs/agents.md).

`agent-targets` counts the behaviour-cloning samples of an agent policy that the inputs give
(`lwm_jax.data.agent_targets`): per domain and split, samples, over-long ones dropped, tokens and
action (loss) tokens.

`--inputs` takes files or folders (every *.jsonl / *.jsonl.gz inside), or a built TFDS dir with
`--tfds_dir`. Without `--tokenizer`, a small SentencePiece model is trained on the inputs.

`stats` also prints the split table: per domain, trajectories and distinct worlds (`meta["world"]`)
per split, test worlds also in train, and test trajectories whose action sequence equals a train
one. A file's split is the last `_` part of its name (`terminal_test.jsonl.gz`: test). Trajectories
without a world id are counted and keyed by their initial-state text instead, labelled so.
"""
from __future__ import annotations

import collections
import glob
import os
import sys
import tempfile


from absl import app, flags
import numpy as np

from lwm_jax.data import hygiene, importers, masking, pipeline, prompts, splits
from lwm_jax.data import tokenizer as tk

FLAGS = flags.FLAGS
flags.DEFINE_list("inputs", [], "JSONL files or folders of them.")
flags.DEFINE_string("tfds_dir", "", "A built TFDS dir (instead of --inputs).")
flags.DEFINE_string("split", "train", "TFDS split for stats/inspect.")
flags.DEFINE_string("out", "", "build: output data dir.")
flags.DEFINE_enum("mode", "strict", ["strict", "skip"], "Validation mode.")
flags.DEFINE_string("quarantine_dir", "", "skip mode: where bad records go.")
flags.DEFINE_string("fmt", "auto", "Input format: auto, trajectory, awb, chat.")
flags.DEFINE_list("fractions", ["0.9", "0.05", "0.05"], "train,validation,test fractions.")
flags.DEFINE_enum("build_path", "memory", ["memory", "stream", "beam"],
                  "build: hold the corpus in memory, stream it in bounded memory, or run on Beam.")
flags.DEFINE_enum("split_by", "id", ["id", "world"],
                  "build: split by a hash of the trajectory id (--fractions) or of meta['world'] "
                  "(80/10/10, as the bundled corpus).")
flags.DEFINE_bool("dedup", False, "build: drop repeated action sequences (same world, or across "
                  "splits; hygiene.DuplicateFilter).")
flags.DEFINE_string("beam_pipeline_options", "", "build --build_path=beam: Beam pipeline flags, "
                    "comma separated (e.g. --runner=DataflowRunner,--project=P,--region=R).")
flags.DEFINE_string("work_dir", "", "build: where the stream path spills (default: a temp folder) "
                    "and the Beam path writes its counts (default: beside --out).")
flags.DEFINE_integer("shard_mb", 64, "build: plain input files larger than this are read in line "
                     "ranges of about this size (stream and beam paths).")
flags.DEFINE_string("tokenizer", "", "SentencePiece .model or tokenizer.json (or its folder).")
flags.DEFINE_integer("sp_vocab", 2000, "Vocab of the SentencePiece model trained on the fly.")
flags.DEFINE_string("png", "", "stats: where to write the length histogram PNG.")
flags.DEFINE_enum("stage", "cpt", ["cpt", "sft", "rl-prompts"], "inspect: which sample.")
flags.DEFINE_integer("index", 0, "inspect: trajectory index.")
flags.DEFINE_integer("seq_len", 4096, "inspect/stats: token budget.", lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed for target turns, variants and masking.")
flags.DEFINE_bool("color", True, "inspect: ANSI colours (masked tokens dimmed).")
flags.DEFINE_enum("agent_layout", "turns", ["turns", "trajectory"],
                  "agent-targets: one sample per action, or one per trajectory.")
flags.DEFINE_string("pool_fractions", "cpt=0.6,sft=0.3,rl=0.1",
                    "pools: the CPT/SFT/RL split by trajectory id (as config.rl.pool_fractions).")
flags.DEFINE_string("seeds", "0:1000", "worlds: the seed range START:STOP (STOP exclusive).")
flags.DEFINE_list("domains", [], "worlds: the domains (default: all seven).")
flags.DEFINE_integer("rl_max_prompt_tokens", 0, "pools: RL prompts longer than this are dropped "
                     "(default --seq_len; a run uses train.seq_len - rl.max_new_tokens).")


def input_files() -> list[str]:
  files = []
  for p in FLAGS.inputs:
    if "://" in p:  # an object store (gs://...): a folder's *.jsonl[.gz], or one file
      from etils import epath
      path = epath.Path(p)
      if path.is_dir():
        files += sorted(os.fspath(x) for x in path.rglob("*.jsonl"))
        files += sorted(os.fspath(x) for x in path.rglob("*.jsonl.gz"))
      else:
        files.append(p)
    elif os.path.isdir(p):
      files += sorted(glob.glob(os.path.join(p, "**", "*.jsonl"), recursive=True))
      files += sorted(glob.glob(os.path.join(p, "**", "*.jsonl.gz"), recursive=True))
    else:
      files.append(p)
  if not files and not FLAGS.tfds_dir:
    raise app.UsageError("give --inputs (files or folders) or --tfds_dir")
  return files


def split_of_file(path: str) -> str | None:
  """`train`, `validation` or `test` when the file name ends in `_{split}.jsonl[.gz]`."""
  name = os.path.basename(path).split(".", 1)[0]
  last = name.rsplit("_", 1)[-1]
  return last if last in splits.SPLITS else None


def load_trajectories(with_splits: bool = False):
  """(trajectories, load reports), plus each trajectory's split (or None) with `with_splits`."""
  if FLAGS.tfds_dir:
    from lwm_jax.data import tfds_trajectories
    src = tfds_trajectories.load_split(FLAGS.tfds_dir, FLAGS.split)
    trajs = [src[i] for i in range(len(src))]
    split = FLAGS.split if FLAGS.split in splits.SPLITS else None
    return (trajs, [], [split] * len(trajs)) if with_splits else (trajs, [])
  trajs, reports, names = [], [], []
  for f in input_files():
    t, rep = importers.load_any(f, FLAGS.fmt, FLAGS.mode)
    trajs += t
    reports.append(rep)
    names += [split_of_file(f)] * len(t)
  return (trajs, reports, names) if with_splits else (trajs, reports)


def print_split_table(trajs, names) -> None:
  """The split table (see the module docstring) of the loaded files, before hygiene."""
  print("\nsplits by world (files as loaded, before the hygiene filters):")
  unnamed = sum(n is None for n in names)
  if unnamed:
    print(f"  {unnamed} trajectories come from files whose name gives no split "
          f"(*_train/_validation/_test): left out of this table")
  pairs = [(t, n) for t, n in zip(trajs, names) if n is not None]
  if not pairs:
    return
  missing = sum(splits.world_of(t) is None for t, _ in pairs)
  if missing:
    print(f"  world ids: {missing} of {len(pairs)} trajectories have no meta['world']; their world "
          f"key below is the {splits.STAND_IN_LABEL}")
  else:
    print(f"  world ids: all {len(pairs)} trajectories carry meta['world']")
  table = splits.split_table(pairs, stand_in=True)
  label = "worlds (initial-state stand-in)" if missing else "worlds"
  print("  " + splits.format_table(table, label).replace("\n", "\n  "))
  if missing:
    print("  missing world ids per domain: " + ", ".join(
        f"{d} {r['missing_world']}" for d, r in table.items() if r["missing_world"]))


def get_tokenizer(trajs) -> tk.Tokenizer:
  if not trajs:
    raise ValueError("no trajectories left to work on (see the load and hygiene counts above)")
  if FLAGS.tokenizer:
    return tk.load_tokenizer(FLAGS.tokenizer)
  texts = []
  for t in trajs:
    texts.append(prompts.system_prompt(t, 1))
    for x in t.turns:
      texts += [x.action, x.observation]
  prefix = os.path.join(tempfile.mkdtemp(prefix="lwm_sp_"), "sp")
  print(f"(no --tokenizer: training a {FLAGS.sp_vocab}-piece SentencePiece model on the inputs)")
  return tk.load_tokenizer(tk.train_sentencepiece(texts, FLAGS.sp_vocab, prefix))


def cmd_build() -> None:
  from lwm_jax.data import tfds_trajectories
  if not FLAGS.out:
    raise app.UsageError("build needs --out")
  extra = {}
  if FLAGS.build_path == "beam":
    extra["beam_options"] = FLAGS.beam_pipeline_options
  res = tfds_trajectories.build(
      input_files(), FLAGS.out, build_path=FLAGS.build_path, fmt=FLAGS.fmt, mode=FLAGS.mode,
      quarantine_dir=FLAGS.quarantine_dir or None,
      split_fractions=[float(x) for x in FLAGS.fractions], split_seed=FLAGS.seed,
      split_by=FLAGS.split_by, dedup=FLAGS.dedup, work_dir=FLAGS.work_dir or None,
      shard_bytes=FLAGS.shard_mb << 20, **extra)
  for r in res.load_reports:
    print(r.summary())
  print("hygiene:", res.hygiene.summary())
  if res.manifest:
    m = res.manifest
    print("duplicates dropped:", ", ".join(f"{k}={v}" for k, v in m["duplicates"].items())
          or "none")
    print("splits: " + "; ".join(f"{s} {r['trajectories']} trajectories, {r['worlds']} worlds"
                                 for s, r in m["splits"].items()))
  print(f"built {res.data_dir}: " + ", ".join(f"{k}={v}" for k, v in res.split_sizes.items()))


def load_clean(with_splits: bool = False):
  """`load_trajectories`, with its load reports and the hygiene summary printed, and the
  trajectories that pass hygiene: (loaded, kept[, split names of `loaded`])."""
  out = load_trajectories(with_splits=with_splits)
  for r in out[1]:
    print(r.summary())
  hrep = hygiene.HygieneReport()
  kept = hygiene.filter_trajectories(out[0], hrep)
  print("hygiene:", hrep.summary())
  return (out[0], kept, out[2]) if with_splits else (out[0], kept)


def _pct(xs, qs=(50, 90, 99, 100)) -> str:
  if not xs:
    return "-"
  return " ".join(f"p{q}={int(np.percentile(xs, q))}" for q in qs)


def cmd_stats() -> None:
  loaded, trajs, names = load_clean(with_splits=True)
  tok = get_tokenizer(trajs)
  cfg = pipeline.default_data_config()
  cfg.update(dict(seq_len=FLAGS.seq_len, seed=FLAGS.seed, mask_seed=FLAGS.seed))
  by_domain = collections.defaultdict(lambda: collections.Counter())
  classes = collections.defaultdict(collections.Counter)
  lengths = collections.defaultdict(list)
  jaccard = collections.defaultdict(list)
  obs_tok = kept_tok = 0
  for t in trajs:
    d = by_domain[t.domain]
    d["trajectories"] += 1
    d["turns"] += len(t.turns)
    for k, x in enumerate(t.turns):
      classes[t.domain][masking.classify_turn(x.action, x.observation).value] += 1
      jaccard[t.domain].append(masking.turn_stats(x.action, x.observation).jac)
    for s in pipeline.cpt_samples(t, tok, cfg):
      n = len(s["tokens"])
      lengths[t.domain].append(n)
      d["tokens"] += n
      kept_tok += int((s["loss_weights"] > 0).sum())
    msgs = prompts.render_messages(t, None, 1)
    obs_tok += sum(len(tok.encode(m["content"])) + 1 for m in msgs if m["role"] == "assistant")
  print(f"\ntokenizer: {type(tok).__name__} vocab {tok.vocab_size}")
  print(f"{'domain':9} {'traj':>6} {'turns':>7} {'tokens':>10}  CPT document length")
  for dom in sorted(by_domain):
    d = by_domain[dom]
    print(f"{dom:9} {d['trajectories']:6d} {d['turns']:7d} {d['tokens']:10d}  {_pct(lengths[dom])}")
  allc = sum(classes.values(), collections.Counter())
  total = sum(allc.values()) or 1
  print("\nturn classes (all domains): " + ", ".join(
      f"{c.value} {100 * allc[c.value] / total:.1f}%" for c in masking.TurnClass))
  for dom in sorted(classes):
    n = sum(classes[dom].values())
    print(f"  {dom:9} " + " ".join(f"{c.value[:5]}={100 * classes[dom][c.value] / n:.0f}%"
                                   for c in masking.TurnClass))
  all_jac = [j for v in jaccard.values() for j in v]
  print(f"\nJaccard of action and observation word sets (logged only, no rule uses it): "
        f"mean {np.mean(all_jac):.3f} over {len(all_jac)} turns; " + ", ".join(
            f"{dom} {np.mean(jaccard[dom]):.3f}" for dom in sorted(jaccard)))
  all_tok = sum(d["tokens"] for d in by_domain.values()) or 1
  print(f"\nCPT loss tokens: {kept_tok} = {100 * kept_tok / all_tok:.1f}% of all tokens, "
        f"{100 * kept_tok / max(obs_tok, 1):.1f}% of observation tokens")
  all_len = [n for v in lengths.values() for n in v]
  print(f"CPT document lengths: {_pct(all_len)} (seq_len {FLAGS.seq_len})")
  print_split_table(loaded, names)
  if FLAGS.png:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bins = np.logspace(np.log10(max(1, min(all_len))), np.log10(max(all_len) + 1), 40)
    ax.hist([lengths[d] for d in sorted(lengths)], bins=bins, stacked=True,
            label=sorted(lengths))
    ax.set_xscale("log")
    ax.set_xlabel("CPT document length (tokens)")
    ax.set_ylabel("documents")
    ax.set_title(f"{len(trajs)} trajectories, {all_tok} tokens, {100 * kept_tok / all_tok:.1f}% "
                 "in the loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(FLAGS.png, dpi=110)
    print(f"wrote {FLAGS.png}")


def cmd_inspect() -> None:
  trajs, _ = load_trajectories()
  if not 0 <= FLAGS.index < len(trajs):
    raise app.UsageError(f"--index must be in [0, {len(trajs)})")
  t = trajs[FLAGS.index]
  tok = get_tokenizer(trajs)
  cfg = pipeline.default_data_config()
  cfg.update(dict(seq_len=FLAGS.seq_len, seed=FLAGS.seed, mask_seed=FLAGS.seed))
  if FLAGS.stage == "cpt":
    samples = pipeline.cpt_samples(t, tok, cfg)
    for k, x in enumerate(t.turns):
      c = masking.classify_turn(x.action, x.observation).value
      keep = masking.keep_turn(t.id, k, x.action, x.observation, FLAGS.seed)
      print(f"turn {k + 1}: class={c} keep={keep}")
  elif FLAGS.stage == "sft":
    samples = [pipeline.sft_sample(t, tok, cfg, pipeline.demo_pool(cfg, trajs))]
  else:
    samples = [pipeline.rl_prompt_sample(t, tok, cfg)]
  if "overlong" in samples[0]:
    raise ValueError(f"trajectory {t.id}: the {FLAGS.stage} sample is longer than --seq_len="
                     f"{FLAGS.seq_len} tokens, so training drops it (raise --seq_len to see it)")
  if FLAGS.stage == "rl-prompts":
    s = samples[0]
    samples = [{"tokens": s["tokens"], "loss_weights": np.zeros(len(s["tokens"]), np.float32)}]
    print(f"ground truth for turn {s['turn'] + 1}:\n{s['ground_truth']}\n")
  dim, bold, reset = ("\033[2m", "\033[1;32m", "\033[0m") if FLAGS.color else ("", "", "")
  for i, s in enumerate(samples):
    print(f"--- {t.id} [{FLAGS.stage}] document {i + 1}/{len(samples)}: {len(s['tokens'])} tokens, "
          f"{int((s['loss_weights'] > 0).sum())} in the loss "
          f"({'bright green' if FLAGS.color else '[[...]]'} = loss, rest dimmed) ---")
    out, cur, run = [], None, []
    for tid, w in zip(s["tokens"], s["loss_weights"]):
      on = w > 0
      if on != cur and run:
        out.append((cur, tok.decode(run)))
        run = []
      cur = on
      run.append(int(tid))
    if run:
      out.append((cur, tok.decode(run)))
    for on, text in out:
      if FLAGS.color:
        print((bold if on else dim) + text + reset, end="")
      else:
        print(f"[[{text}]]" if on else text, end="")
    print()


def cmd_agent_targets() -> None:
  from lwm_jax.data import agent_targets
  loaded, kept, names = load_clean(with_splits=True)
  tok = get_tokenizer(kept)
  cfg = pipeline.default_data_config()
  cfg.update(dict(seq_len=FLAGS.seq_len, seed=FLAGS.seed))
  cfg.agent_layout = FLAGS.agent_layout
  split_of = {id(t): n or "unsplit" for t, n in zip(loaded, names)}
  by_split = collections.defaultdict(list)
  for t in kept:
    by_split[split_of[id(t)]].append(t)
  print(f"\nagent behaviour-cloning samples (layout {FLAGS.agent_layout}, seq_len {FLAGS.seq_len}, "
        f"tokenizer {type(tok).__name__} vocab {tok.vocab_size}):")
  print(f"{'domain':9} {'split':10} {'traj':>6} {'samples':>8} {'overlong':>8} {'tokens':>10} "
        f"{'action tok':>10}")
  total = collections.Counter()
  for split in sorted(by_split):
    for dom, c in sorted(agent_targets.count(by_split[split], tok, cfg).items()):
      total.update(c)
      print(f"{dom:9} {split:10} {c['trajectories']:6d} {c['samples']:8d} {c['overlong_dropped']:8d} "
            f"{c['tokens']:10d} {c['loss_tokens']:10d}")
  print(f"{'all':9} {'':10} {total['trajectories']:6d} {total['samples']:8d} "
        f"{total['overlong_dropped']:8d} {total['tokens']:10d} {total['loss_tokens']:10d}")
  share = 100 * total["loss_tokens"] / max(total["tokens"], 1)
  print(f"action tokens: {share:.1f}% of all tokens; history turns dropped to fit: "
        f"{total['history_turns_dropped']}")


def cmd_pools() -> None:
  """The CPT / SFT / RL pool sizes of the inputs (trajectories per domain), and how many RL
  prompts fit the token limit (the RL stage drops longer ones)."""
  from lwm_jax.rl import pool as pool_lib, stage  # pylint: disable=import-outside-toplevel
  _, trajs = load_clean()
  fractions = stage.parse_fractions(FLAGS.pool_fractions)
  pools = pool_lib.split_pools(trajs, fractions, FLAGS.seed)
  domains = sorted({t.domain for t in trajs})
  print(f"pools of {len(trajs)} trajectories ({FLAGS.pool_fractions}, seed {FLAGS.seed}):")
  print(f"{'pool':>5} | {'total':>6} | " + " | ".join(f"{d:>8}" for d in domains))
  for name, items in pools.items():
    per = collections.Counter(t.domain for t in items)
    print(f"{name:>5} | {len(items):6d} | " + " | ".join(f"{per[d]:8d}" for d in domains))
  if pools["rl"]:
    limit = FLAGS.rl_max_prompt_tokens or FLAGS.seq_len
    rl = pool_lib.build_pool(pools["rl"], get_tokenizer(trajs), limit, seed=FLAGS.seed)
    print(rl.summary())


def cmd_worlds() -> None:
  from lwm_jax.envs import base, worlds  # noqa: PLC0415  (only this command needs the envs)
  seeds = worlds.parse_seed_range(FLAGS.seeds)
  domains = FLAGS.domains or list(base.env_names())
  for d in domains:
    if d not in base.env_names():
      raise ValueError(f"--domains: unknown domain '{d}' (expected one of "
                       f"{', '.join(base.env_names())})")
  for d in domains:
    print(worlds.census(d, seeds).line(), flush=True)


def cmd_goal_cut() -> None:
  from lwm_jax.envs import verify_transcript  # noqa: PLC0415  (only this command runs envs)
  if not FLAGS.out:
    raise app.UsageError("goal-cut: give --out (the JSONL file to write)")
  trajs, _ = load_trajectories()
  stats = verify_transcript.write_cut_at_goal(trajs, FLAGS.out)
  print(f"{stats['trajectories']} trajectories -> {FLAGS.out}: {stats['cut']} cut at their goal "
        f"({stats['turns_dropped']} later turns left out), {stats['never_solved']} never meet it "
        f"(kept whole)")


def main(argv: list[str]) -> None:
  commands = {"build": cmd_build, "stats": cmd_stats, "inspect": cmd_inspect,
              "agent-targets": cmd_agent_targets, "pools": cmd_pools, "worlds": cmd_worlds,
              "goal-cut": cmd_goal_cut}
  if len(argv) != 2 or argv[1] not in commands:
    raise app.UsageError(f"usage: data.py {{{'|'.join(commands)}}} [--flags]")
  try:
    commands[argv[1]]()
  except (ValueError, FileNotFoundError) as e:  # bad input: one clear line, no traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
