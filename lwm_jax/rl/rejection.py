"""SFT data by rejection sampling: a teacher's reasoning traces, kept when its prediction scores well.

For each SFT trajectory, the target turn is the data pipeline's seeded choice
(`lwm_jax.data.pipeline.target_turn`) and the prompt is the SFT one (the variant
`variant_for("sft", id, seed)`, which asks for `<think>` then `<predicted_observation>`). The
teacher answers it `n` times in thinking mode; each answer is scored by the configured reward
(`lwm_jax.rl.rewards`) against the real observation; the best answer whose reward reaches
`threshold` is kept (ties: the earliest), and a trajectory without one is left out and counted:
as `rejected` when its answers were judged and none was good enough, as `judge_failed` when no
answer could be judged (the reward's judge failed after its retries; `judge_failures` counts the
answers), so a judge outage is never read as low quality.

A kept trajectory is written whole, with the teacher's reasoning for the target turn in
`meta["think"]` (`{"<turn>": reasoning}`, which the SFT pipeline's `think_text` reads into the
`<think>` block of that turn's target) and `meta["target_turn"]`, `meta["rejection"]` (reward,
components, the teacher's own prediction, how many answers were drawn). The target's observation
is the real one (`target="reference"`, the default: the SFT data never teaches what the
environment did not print), or the teacher's prediction (`target="teacher"`). The SFT stage must
run with the same `seed` so that it picks the same target turn.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any, Sequence

from lwm_jax.data import prompts
from lwm_jax.data.pipeline import target_turn
from lwm_jax.data.reply import THINK_CLOSE, THINK_OPEN, parse_prediction, split_reasoning
from lwm_jax.data.schema import Trajectory
from lwm_jax.rl.rewards import MixedReward, RewardInput
from lwm_jax.sampling.backends import Backend, Completion, SamplerBackend
from lwm_jax.sampling.params import SamplingParams

TARGETS = ("reference", "teacher")


@dataclasses.dataclass
class Candidate:
  reply: str            # the whole answer, reasoning inside <think>
  reasoning: str
  prediction: str
  reward: float = 0.0
  components: dict[str, float] = dataclasses.field(default_factory=dict)
  error: str = ""
  judge_failed: str = ""   # the reward's judgement failed (after its retries): not scored


def teacher_messages(traj: Trajectory, seed: int) -> tuple[int, list[dict[str, str]]]:
  """(target turn, the SFT prompt's messages) of a trajectory."""
  t = target_turn(traj, seed)
  return t, prompts.prompt_messages(traj, t, prompts.variant_for("sft", traj.id, seed))


def candidate_of(c: Completion) -> Candidate:
  """A teacher answer: an endpoint may hand the reasoning apart (`reasoning_content`); our own
  sampler leaves it in the text."""
  if c.reasoning:
    reply = f"{THINK_OPEN}{c.reasoning}{THINK_CLOSE}\n{c.text.strip()}"
  else:
    reply = c.text
  reasoning, _ = split_reasoning(reply)
  return Candidate(reply=reply, reasoning=reasoning, prediction=parse_prediction(reply))


def draw(backend: Backend, convs: Sequence[list[dict[str, str]]], n: int, *,
         temperature: float = 0.6, max_new_tokens: int = 4096, seed: int = 0
         ) -> list[list[Completion | Exception]]:
  """`n` answers per conversation. Our Sampler draws them as `n` choices of one request (distinct
  streams); any other backend is asked `n` times (it must sample, e.g. temperature > 0 and no
  fixed seed)."""
  out: list[list[Completion | Exception]] = [[] for _ in convs]
  if isinstance(backend, SamplerBackend):
    bs = max(1, backend.batch_size // n)
    for start in range(0, len(convs), bs):
      chunk = list(convs[start:start + bs])
      params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                              seed=seed + start, n=n)
      try:
        gens = backend.sampler.generate(chunk, params)
      except Exception as e:  # noqa: BLE001 - this chunk fails, the run goes on
        for j in range(len(chunk)):
          out[start + j] = [e] * n
        continue
      for j in range(len(chunk)):
        out[start + j] = [Completion(text=g.text, finish_reason=g.finish_reason)
                          for g in gens[j * n:(j + 1) * n]]
    return out
  flat = [conv for conv in convs for _ in range(n)]
  got: dict[int, Completion | Exception] = dict(backend.complete_many(flat))
  for k in range(len(flat)):
    out[k // n].append(got.get(k, RuntimeError("no answer")))
  return out


def select(cands: Sequence[Candidate], threshold: float) -> int | None:
  """Index of the best usable candidate whose reward reaches `threshold` (the earliest on ties);
  a candidate with an error, a failed judgement, no prediction or no reasoning is not usable."""
  best = None
  for i, c in enumerate(cands):
    if c.error or c.judge_failed or not c.prediction.strip() or not c.reasoning.strip() or c.reward < threshold:
      continue
    if best is None or c.reward > cands[best].reward:
      best = i
  return best


def sft_record(traj: Trajectory, turn: int, cand: Candidate, n: int,
               target: str = "reference") -> Trajectory:
  """The trajectory carrying the kept answer's reasoning for `turn` (see the module docstring)."""
  if target not in TARGETS:
    raise ValueError(f"target: '{target}' is not one of {', '.join(TARGETS)}")
  out = copy.deepcopy(traj)
  if target == "teacher":
    out.turns[turn].observation = cand.prediction
  out.meta["think"] = {str(turn): cand.reasoning}
  out.meta["target_turn"] = turn
  out.meta["rejection"] = {"reward": cand.reward, "components": cand.components, "n": n,
                           "prediction": cand.prediction, "target": target}
  return out


def rejection_sample(trajs: Sequence[Trajectory], backend: Backend, reward: MixedReward, *,
                     n: int = 3, threshold: float = 0.0, seed: int = 0, target: str = "reference",
                     temperature: float = 0.6, max_new_tokens: int = 4096
                     ) -> tuple[list[Trajectory], dict[str, Any]]:
  """(kept SFT trajectories, retention statistics per domain and overall)."""
  if n < 1:
    raise ValueError(f"n must be >= 1, got {n}")
  if target not in TARGETS:
    raise ValueError(f"target: '{target}' is not one of {', '.join(TARGETS)}")
  turns_msgs = [teacher_messages(t, seed) for t in trajs]
  answers = draw(backend, [m for _, m in turns_msgs], n, temperature=temperature,
                 max_new_tokens=max_new_tokens, seed=seed)
  cands: list[list[Candidate]] = []
  inputs, where = [], []
  for i, (traj, (turn, _), got) in enumerate(zip(trajs, turns_msgs, answers)):
    row = []
    for j, a in enumerate(got):
      if isinstance(a, Exception):
        row.append(Candidate("", "", "", error=f"{type(a).__name__}: {a}"))
        continue
      c = candidate_of(a)
      row.append(c)
      inputs.append(RewardInput(traj.domain, [(x.action, x.observation) for x in traj.turns[:turn]],
                                traj.turns[turn].action, c.reply, traj.turns[turn].observation))
      where.append((i, j))
    cands.append(row)
  for (i, j), s in zip(where, reward.score(inputs)):
    cands[i][j].reward, cands[i][j].components = s["total"], s["components"]
    if not s.get("valid", True):
      cands[i][j].judge_failed = ",".join(f"{k}: {v}" for k, v in s["failures"].items())
  kept: list[Trajectory] = []
  per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  best_sum: dict[str, float] = collections.defaultdict(float)
  kept_sum: dict[str, float] = collections.defaultdict(float)
  for traj, (turn, _), row in zip(trajs, turns_msgs, cands):
    st = per[traj.domain]
    st["prompts"] += 1
    st["samples"] += len(row)
    st["errors"] += sum(1 for c in row if c.error)
    st["no_prediction"] += sum(1 for c in row if not c.error and not c.prediction.strip())
    st["no_reasoning"] += sum(1 for c in row if not c.error and not c.reasoning.strip())
    st["judge_failures"] += sum(1 for c in row if c.judge_failed)
    usable = [c.reward for c in row if not c.error and not c.judge_failed]
    best_sum[traj.domain] += max(usable) if usable else 0.0
    k = select(row, threshold)
    if k is None:
      # no answer could be judged: skipped and counted apart, not a quality rejection
      if row and all(c.error or c.judge_failed for c in row) and any(c.judge_failed
                                                                     for c in row):
        st["judge_failed"] += 1
      else:
        st["rejected"] += 1
      continue
    st["kept"] += 1
    kept_sum[traj.domain] += row[k].reward
    kept.append(sft_record(traj, turn, row[k], n, target))
  return kept, _stats(per, best_sum, kept_sum, n, threshold)


def _stats(per, best_sum, kept_sum, n, threshold) -> dict[str, Any]:
  domains = {}
  total: collections.Counter = collections.Counter()
  for d, st in sorted(per.items()):
    total.update(st)
    domains[d] = dict(st, retention=st["kept"] / st["prompts"] if st["prompts"] else 0.0,
                      mean_best_reward=best_sum[d] / st["prompts"] if st["prompts"] else 0.0,
                      mean_kept_reward=kept_sum[d] / st["kept"] if st["kept"] else None)
  overall = dict(total, retention=total["kept"] / total["prompts"] if total["prompts"] else 0.0)
  return {"n": n, "threshold": threshold, "domains": domains, "overall": overall}


def format_stats(stats: dict[str, Any]) -> str:
  """A small table of retention per domain."""
  lines = [f"{'domain':<10} {'prompts':>7} {'kept':>5} {'retention':>9} {'best r':>7} "
           f"{'errors':>6} {'judge failed':>12}"]
  for d, s in stats["domains"].items():
    lines.append(f"{d:<10} {s['prompts']:>7} {s.get('kept', 0):>5} {100 * s['retention']:>8.1f}% "
                 f"{s['mean_best_reward']:>7.2f} {s.get('errors', 0):>6} "
                 f"{s.get('judge_failures', 0):>12}")
  o = stats["overall"]
  lines.append(f"{'overall':<10} {o.get('prompts', 0):>7} {o.get('kept', 0):>5} "
               f"{100 * o['retention']:>8.1f}%")
  return "\n".join(lines)
