"""Does SFT on the long prompt forms change held-out accuracy at equal tokens?

The demo's chain at a smaller scale: a SentencePiece tokenizer and one CPT run on the bundled
corpus, then two SFT runs from the same CPT export that differ only in `long_prompts` (the long
forms of v2-v11 with simulation guidance and worked examples from other training trajectories,
where they fit `--seq_len`; otherwise the plain variants). Both SFT runs take the same steps of
the same [batch, seq_len] rows, drop the same over-long samples, and are scored by the demo's
held-out teacher-forced observation accuracy (plain prompts at evaluation).

  python benchmarks/long_prompts.py --seq_len=2048 --cpt_steps=12 --sft_steps=16 --batch=2 \
      --eval_trajectories=42
Writes benchmarks/results/long_prompts.json. Measured (that command, 2 shared CPU cores, 25 min):
held-out accuracy 0.1289 plain vs 0.1270 long on 5,920 target tokens of 45 test trajectories
(copy-previous 0.3461), equal tokens (16 steps x 2 rows x 2,048): no difference beyond noise at
this tiny scale.
"""
from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

from absl import app, flags

from configs import stages
from lwm_jax.data import prompts, schema
from lwm_jax.data import tokenizer as tok_lib
from lwm_jax.eval.teacher_forced import observation_accuracy
from lwm_jax.train import trainer

FLAGS = flags.FLAGS
flags.DEFINE_string("out", str(ROOT / "runs" / "long_prompts"), "work folder (replaced)")
# the demo's data and shapes (launch/demo.py)
flags.DEFINE_string("corpus", str(ROOT / "data" / "corpus"), "bundled corpus folder")
stages.define_demo_flags()  # vocab, cpt_steps, sft_steps, seq_len, batch, eval_trajectories


_config = stages.demo_config_from_flags


def main(_):
  t0 = time.time()
  wd = FLAGS.out
  shutil.rmtree(wd, ignore_errors=True)
  os.makedirs(wd)
  train = sorted(glob.glob(os.path.join(FLAGS.corpus, "*_train.jsonl.gz")))
  valid = sorted(glob.glob(os.path.join(FLAGS.corpus, "*_validation.jsonl.gz")))
  test = sorted(glob.glob(os.path.join(FLAGS.corpus, "*_test.jsonl.gz")))
  train_trajs = [t for p in train for t in schema.read_jsonl(p)]
  test_trajs = [t for p in test for t in schema.read_jsonl(p)]
  texts = []
  for traj in train_trajs:
    texts.append(prompts.system_prompt(traj, 1))
    for turn in traj.turns:
      texts += [turn.action, turn.observation]
  sp = tok_lib.train_sentencepiece(texts, FLAGS.vocab, os.path.join(wd, "tokenizer"))
  vocab = -(-tok_lib.load_tokenizer(sp).vocab_size // 128) * 128
  cpt = trainer.train(_config("cpt", vocab, FLAGS.cpt_steps, os.path.join(wd, "cpt"), sp,
                                   ",".join(train), ",".join(valid)), os.path.join(wd, "cpt"))
  held = test_trajs[::max(1, len(test_trajs) // FLAGS.eval_trajectories)]
  results = {"seq_len": FLAGS.seq_len, "batch": FLAGS.batch, "cpt_steps": FLAGS.cpt_steps,
             "sft_steps": FLAGS.sft_steps, "cpt_final_loss": cpt["losses"][-1], "arms": {}}
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  for arm in ("plain", "long"):
    out = os.path.join(wd, f"sft_{arm}")
    c = _config("sft", vocab, FLAGS.sft_steps, out, sp, ",".join(train), ",".join(valid),
                     init_from_hf=os.path.join(wd, "cpt", "hf"))
    c.data.pipeline.overlong = "drop"  # the same samples drop in both arms (plain length)
    c.data.pipeline.long_prompts = arm == "long"
    res = trainer.train(c, out)
    sampler = Sampler.from_checkpoint(out)
    acc = observation_accuracy(sampler.model, sampler.tokenizer, held, stage="sft",
                               max_len=2 * FLAGS.seq_len)
    results["arms"][arm] = {
        "final_loss": res["losses"][-1], "accuracy": acc.model,
        "copy_previous": acc.copy_previous, "eval_tokens": acc.tokens,
        "eval_trajectories": acc.samples,
        "per_domain": {d: v[0] for d, v in acc.per_domain.items()}}
    print(f"{arm:6} final loss {res['losses'][-1]:.3f}  held-out accuracy {acc.model:.4f} "
          f"(copy-previous {acc.copy_previous:.4f}, {acc.tokens} tokens)", flush=True)
  results["seconds"] = round(time.time() - t0, 1)
  path = ROOT / "benchmarks" / "results" / "long_prompts.json"
  path.parent.mkdir(exist_ok=True)
  path.write_text(json.dumps(results, indent=1) + "\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
