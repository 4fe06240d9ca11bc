"""Task verifiers: did the agent of an episode do what the episode's goal (`env.goal`) asked?

`check(env, history)` judges a finished episode of any of the seven environments and returns a
`Verdict(success, credit, reason)`: binary success, partial credit in [0, 1] (1.0 exactly when
the task is done) and a one-line reason naming what was checked. `history` is the list of
(action, observation) turns of the episode (pairs, or `schema.Turn`s). Verdicts are
deterministic: they read the environment's real state after the last action and the turns.

What is checked, per domain (the goal kinds are the env modules' own; each domain's checks live
in its folder, `lwm_jax/envs/<domain>/verify.py`, named by its record's `verifier`):

  terminal  files in the sandbox: report.txt holds the ERROR count of the log; every CSV of the
            data folder has an identical copy in the backup folder; every note .txt became .md
            with its text. Question tasks read the agent's answer from the transcript (there is
            no answer action): sum_region, the output of the last command that printed one
            number and nothing else; top_users, the last command whose whole output is a
            `count name` table (uniq -c style), which must list every user with the right count,
            most frequent first; find_def, an observation showing `def NAME(` together with the
            path of the file that defines it; tour (asked for only, `TerminalEnv(task="tour")`),
            the share of directories that an `ls` naming them showed with all their files.
  swe       the repository's whole test suite passes when run now, and no test file was changed.
  search    the target document was opened (its page shown); half credit when it was in a result
            list but never opened. The action space has no answer action, so reading the right
            document is the answer.
  web       the shop server's orders: a new order of the user with exactly the product and
            quantity, shipping and address asked for (when the stock cannot cover the quantity,
            success is placing no order of the product after the shop refused it); cheapest,
            the last product page the agent opened is a cheapest product of the category;
            account, a page showed the account's orders while signed in as the user.
  android   the phone's live state: the contact saved with the phone number; the alarm at the
            time with the label, switched on; the switch flipped and the brightness above where
            it started; the note saved; the contact gone and every other contact kept.
  os        files in the sandbox and the settings: the line added and the file saved with the
            rest of its text kept; the folder made in Documents; the file renamed with its
            text; the file deleted; the theme switched and the volume below where it started.
  mcp       the database rows: a new order of the customer for the product and quantity; the
            order refunded (with its refunds row); the email updated. When the database refuses
            the change (stock too low, a pending order, an email that another customer has),
            success is leaving the rows as they were after the refusal was seen. Questions:
            report, the last `query` result of (category, revenue) rows must equal the real
            revenue per category of paid and shipped orders, highest first; lookup, the last
            `list_orders` result for the customer must show exactly their pending orders.

`verify_transcript.check_transcript(domain, seed, history)` judges an episode for which no real
state exists (a simulated episode): it re-creates the world and goal of `seed` with a real
environment (`reset` only; no action is replayed) and judges from the transcript alone, by the
rules its docstring lists. Question tasks are judged by the same rules in both modes.

Agent tasks are drawn by seed: `task_seeds("train")` and `task_seeds("heldout")` are disjoint
ranges, far above the episode seeds of corpus collection (base seeds below 999; the bundled
corpus uses base seed 0), so held-out tasks are seen neither by the agent in training nor by the
world model.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

from lwm_jax import domains
from lwm_jax.envs import base, confined

# Agent task seeds: [start, stop) per split. Collection runs with base seed S play episode seeds
# S * 1_000_003 + i (`recorder.episode_seed`), so these ranges stay clear of every base seed below
# 999 (the bundled corpus uses 0).
TASK_SEED_RANGES = {"train": (1_000_000_000, 1_001_000_000), "heldout": (1_900_000_000, 1_901_000_000)}


@dataclasses.dataclass(frozen=True)
class Verdict:
  success: bool
  credit: float
  reason: str


def task_seeds(split: str, n: int | None = None) -> range:
  """The seeds of agent tasks for `split` ('train' or 'heldout'), the first `n` of them."""
  if split not in TASK_SEED_RANGES:
    raise ValueError(f"unknown task split {split!r} (expected one of {', '.join(TASK_SEED_RANGES)})")
  lo, hi = TASK_SEED_RANGES[split]
  if n is not None and not 0 <= n <= hi - lo:
    raise ValueError(f"{split} has {hi - lo} task seeds; asked for {n}")
  return range(lo, hi if n is None else lo + n)


def split_of_seed(seed: int) -> str | None:
  """'train', 'heldout' or None (a seed outside both task ranges)."""
  for name, (lo, hi) in TASK_SEED_RANGES.items():
    if lo <= seed < hi:
      return name
  return None


Turns = list[tuple[str, str]]


def _turns(history: Iterable[Any]) -> Turns:
  out = []
  for i, t in enumerate(history):
    if isinstance(t, (tuple, list)) and len(t) == 2:
      out.append((str(t[0]), str(t[1])))
    elif hasattr(t, "action") and hasattr(t, "observation"):
      out.append((t.action, t.observation))
    else:
      raise ValueError(f"history turn {i}: expected an (action, observation) pair, got {type(t).__name__}")
  return out


def _v(ok: bool, credit: float, reason: str) -> Verdict:
  return Verdict(bool(ok), 1.0 if ok else max(0.0, min(float(credit), 0.99)), reason)


def _share(done: int, total: int, what: str) -> Verdict:
  return _v(total > 0 and done == total, done / max(total, 1), f"{done} of {total} {what}")


def _read(root: str, rel: str) -> str | None:
  """The text of regular file `rel` under the episode folder `root`, or None (missing, or a link,
  FIFO or device the agent left there: the host never follows or opens those), read up to
  `confined.MAX_READ` bytes."""
  return confined.read_text(root, rel)


def check(env: base.Env, history: Iterable[Any]) -> Verdict:
  """Verdict on the episode that `env` just played (its state now) with these turns."""
  goal = env.goal
  if not goal:
    raise ValueError(f"{env.domain} env has no goal: call reset(seed) and play the episode first")
  dom = domains.get_domain(env.domain)
  if not dom.verifier:
    raise ValueError(f"no verifier for environment {env.domain!r}")
  fn = dom.load("verifier")
  real = dom.load("env")
  if not isinstance(env, real):
    raise ValueError(f"{type(env).__name__} is not the real {env.domain} environment ({real.__name__}): "
                     "it has no real state to check; judge its episode with "
                     "verify_transcript.check_transcript")
  return fn(env, goal, _turns(history))


# -- reading answers from a transcript ------------------------------------------------------------
def scripted_success(domain: str, seeds: Iterable[int]) -> dict[str, list[bool]]:
  """Success of the scripted agent on each seed, grouped by goal kind (how hard each task is)."""
  import random
  from lwm_jax.envs import recorder
  env = base.make_env(domain)
  out: dict[str, list[bool]] = {}
  try:
    for seed in seeds:
      traj = recorder.run_episode(env, base.make_agent(domain, random.Random(seed)), seed, f"{domain}-{seed}")
      out.setdefault(env.goal.get("kind", "fix"), []).append(check(env, traj.turns).success)
  finally:
    env.close()
  return out


if __name__ == "__main__":
  import argparse
  ap = argparse.ArgumentParser(description="Success rate of the scripted agents, per domain and goal kind.")
  ap.add_argument("--domains", default=",".join(base.env_names()))
  ap.add_argument("--split", default="heldout", choices=sorted(TASK_SEED_RANGES))
  ap.add_argument("--episodes", type=int, default=30)
  args = ap.parse_args()
  print(f"| domain | success | per goal kind |\n|---|---|---|")
  for name in args.domains.split(","):
    res = scripted_success(name, task_seeds(args.split, args.episodes))
    ok = sum(sum(v) for v in res.values())
    kinds = ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in sorted(res.items()))
    print(f"| {name} | {ok}/{args.episodes} ({100 * ok / args.episodes:.0f}%) | {kinds} |", flush=True)
