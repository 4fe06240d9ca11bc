"""Simulated episodes played against real ones: the demo's episode (chosen by how knowable its
observations are from what precedes them), the first turns of held-out episodes played in one
batch, and their edit-similarity figures printed side by side."""
from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

from lwm_jax.data import prompts, schema


_WORD = re.compile(r"[A-Za-z0-9_.\-]+")


def knowable_share(episode: schema.Trajectory, turns: int = 3) -> float:
  """How much of an episode's first `turns` real observations a simulator could know: per turn, the
  share of the observation's words (runs of letters, digits, `_.-`) that already appear in what
  precedes it (the evaluation system prompt with its initial state, the actions, the earlier real
  observations), averaged over the turns. It looks at the data only, never at a model: a log or
  a CSV the environment drew at random scores low, `ls` or an error message about a file named in
  the initial state scores high."""
  known = set(_WORD.findall(prompts.system_prompt(episode, 0)))
  shares = []
  for turn in episode.turns[:turns]:
    known.update(_WORD.findall(turn.action))
    words = _WORD.findall(turn.observation)
    shares.append(sum(w in known for w in words) / len(words) if words else 1.0)
    known.update(words)
  return sum(shares) / len(shares) if shares else 0.0


def demo_episode(test: Sequence[schema.Trajectory], domain: str = "terminal",
                 turns: int = 3) -> schema.Trajectory:
  """The held-out episode the demo plays: of the domain's test episodes, the one whose first
  `turns` observations are most knowable (`knowable_share`; the first in file order on a tie).
  An episode that mostly prints a randomly drawn log tests luck, not simulation."""
  episodes = [t for t in test if t.domain == domain and t.turns]
  if not episodes:
    raise SystemExit(f"no {domain} episode in the test split")
  return max(episodes, key=lambda t: knowable_share(t, turns))  # max keeps the first of equals


