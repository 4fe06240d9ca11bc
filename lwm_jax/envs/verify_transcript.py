"""Task verdicts from a transcript alone, for episodes without a real state (simulated episodes).

`check_transcript(domain, seed, history)` re-creates the world and the goal of `seed` with a
fresh real environment (`reset` only; none of the agent's actions is replayed) and judges the
recorded turns. Question tasks use the same rules as `verify.check` (they read the answer from
the transcript in both modes). A task that changes state is judged from the LAST observation
that shows that state, as the simulated environment reported it (each domain's rules live in its
folder, `lwm_jax/envs/<domain>/verify.py`, named by its record's `transcript_verifier`):

  terminal  count_errors: the last command that printed report.txt (cat/head/tail, no
            redirection) shows the right count on its first line; backup_csv: the last `ls` that
            names the backup folder lists every CSV of the data folder; rename_notes: the last
            `ls` that shows any of the notes lists every note as .md and none as .txt.
  swe       after the last successful edit, every test run exited 0 and at least one of them
            covers the failing test (the whole suite, its file or its node id); no `edit` touched
            a file under tests/. (The real-state check runs the whole suite instead.)
  web       buy: the account page lists an order of the product x quantity with the shipping and
            address asked for; no stock for the quantity: no order of the product was placed
            and the shop's refusal was shown.
  android   the last screen of the app concerned: the contact list names the contact and the
            form saved just before it held the name and phone; the alarm list shows the alarm
            switched on; the settings screen shows the switch flipped and the brightness above
            its start; the notes list names the note; the contact list no longer names the
            deleted contact and still names every other one.
  os        edit: a "Saved FILE" status line with the added line in the editor's text; mkdir,
            rename, delete: the last file-manager listing of the folder concerned; theme: the last
            settings window shows the theme asked for and a volume below its start.
  mcp       the tool results: a create_order result for the customer, product and quantity; a
            refund_order result for the order; an update_customer result with the new email.
            Refused changes (too little stock, a pending order, a taken email) succeed when no
            such result appears and the refusal does.

A simulated environment that reports success it did not achieve fools these rules; the verdicts
are only as good as the world model's fidelity, which the fidelity report measures.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any, Callable, Iterable, Iterator, Sequence

from lwm_jax import domains
from lwm_jax.data import schema
from lwm_jax.envs import base
from lwm_jax.envs import verify as V


def check_transcript(domain: str, seed: int, history: Iterable[Any],
                     env: base.Env | None = None) -> V.Verdict:
  """Verdict on a recorded episode of `domain` at `seed` from its turns alone (see the module
  docstring). `env` (a real env of that domain, reused across calls) is reset to `seed`."""
  turns = V._turns(history)
  with _world(domain, seed, env) as env:
    return _rule(domain)(env, env.goal, turns)


def check_trajectory(traj: Any, env: base.Env | None = None) -> V.Verdict:
  """`check_transcript` of a recorded `schema.Trajectory`; its seed comes from `meta["seed"]`."""
  return check_transcript(traj.domain, _seed_of(traj), traj.turns, env)


def solved_turns(traj: Any, env: base.Env | None = None) -> int | None:
  """The number of turns after which the recorded trajectory `traj` first meets its task (the
  transcript rules of `check_transcript` on each prefix, one `reset`), or None if it never does."""
  turns = V._turns(traj.turns)
  with _world(traj.domain, _seed_of(traj), env) as env:
    return next((k for k in range(1, len(turns) + 1)
                 if _rule(traj.domain)(env, env.goal, turns[:k]).success), None)


def cut_at_goal(trajs: Sequence[Any]) -> tuple[list[Any], collections.Counter]:
  """`trajs`, each cut after the first turn at which it meets its task by these rules
  (`solved_turns`, one real environment per domain, reset per trajectory, closed at the end),
  with the counts of `cut_after`. A data-preparation step: `launch/data.py goal-cut` writes its
  output, which behaviour cloning then reads like any other file (training runs no environment)."""
  envs: dict[str, base.Env] = {}

  def solved(traj):
    if traj.domain not in envs:
      envs[traj.domain] = base.make_env(traj.domain)
    return solved_turns(traj, envs[traj.domain])

  try:
    return cut_after(trajs, solved)
  finally:
    for env in envs.values():
      env.close()


def cut_after(trajs: Sequence[Any], solved: Callable[[Any], int | None]
              ) -> tuple[list[Any], collections.Counter]:
  """Each trajectory cut after the turn at which `solved(traj)` (a number of turns, or None for
  never) says its task was met; a never-solved one is kept whole. Returns the trajectories and
  counts: trajectories, cut (turns after the goal existed), turns_dropped, never_solved."""
  out, stats = [], collections.Counter()
  for t in trajs:
    stats["trajectories"] += 1
    k = solved(t)
    if k is None:
      stats["never_solved"] += 1
      out.append(t)
      continue
    if not 1 <= k <= len(t.turns):
      raise ValueError(f"trajectory {t.id}: solved after {k} turns, but it has {len(t.turns)}")
    if k < len(t.turns):
      stats["cut"] += 1
      stats["turns_dropped"] += len(t.turns) - k
    out.append(dataclasses.replace(t, turns=list(t.turns[:k])))
  return out, stats


def write_cut_at_goal(trajs: Sequence[Any], out: str) -> collections.Counter:
  """`cut_at_goal(trajs)` written to `out` (JSONL, gzipped when it ends in .gz); the counts."""
  cut, stats = cut_at_goal(trajs)
  schema.write_jsonl(out, cut)
  return stats


@contextlib.contextmanager
def _world(domain: str, seed: int, env: base.Env | None) -> Iterator[base.Env]:
  """`env` (or a fresh real env of `domain`, closed afterwards) reset to the world of `seed`."""
  if domain not in verified_domains():
    raise ValueError(f"no transcript verifier for environment {domain!r} "
                     f"(expected one of {', '.join(verified_domains())})")
  own = env is None
  env = env or base.make_env(domain)
  try:
    if env.domain != domain:
      raise ValueError(f"env is a {env.domain!r} environment, not {domain!r}")
    env.reset(seed)
    yield env
  finally:
    if own:
      env.close()


def _seed_of(traj: Any) -> int:
  seed = traj.meta.get("seed")
  if not isinstance(seed, int):
    raise ValueError(f"trajectory {traj.id}: meta['seed'] is missing or not an integer ({seed!r}); "
                     "the world of the episode cannot be re-created without it")
  return seed


def _last(turns: V.Turns, pred: Callable[[str, str], bool]) -> tuple[str, str] | None:
  for a, o in reversed(turns):
    if pred(a, o):
      return a, o
  return None


# -- terminal -------------------------------------------------------------------------------------
def verified_domains() -> tuple[str, ...]:
  """The registered domains with a transcript verifier (their record's `transcript_verifier`)."""
  return tuple(d.name for d in domains.domains() if d.transcript_verifier)


def _rule(domain: str) -> Callable[[Any, dict[str, Any], V.Turns], V.Verdict]:
  return domains.get_domain(domain).load("transcript_verifier")
