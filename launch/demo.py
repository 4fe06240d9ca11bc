"""The whole chain on the bundled real trajectories, on one CPU, in minutes (`make demo`).

  1. tokenizer: a SentencePiece model trained on the corpus's training split
  2. CPT of a small MoE world model with information-theoretic loss masking (then exported to HF)
  3. SFT in thinking mode, starting from the CPT model's Hugging Face export
  4. held-out next-observation token accuracy of both models beside a copy-previous baseline
  5. one simulated terminal episode: the SFT model answers a real held-out episode's actions, each
     simulated observation printed beside the real one with its edit similarity (and their mean).
     The episode is the test split's terminal episode whose observations are most knowable from
     what precedes them (`episodes_lib.demo_episode`, chosen from the data, not from any model's score)
  6. the same episode played by the shipped world model (data/world_model/, made by
     `make world-model`), which a few minutes of demo training cannot match, then every held-out
     terminal episode's first three turns played by it in one batch, with their mean and median;
     skipped with a note when the folder is absent

  python launch/demo.py [--workdir=runs/demo] [--cpt_steps=N] [--sft_steps=N]
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time

from absl import app, flags
from absl import logging as absl_logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from lwm_jax.data import corpus as corpus_lib
from lwm_jax.eval import episodes as episodes_lib
from configs import stages
from lwm_jax.eval.teacher_forced import observation_accuracy, world_coverage
from lwm_jax.train import trainer

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", os.path.join(ROOT, "runs", "demo"), "output folder (replaced)")
flags.DEFINE_string("corpus", os.path.join(ROOT, "data", "corpus"), "bundled corpus folder")
flags.DEFINE_string("world_model", os.path.join(ROOT, "data", "world_model"),
                    "the shipped world model for part 6 ('' to skip)")
stages.define_demo_flags()  # vocab, cpt_steps, sft_steps, seq_len, batch, eval_trajectories

_config = stages.demo_config_from_flags


def _banner(text: str) -> None:
  print(f"\n=== {text} ===", flush=True)


def main(_):
  logging.getLogger().setLevel(logging.WARNING)
  absl_logging.set_verbosity(absl_logging.WARNING)
  t0 = time.time()
  wd = FLAGS.workdir
  shutil.rmtree(wd, ignore_errors=True)
  os.makedirs(wd)
  corpus = corpus_lib.load_corpus(FLAGS.corpus)
  train, valid = corpus.train_files, corpus.valid_files
  train_trajs, test_trajs = corpus.train, corpus.test
  print(f"corpus: {len(train_trajs)} training trajectories in {len(train)} domains, "
        f"{len(test_trajs)} held out")

  _banner("1. SentencePiece tokenizer")
  sp, tok, vocab = corpus_lib.train_tokenizer(train_trajs, FLAGS.vocab, os.path.join(wd, "tokenizer"))
  print(f"{sp}: {tok.vocab_size} pieces")

  results = {}
  _banner(f"2. CPT with loss masking ({FLAGS.cpt_steps} steps)")
  cpt = trainer.train(_config("cpt", vocab, FLAGS.cpt_steps, os.path.join(wd, "cpt"), sp,
                              ",".join(train), ",".join(valid)), os.path.join(wd, "cpt"))
  results["cpt"] = cpt
  print(f"loss {cpt['losses'][0]:.3f} -> {cpt['losses'][-1]:.3f}; "
        f"{cpt.get('tokens_per_s', 0):.0f} tokens/s; HF export {cpt['export_hf']}")

  _banner(f"3. SFT in thinking mode ({FLAGS.sft_steps} steps, from the CPT export)")
  sft = trainer.train(_config("sft", vocab, FLAGS.sft_steps, os.path.join(wd, "sft"), sp,
                              ",".join(train), ",".join(valid),
                              init_from_hf=os.path.join(wd, "cpt", "hf")),
                      os.path.join(wd, "sft"))
  results["sft"] = sft
  print(f"loss {sft['losses'][0]:.3f} -> {sft['losses'][-1]:.3f}; "
        f"{sft.get('tokens_per_s', 0):.0f} tokens/s; checkpoint {wd}/sft/checkpoints")

  _banner("4. Held-out next-observation token accuracy (teacher forcing)")
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  held = test_trajs[::max(1, len(test_trajs) // FLAGS.eval_trajectories)]
  coverage = world_coverage(held, train_trajs)
  train_worlds = {t.meta["world"] for t in train_trajs if t.meta.get("world")}
  table = {}
  for stage in ("cpt", "sft"):
    sampler = Sampler.from_checkpoint(os.path.join(wd, stage))
    acc = observation_accuracy(sampler.model, sampler.tokenizer, held, stage=stage,
                               max_len=2 * FLAGS.seq_len, train_worlds=train_worlds)
    table[stage] = acc
  print(f"{'domain':>10} | {'CPT model':>9} | {'SFT model':>9} | {'copy prev':>9} | tokens")
  for d in sorted(table["sft"].per_domain):
    c, s = table["cpt"].per_domain[d], table["sft"].per_domain[d]
    print(f"{d:>10} | {c[0]:9.3f} | {s[0]:9.3f} | {s[1]:9.3f} | {s[2]}")
  a_cpt, a_sft = table["cpt"], table["sft"]
  print(f"{'all':>10} | {a_cpt.model:9.3f} | {a_sft.model:9.3f} | {a_sft.copy_previous:9.3f} | "
        f"{a_sft.tokens} ({a_sft.samples} of {len(held)} held-out trajectories; longer than "
        f"{2 * FLAGS.seq_len} tokens skipped)")
  groups = a_sft.per_group  # separate, labelled rows only when seen worlds or a mix are present
  if len(groups) > 1 or "seen worlds, new episodes" in groups:
    for g, s in groups.items():
      c = a_cpt.per_group.get(g, (float("nan"),) * 3)
      print(f"  [{g}] | {c[0]:9.3f} | {s[0]:9.3f} | {s[1]:9.3f} | {s[2]}")
  print(coverage.describe())
  for stage, acc in (("CPT", a_cpt), ("SFT", a_sft)):
    print(f"{stage} model's reply format (tags, thinking block, end marker; not in the table): "
          f"argmax right on {acc.scaffold:.3f} of {acc.scaffold_tokens} tokens, mean "
          f"probability {acc.scaffold_prob:.3f}")
  beats = a_sft.model > a_sft.copy_previous
  print(f"SFT model {'beats' if beats else 'does NOT beat'} the copy-previous baseline "
        f"({a_sft.model:.3f} vs {a_sft.copy_previous:.3f})")

  _banner("5. A simulated terminal episode (the SFT model answers a real episode's actions; its "
          "own earlier answers are its history)")
  episode = episodes_lib.demo_episode(test_trajs)
  print(f"episode {episode.id}: the held-out terminal episode whose first three observations are "
        f"most knowable from what precedes them ({episodes_lib.knowable_share(episode):.0%} of their "
        "words appear earlier; episodes_lib.knowable_share)")
  sim = episodes_lib.simulated_episode(sampler, episode, turns=3, max_new_tokens=120, variant=2)
  shipped = _shipped_episode(test_trajs, corpus_lib.load_corpus(FLAGS.corpus).digest())
  summary = {"seconds": round(time.time() - t0, 1), "cpt_tokens_per_s": cpt.get("tokens_per_s"),
             "sft_tokens_per_s": sft.get("tokens_per_s"),
             "accuracy": {"cpt": a_cpt.model, "sft": a_sft.model,
                          "copy_previous": a_sft.copy_previous, "tokens": a_sft.tokens,
                          "reply_format": {"cpt": [a_cpt.scaffold, a_cpt.scaffold_prob],
                                           "sft": [a_sft.scaffold, a_sft.scaffold_prob]}},
             "worlds": {"evaluated": coverage.worlds, "seen_in_train": coverage.seen_in_train,
                        "without_world_id": coverage.missing},
             "simulated_episode": {"model": "sft (this demo's SFT run)", **sim},
             "shipped_world_model": shipped}
  with open(os.path.join(wd, "demo_summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(f"\ndone in {summary['seconds']:.0f} s; summary in {wd}/demo_summary.json")
  if not beats:
    sys.exit(1)


def _shipped_episode(test_trajs, corpus_sha: str) -> dict:
  """Part 6: the episode of part 5 played by the shipped world model, with where it came from,
  and every held-out terminal episode played by it in one batch."""
  path = FLAGS.world_model
  if not path or not os.path.isfile(os.path.join(path, "provenance.json")):
    print(f"\n(no shipped world model at {path!r}: `make world-model` makes one)")
    return {"path": path, "present": False}
  with open(os.path.join(path, "provenance.json")) as f:
    prov = json.load(f)
  same = prov.get("corpus", {}).get("sha256") == corpus_sha
  _banner(f"6. The same episode played by the shipped world model ({path})")
  print(f"made by `{prov.get('made_by')}` on corpus sha256 "
        f"{prov.get('corpus', {}).get('sha256', '?')[:16]} "
        f"({'this corpus' if same else 'NOT this corpus'}); model {prov.get('model')}")
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  sampler = Sampler.from_checkpoint(path)
  sim = episodes_lib.simulated_terminal_episodes(sampler, test_trajs, max_new_tokens=320)
  return {"path": path, "present": True, "model": prov.get("model"), "same_corpus": same, **sim}


if __name__ == "__main__":
  app.run(main)