def play_episodes(sampler, episodes: Sequence[schema.Trajectory], turns: int = 3,
                  max_new_tokens: int = 120, variant: int = 0) -> list[dict]:
  """Lets the world model (a `Sampler`) play the environment of each real episode for its first
  `turns` actions, greedily, its own earlier answers as history (`lwm_jax.sim.env.SimulatedEnv`);
  the episodes advance together, one batched generation per turn. Per episode: the trajectory
  id, its actions, the simulated and real observations, their edit similarities and the mean."""
  from lwm_jax.textsim import edit_similarity  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.params import SamplingParams  # pylint: disable=import-outside-toplevel
  from lwm_jax.sim.env import SimulatedBatch, World  # pylint: disable=import-outside-toplevel
  batch = SimulatedBatch(sampler, [World.from_trajectory(e) for e in episodes], variant=variant,
                         params=SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
  batch.reset([0] * len(episodes))
  turns_of = [e.turns[:turns] for e in episodes]
  predicted: list[list[str]] = [[] for _ in episodes]
  for k in range(max((len(p) for p in turns_of), default=0)):
    results = batch.step([p[k].action if k < len(p) else None for p in turns_of])
    for i, r in enumerate(results):
      if r is not None:
        predicted[i].append(r.observation)
  out = []
  for e, p, preds in zip(episodes, turns_of, predicted):
    sims = [edit_similarity(pred, t.observation) for pred, t in zip(preds, p)]
    out.append({"trajectory": e.id, "actions": [t.action for t in p], "predicted": preds,
                "real": [t.observation for t in p], "turns": len(sims), "edit_similarity": sims,
                "mean_edit_similarity": sum(sims) / len(sims) if sims else 0.0})
  return out


def simulated_episode(sampler, episode: schema.Trajectory, turns: int = 3,
                      max_new_tokens: int = 120, variant: int = 0, out=print) -> dict:
  """`play_episodes` for one episode, each simulated observation printed beside the real one with
  their edit similarity. Returns the trajectory id, the per-turn similarities and their mean."""
  played = play_episodes(sampler, [episode], turns, max_new_tokens, variant)[0]
  show_episode(played, out)
  return _figures(played)


def _figures(played: dict) -> dict:
  """A played episode's figures for a summary file (its texts left out)."""
  return {k: played[k] for k in ("trajectory", "turns", "edit_similarity", "mean_edit_similarity")}


def show_episode(played: dict, out=print) -> None:
  """Prints a played episode (`play_episodes`): each turn's simulated | real observations."""
  for i, (action, pred, real, sim) in enumerate(zip(played["actions"], played["predicted"],
                                                   played["real"], played["edit_similarity"])):
    out(f"--- turn {i + 1}: {action}")
    out(beside(pred, real))
    out(f"edit similarity {sim:.3f}")
  out(f"mean edit similarity of the simulated observations to the real ones: "
      f"{played['mean_edit_similarity']:.3f} over {played['turns']} turns")


def simulated_terminal_episodes(sampler, test: Sequence[schema.Trajectory],
                                max_new_tokens: int = 320, out=print) -> dict:
  """The world model plays the first three turns of every held-out terminal episode of `test` in
  one batch: prints the demo's episode (`demo_episode`) beside the real one, then one line per
  episode with the mean and median. Returns the demo episode's figures and, under
  `all_terminal_test_episodes`, the summary of all."""
  terminal = [t for t in test if t.domain == "terminal"]
  episode = demo_episode(terminal)
  played = play_episodes(sampler, terminal, turns=3, max_new_tokens=max_new_tokens)
  mine = next(p for p in played if p["trajectory"] == episode.id)
  out(f"the demo's episode {episode.id} ({knowable_share(episode):.0%} of its observations' "
      "words knowable from what precedes them):")
  show_episode(mine, out)
  out("\nevery held-out terminal episode's first three turns (edit similarity per turn, mean, "
      "actions):")
  summary = summarise_episodes(played, out)
  return {**_figures(mine), "all_terminal_test_episodes": summary}


def summarise_episodes(played: Sequence[dict], out=print) -> dict:
  """Prints one line per played episode (`play_episodes`: per-turn edit similarity, mean, actions)
  and their mean and median; returns those figures, how many reach the issue's goal of 0.6, and
  each episode's mean."""
  means = [p["mean_edit_similarity"] for p in played]
  for p in played:
    turns = " ".join(f"{x:.2f}" for x in p["edit_similarity"])
    acts = " ; ".join(a if len(a) <= 28 else a[:25] + "..." for a in p["actions"])
    out(f"  {p['trajectory']:<20} {turns:<15} mean {p['mean_edit_similarity']:.3f}   {acts}")
  summary = {"episodes": len(means), "mean": statistics.mean(means) if means else 0.0,
             "median": statistics.median(means) if means else 0.0,
             "at_least_0.6": sum(m >= 0.6 for m in means),
             "per_episode": {p["trajectory"]: round(p["mean_edit_similarity"], 4) for p in played}}
  out(f"over {len(means)} episodes: mean {summary['mean']:.3f}, median {summary['median']:.3f}; "
      f"{summary['at_least_0.6']} of {len(means)} at 0.6 or more")
  return summary


def beside(simulated: str, real: str, width: int = 48, limit: int = 14) -> str:
  """Two columns, simulated | real, each line cut at `width` characters, at most `limit` lines."""
  cut = lambda text: [ln if len(ln) <= width else ln[:width - 3] + "..."
                      for ln in (text.splitlines() or [""])]
  left, right = cut(simulated), cut(real)
  rows = max(len(left), len(right))
  lines = [f"    {'simulated':<{width}} | real", f"    {'-' * width} | {'-' * width}"]
  for i in range(min(rows, limit)):
    a = left[i] if i < len(left) else ""
    b = right[i] if i < len(right) else ""
    lines.append(f"    {a:<{width}} | {b}")
  if rows > limit:
    lines.append(f"    ... {rows - limit} more lines")
  return "\n".join(lines)
