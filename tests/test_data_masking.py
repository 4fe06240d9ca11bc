"""The CPT turn classes of docs/recipe.md: every rule, the rule-order collisions, empty sets,
keep determinism."""
import math
import os
import subprocess
import sys

import pytest

from lwm_jax.data.masking import (KEEP_RATIO, TurnClass, classify_stats, classify_turn, keep_turn,
                                  turn_stats, words)

C = TurnClass


def test_words_lowercase_dedup_and_cjk():
  assert words("Foo foo BAR_1 x-y") == {"foo", "bar_1", "x", "y"}
  assert words("查询北京 weather") == {"查", "询", "北", "京", "weather"}


def test_stats_hand_computed():
  s = turn_stats("get x", "x is big and old")  # act {get,x}, obs {x,is,big,and,old}
  assert (s.ol, s.nov) == (0.5, 0.8)
  assert s.jac == pytest.approx(1 / 6)
  assert s.r == pytest.approx(16 / 5)


def test_empty_sets():
  s = turn_stats("", "")
  assert (s.ol, s.nov, s.jac) == (0.0, 0.0, 0.0) and math.isinf(s.r)
  s = turn_stats("", "hello world")  # empty action: OL 0, R inf, everything novel
  assert (s.ol, s.nov) == (0.0, 1.0) and math.isinf(s.r)
  assert classify_turn("", "hello world") == C.RETRIEVAL
  s = turn_stats("ls", "!!!")  # observation without words: Nov 0, R 1.5
  assert (s.ol, s.nov, s.r) == (0.0, 0.0, 1.5)
  # an empty word set is the `action` class whatever the characters (issue 21: the rules used to
  # class these as other / transform, and transform kept only half of them)
  assert classify_turn("ls", "!!!") == C.ACTION
  assert classify_turn("ls -la /tmp", "!!!") == C.ACTION
  assert classify_turn("--- ---", "...") == C.ACTION
  assert classify_turn("anything at all", "") == C.ACTION    # empty observation


@pytest.mark.parametrize("action,obs,expected", [
    # echo: OL 1, Nov 0
    ("ls foo bar", "ls foo bar", C.ECHO),
    # boilerplate: OL 1, Nov 1/3 (not < 0.3, so not echo)
    ("a b", "a b c", C.BOILERPLATE),
    # expansion: OL 0.5, Nov 0.8, R 3.2
    ("get x", "x is big and old", C.EXPANSION),
    # retrieval: OL 0, Nov 1, R 25/11
    ("search cats", "felines are small mammals", C.RETRIEVAL),
    # action via R <= 1: OL 0, Nov 1, R 8/31
    ("click the big submit button now", "ok saved", C.ACTION),
    # action via short observation: OL 3/8, Nov 4/7 (< 0.6), R 17/15 > 1, len 17 <= 64
    ("a b c d e f g h", "a b c n1 n2 n3 n4", C.ACTION),
    # transform: OL 2/6, Nov 0, R < 1
    ("alpha beta gamma delta epsilon zeta", "alpha beta", C.TRANSFORM),
    # other: OL 0.4, Nov 0, R > 1
    ("alpha beta gamma delta epsilon", "alpha beta alpha beta alpha beta alpha beta", C.OTHER),
])
def test_each_rule(action, obs, expected):
  assert classify_turn(action, obs) == expected


def test_other_when_long_observation_with_mid_novelty():
  # Nov 4/7 in [0.5, 0.6), R > 1, observation longer than 64 characters: no rule fires
  act = "a b c d e f g h" + " " * 60
  obs = "a b c nnnnnnnnnnnnnnnnnnnnn1 nnnnnnnnnnnnnnnnnnnnnnnn2 nnnnnnnnnnnnnnn3 nnnnnnnnnnnnnnn4"
  s = turn_stats(act, obs)
  assert 0.5 <= s.nov < 0.6 and s.ol < 0.5 and s.r > 1 and len(obs) > 64
  assert classify_turn(act, obs) == C.OTHER


