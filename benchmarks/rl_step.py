"""Where a GSPO step's time goes: rollout (sampling G replies per prompt + rewards) vs update.

  python benchmarks/rl_step.py [--steps 4] [--max_new_tokens 32] [--prompts 2] [--group 4]
      [--start data/world_model] [--pool data/corpus/os_validation.jsonl.gz]

Runs the real RL stage (`configs/rl.py:demo`, `lwm_jax.rl.stage.rollout_source`,
`trainer.train`) from the shipped demo model on the bundled corpus's trajectories (judge-free
rewards), `--steps` optimizer steps with `log_every=1`. Each rollout batch feeds
`updates_per_batch` steps. Per step it records the source's own `rollout_s` and `reward_s` as
the trainer logs them (once per rollout batch), the wall time inside `next_batch` and of the
whole step; update s = step s - next_batch s (the compiled GSPO step; the first includes
compiling it). Raw per-step times and the medians go to benchmarks/results/rl_step.json.
The `small` preset runs with `--preset small` (random weights of that size, the demo tokenizer).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TimedSource:
  """Passes everything through to the rollout source and times its `next_batch` calls."""

  def __init__(self, inner):
    self._inner = inner
    self.batch_s: list[float] = []

  def next_batch(self, state):
    t = time.perf_counter()
    out = self._inner.next_batch(state)
    self.batch_s.append(time.perf_counter() - t)
    return out

  def __getattr__(self, name):
    return getattr(self._inner, name)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--preset", default="demo", choices=("demo", "small"))
  ap.add_argument("--steps", type=int, default=4)
  ap.add_argument("--prompts", type=int, default=2)
  ap.add_argument("--group", type=int, default=4)
  ap.add_argument("--updates", type=int, default=2)
  ap.add_argument("--max_new_tokens", type=int, default=32)
  ap.add_argument("--seq_len", type=int, default=1024)
  ap.add_argument("--start", default=os.path.join(ROOT, "data", "world_model"))
  ap.add_argument("--pool", default=os.path.join(ROOT, "data", "corpus", "os_validation.jsonl.gz"))
  ap.add_argument("--out", default="rl_step")
  a = ap.parse_args()
  from common import write_result
  from configs import rl as rl_config
  from lwm_jax.data import corpus as corpus_lib
  from lwm_jax.data.jsonl import iter_jsonl
  from lwm_jax.rl import stage
  from lwm_jax.train import trainer

  start_hf, sp, vocab, context = corpus_lib.given_start(a.start)
  c = rl_config.get_config(a.preset)
  c.model.vocab_size = vocab
  c.data.tokenizer, c.data.pipeline.jsonl = sp, a.pool
  c.rl.update(dict(prompts_per_batch=a.prompts, group_size=a.group, updates_per_batch=a.updates,
                   max_new_tokens=a.max_new_tokens, pool_fractions="rl=1.0",
                   filter_zero_variance=False))
  c.model.max_position_embeddings = max(context, a.seq_len)
  c.train.update(dict(num_steps=a.steps, batch_size=a.prompts * a.group // a.updates,
                      seq_len=a.seq_len, log_every=1, eval_every=0, progress=False))
  c.train.micro_batches = 1
  c.checkpoint.update(every=10 ** 6, use_async=False)
  if a.preset == "demo":
    c.init_from_hf = start_hf
  workdir = tempfile.mkdtemp()
  source = TimedSource(stage.rollout_source(c))
  t0 = time.perf_counter()
  summary = trainer.train(c, workdir, source=source)
  total = time.perf_counter() - t0
  rows = [r for _, r in iter_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if r.get("split") == "train"]
  tokens = c.train.batch_size * c.train.seq_len
  step_s = [tokens / r["tokens_per_s"] for r in rows]
  batch_s = source.batch_s[:len(step_s)]
  update_s = [s - b for s, b in zip(step_s, batch_s)]
  per_step = [{"step": r["step"], "step_s": s, "next_batch_s": b, "update_s": u,
               "new_rollout": r.get("rollout/minibatch") == 0,
               "rollout_s": r.get("rollout/rollout_s"), "reward_s": r.get("rollout/reward_s"),
               "response_len": r.get("rollout/response_len"), "loss": r.get("loss")}
              for r, s, b, u in zip(rows, step_s, batch_s, update_s)]
  for p in per_step:
    print(p, flush=True)
  # the trainer's logged rollout seconds, once per rollout batch (minibatch 0 of its updates)
  rollouts = [p["rollout_s"] for p in per_step if p["new_rollout"] and p["rollout_s"] is not None]
  res = {"preset": a.preset, "args": vars(a), "steps": per_step, "total_s": total,
         "median_rollout_s_per_batch": statistics.median(rollouts) if rollouts else None,
         "median_update_s_after_first": statistics.median(update_s[1:]) if len(update_s) > 1
         else None,
         "rollout_share": sum(batch_s) / max(sum(step_s), 1e-9),
         "final_step": summary["final_step"],
         "updates_per_rollout": a.updates,
         "note": "rollout_s: the source's logged seconds per rollout batch; next_batch_s: wall "
                 "time in next_batch; update_s = step_s - next_batch_s (first step compiles)"}
  print({k: v for k, v in res.items() if k != "steps"})
  print("wrote", write_result(a.out, res))


if __name__ == "__main__":
  main()
