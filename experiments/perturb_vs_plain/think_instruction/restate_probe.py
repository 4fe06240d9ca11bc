"""Does a model trained with `--thinking_target=instruction` say the instruction back?

  python experiments/perturb_vs_plain/think_instruction/restate_probe.py CORPUS_DIR OUT.json MODEL...
  python experiments/perturb_vs_plain/think_instruction/restate_probe.py --copy CORPUS_DIR OUT.json MODEL...

For the held-out (test split) episodes of the mcp, search and web copies in CORPUS_DIR (a
`launch/perturb_experiment.py` corpus copy), with and without a simulation instruction, the model
writes its reply to each of the first four turns given the real history (template v0, as the
simulated environments prompt it; greedy, 160 new tokens, the oldest history dropped to fit). The
reasoning of the reply is compared with what the thinking target would hold
(`lwm_jax.data.prompts.instruction_think`, as template v0 shows the instruction): word for word,
and by the instruction's kind (the words before its first colon or full stop: "Pagination",
"Withheld fields", ... or "None"). Per model, turn and
domain: how often each holds, and how many tokens separate the instruction's last token from the
start of the reply (the distance the copy spans). Every reply goes to OUT.json. With `--copy`,
the teacher-forced test of `copy_nll` instead.
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from lwm_jax.data import prompts, schema  # noqa: E402
from lwm_jax.data.reply import THINK_OPEN, split_reasoning  # noqa: E402

DOMAINS = ("mcp", "search", "web")
TURNS = 4
NEW_TOKENS = 160
HEAD = "Simulation instruction:"  # how prompts.instruction_think opens the block


def kind(think: str) -> str:
  """The instruction's kind as a think block states it: the words after 'Simulation
  instruction:' up to the next colon or full stop ('None' when there is none); '' when the
  block says something else."""
  if not think.startswith(HEAD):
    return ""
  return re.split(r"[:.]", think[len(HEAD):].strip().lstrip("- "), maxsplit=1)[0].strip()


def episodes(corpus: str, per_kind: int = 40) -> list[schema.Trajectory]:
  """Per domain, up to `per_kind` test episodes with an instruction and as many without."""
  out = []
  for d in DOMAINS:
    test = list(schema.read_jsonl(os.path.join(corpus, f"{d}_test.jsonl.gz")))
    told = [t for t in test if t.simulation_instruction.strip()][:per_kind]
    plain = [t for t in test if not t.simulation_instruction.strip()][:len(told)]
    out += told + plain
  return out


def probe(model: str, trajs: list[schema.Trajectory]) -> dict:
  from lwm_jax.sampling.params import SamplingParams  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.sampler import Sampler, fit_chat  # pylint: disable=C0415
  sampler = Sampler.from_checkpoint(model, max_batch=32)
  budget = int(sampler.engine.context) - NEW_TOKENS
  jobs = []
  for t in trajs:
    for k in range(min(TURNS, len(t.turns))):
      msgs, _ = fit_chat(sampler, prompts.prompt_messages(t, k, 0), budget)
      if msgs is None:
        continue
      distance = None
      instr = t.simulation_instruction.strip()
      if instr:  # the chat after the system prompt + the system prompt's text after the instruction
        system = msgs[0]["content"]
        after = system[system.rfind(instr) + len(instr):]
        distance = (len(sampler.encode_prompt(msgs)) - len(sampler.encode_prompt(msgs[:1]))
                    + len(sampler.tokenizer.encode(after)))
      jobs.append((t, k, msgs, distance))
  params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
  rows = []
  for i in range(0, len(jobs), 32):
    chunk = jobs[i:i + 32]
    gens = sampler.generate([m for _, _, m, _ in chunk], params)
    for (t, k, _, distance), g in zip(chunk, gens):
      think, _ = split_reasoning(g.text)
      want = prompts.instruction_think(t, 0)
      rows.append({"trajectory": t.id, "domain": t.domain, "turn": k,
                   "instructed": distance is not None,
                   "distance": distance, "want": want, "think": think,
                   "exact": think == want, "kind_right": kind(think) == kind(want)})
  summary: dict = collections.defaultdict(lambda: [0, 0, 0])
  for r in rows:
    for key in ((r["instructed"], "all"), (r["instructed"], f"turn {r['turn'] + 1}"),
                (r["instructed"], r["domain"])):
      s = summary[key]
      s[0] += 1
      s[1] += r["exact"]
      s[2] += r["kind_right"]
  table = {f"{'instructed' if a else 'plain'} | {b}": {"replies": n, "exact": e / n,
                                                       "kind_right": c / n}
           for (a, b), (n, e, c) in sorted(summary.items())}
  dist = [r["distance"] for r in rows if r["distance"] is not None]
  return {"model": model, "summary": table,
          "distance_tokens": {"min": min(dist), "median": sorted(dist)[len(dist) // 2],
                              "max": max(dist)} if dist else None,
          "replies": rows}


def copy_nll(model: str, trajs: list[schema.Trajectory]) -> dict:
  """Teacher-forced: can the model copy the instruction once the copy has begun? For the first
  turn of each instructed episode, the reply `<think>Simulation instruction: <the instruction>`
  is scored under three system prompts: the episode's own (the text to copy is there), one
  carrying the next episode's instruction of another kind, and one without any. Mean NLL (nats
  a token) of the instruction's first token (the decision) and of the rest (the copy). A model
  that copies predicts the rest far better from its own prompt than from the others."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from lwm_jax.eval.teacher_forced import _padded, _scorer  # pylint: disable=C0415
  from lwm_jax.sampling.sampler import Sampler  # pylint: disable=C0415
  sampler = Sampler.from_checkpoint(model, max_batch=4)
  tok, score = sampler.tokenizer, _scorer(sampler.model)

  told = [t for t in trajs if t.simulation_instruction.strip()]
  sums = {k: [0.0, 0, 0.0, 0] for k in ("own", "other", "none")}
  for i, t in enumerate(told):
    own_kind = kind(prompts.instruction_think(t, 0))
    other = next((u for u in told[i + 1:] + told[:i]
                  if kind(prompts.instruction_think(u, 0)) != own_kind), None)
    reply = tok.encode(prompts.instruction_think(t, 0))
    head = len(tok.encode(HEAD))
    for key, inst in (("own", t.simulation_instruction), ("none", ""),
                      ("other", other.simulation_instruction if other else None)):
      if inst is None:
        continue
      msgs = prompts.prompt_messages(dataclasses.replace(t, simulation_instruction=inst), 0, 0)
      ids = sampler.encode_prompt(msgs) + tok.encode(THINK_OPEN) + reply
      if len(ids) > int(sampler.engine.context):
        continue
      lp = np.asarray(score(_padded(ids))[1])[0]
      start = len(ids) - len(reply) + head  # the instruction's first token
      nll = -lp[start - 1:len(ids) - 1]
      s = sums[key]
      s[0] += float(nll[0]); s[1] += 1; s[2] += float(nll[1:].sum()); s[3] += len(nll) - 1
  return {k: {"episodes": s[1], "first_token": s[0] / max(s[1], 1), "rest": s[2] / max(s[3], 1)}
          for k, s in sums.items()}


def main(argv: list[str]) -> None:
  copy = "--copy" in argv
  argv = [a for a in argv if a != "--copy"]
  if len(argv) < 4:
    raise SystemExit(__doc__)
  corpus, out, models = argv[1], argv[2], argv[3:]
  trajs = episodes(corpus)
  if copy:
    results = [{"model": m, "copy_nll": copy_nll(m, trajs)} for m in models]
    for r in results:
      print(r["model"], json.dumps(r["copy_nll"]))
  else:
    results = [probe(m, trajs) for m in models]
    for r in results:
      print(r["model"], r["distance_tokens"])
      for key, x in r["summary"].items():
        print(f"  {key:<24} {x['replies']:>4} replies  exact {x['exact']:.2f}  "
              f"kind {x['kind_right']:.2f}")
  with open(out, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main(sys.argv)
