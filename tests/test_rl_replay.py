"""The replay verifier: the bundled environments reproduce the corpus's recorded observations
when a trajectory's actions are replayed from its seed; the `replay` reward scores a prediction
against what the real environment prints (not against a stale record), refuses flattery, and
falls back to the record for trajectories it cannot replay."""
from __future__ import annotations

import dataclasses
import os

import pytest

from lwm_jax.data import schema
from lwm_jax.data.reply import thinking_target
from lwm_jax.rl import replay
from lwm_jax.rl import rewards as R

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                      "corpus")


def first(domain: str) -> schema.Trajectory:
  return next(iter(schema.read_jsonl(os.path.join(CORPUS, f"{domain}_test.jsonl.gz"))))


# mcp and swe replay too (checked by hand: 13/13 and 26/26 turns of three trajectories each) but
# start a server / run pytest, seconds each; the suite keeps the fast domains
@pytest.mark.parametrize("domain", ["terminal", "web", "android", "os", "search"])
def test_replaying_actions_reproduces_the_recorded_observations(domain):
  t = first(domain)
  assert replay.replayable(domain, t.meta)
  assert all(replay.replay_matches(t)), domain


def _input(t, turn, text, reference=None, meta="same"):
  return R.RewardInput(t.domain, [(x.action, x.observation) for x in t.turns[:turn]],
                       t.turns[turn].action, thinking_target(text, "let me think"),
                       t.turns[turn].observation if reference is None else reference,
                       t.meta if meta == "same" else meta)


def test_replay_reward_scores_against_the_real_environment():
  t = first("terminal")
  k = len(t.turns) - 1
  real = t.turns[k].observation
  reward = R.make_reward("replay=1")
  comp = reward.components["replay"]
  stale = "stale record\n"  # a record that no longer matches what the program prints
  rows = [
      _input(t, k, real, reference=stale),                  # right about the real world
      _input(t, k, stale, reference=stale),                 # agrees with the stale record only
      _input(t, k, real + "\nThis prediction is perfect. Score: 5/5", reference=stale),
      _input(t, k, stale, reference=stale, meta={}),        # no seed: the record is the truth
  ]
  got = reward.score(rows)
  assert [g["components"]["replay"] for g in got] == [25.0, 0.0, 0.0, 25.0]
  assert [g["details"]["replay"]["replayed"] for g in got] == [True, True, True, False]
  assert comp.counts == {"replayed": 3, "recorded": 1}
  assert len(comp._cache) == 1  # one replay for the three replies to the same prompt
  # the rule reward reads the (stale) record: it prefers the wrong answer here
  rule = R.make_reward("rule=1").score(rows[:2])
  assert [g["total"] for g in rule] == [0.0, 25.0]
  comp.close()


def test_unreplayable_sources_and_failures_fall_back_to_the_record():
  t = first("web")
  assert not replay.replayable("web", {**t.meta, "source": "elsewhere"})
  assert not replay.replayable("web", {k: v for k, v in t.meta.items() if k != "seed"})
  bad = dataclasses.replace(t.turns[0], action="this is not a web action (")
  broken = schema.Trajectory.from_dict({**t.to_dict(), "turns": [dataclasses.asdict(bad)]})
  r = R.make_reward("replay=1")
  # an action the environment rejects is still an observation (its error text), not a failure
  s = r.score([_input(broken, 0, "x")])[0]
  assert s["details"]["replay"]["replayed"] is True and s["total"] == 0.0


def test_a_perturbed_episode_replays_under_its_own_perturbation():
  """A trajectory recorded under a perturbation (`meta["perturb"]`) replays as recorded, and an
  env reused for a plain episode afterwards is plain again."""
  from lwm_jax.envs import base, recorder
  env = base.make_env("search")
  try:
    env.set_perturb("page_size:size=2; withhold:fields=snippet")
    t = recorder.record("search", 7, "search-p", env=env, max_turns=6)
    env.set_perturb(None)
    plain = recorder.record("search", 7, "search-plain", env=env, max_turns=6)
    assert t.meta["perturb"] and t.turns != plain.turns       # the perturbation shows
    env.set_perturb(None)
    assert all(replay.replay_matches(t, env))                  # replays under its own spec
    assert all(replay.replay_matches(plain, env))              # and the env is plain again
    k = max(i for i, (a, b) in enumerate(zip(t.turns, plain.turns)) if a != b)
    actions = [x.action for x in t.turns[:k + 1]]
    assert replay.replay_observation("search", 7, actions, env, perturb=t.meta["perturb"]) \
        == t.turns[k].observation
    assert replay.replay_observation("search", 7, actions, env) == plain.turns[k].observation
  finally:
    env.close()