class S:  # stats stand-in to probe the rule order directly
  def __init__(self, ol, nov, r):
    self.ol, self.nov, self.r = ol, nov, r


@pytest.mark.parametrize("ol,nov,r,obs_len,expected", [
    (0.9, 0.1, 0.5, 100, C.ECHO),         # echo also matches boilerplate and transform
    (0.6, 0.4, 0.5, 100, C.BOILERPLATE),  # boilerplate also matches transform
    (0.7, 0.29, 2.0, 10, C.ECHO),         # boundary: OL = 0.7 is echo
    (0.7, 0.3, 2.0, 10, C.BOILERPLATE),   # boundary: Nov = 0.3 is not echo
    (0.5, 0.7, 2.0, 10, C.EXPANSION),     # expansion also matches retrieval and action
    (0.5, 0.7, 1.5, 10, C.RETRIEVAL),     # R = 1.5 is not expansion; retrieval before action
    (0.2, 0.6, 1.2, 10, C.RETRIEVAL),     # retrieval also matches action (short observation)
    (0.5, 0.5, 1.0, 10, C.ACTION),        # R = 1: not expansion/retrieval; action
    (0.2, 0.5, 0.9, 500, C.ACTION),       # action via R <= 1 with a long observation
    (0.2, 0.59, 1.2, 65, C.OTHER),        # action needs len <= 64 when R > 1
    (0.2, 0.49, 0.99, 10, C.TRANSFORM),
    (0.2, 0.49, 1.0, 10, C.OTHER),        # transform needs R < 1
])
def test_rule_order_and_boundaries(ol, nov, r, obs_len, expected):
  assert classify_stats(S(ol, nov, r), obs_len) == expected


def test_keep_ratios_table():
  assert KEEP_RATIO == {C.ECHO: 0.05, C.BOILERPLATE: 0.1, C.EXPANSION: 1.0, C.RETRIEVAL: 1.0,
                        C.ACTION: 1.0, C.TRANSFORM: 0.5, C.OTHER: 1.0}


def test_keep_turn_deterministic_and_rate():
  kept = [keep_turn(f"traj-{i}", 3, "ls foo", "ls foo", seed=7) for i in range(4000)]
  assert kept == [keep_turn(f"traj-{i}", 3, "ls foo", "ls foo", seed=7) for i in range(4000)]
  assert 0.035 < sum(kept) / 4000 < 0.065  # echo keeps 5%
  other_seed = [keep_turn(f"traj-{i}", 3, "ls foo", "ls foo", seed=8) for i in range(4000)]
  assert kept != other_seed
  assert all(keep_turn(f"t{i}", 0, "search cats", "felines are small mammals") for i in range(50))


def test_keep_turn_same_in_another_process():
  code = ("from lwm_jax.data.masking import keep_turn;"
          "print(''.join('1' if keep_turn(f'id{i}', i % 5, 'a b', 'a b c', 3) else '0' "
          "for i in range(300)))")
  env = {**os.environ, "PYTHONHASHSEED": "123"}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       check=True, cwd=os.path.dirname(os.path.dirname(__file__))).stdout.strip()
  here = "".join("1" if keep_turn(f"id{i}", i % 5, "a b", "a b c", 3) else "0" for i in range(300))
  assert out == here and 0 < here.count("1") < 100


@pytest.mark.parametrize("obs", ["\n", "   ", "\n\n\t \n", "\r\n"])
def test_whitespace_only_observation_is_action(obs):
  # No word at all, only whitespace: the same as an empty observation, kept at 100%.
  assert classify_turn("cat notes.txt", obs) == C.ACTION
  assert classify_turn("", obs) == C.ACTION
  assert KEEP_RATIO[classify_turn("ls -la /tmp", obs)] == 1.0
  assert all(keep_turn("t", k, "ls -la /tmp", obs) for k in range(50))
