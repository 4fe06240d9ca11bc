"""Information-theoretic loss masking for CPT (docs/recipe.md, "CPT loss masking").

Each turn is classified from word-set statistics of its action and observation. Turns whose
observation mostly repeats the action (echo, boilerplate) are rarely kept for the loss; turns that
bring new information (retrieval, expansion, action results) always are. A masked turn stays in the
context: only its tokens leave the loss. The keep decision is a deterministic hash of
(trajectory id, turn index, seed), so every worker and every restart agrees.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import re

_WORD_RE = re.compile(r"[a-z0-9_]+")
# CJK unified ideographs (+ extension A), compatibility ideographs, kana and hangul syllables.
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


class TurnClass(str, enum.Enum):
  RETRIEVAL = "retrieval"
  EXPANSION = "expansion"
  ACTION = "action"
  TRANSFORM = "transform"
  BOILERPLATE = "boilerplate"
  ECHO = "echo"
  OTHER = "other"


KEEP_RATIO: dict[TurnClass, float] = {
    TurnClass.ECHO: 0.05,
    TurnClass.BOILERPLATE: 0.10,
    TurnClass.EXPANSION: 1.0,
    TurnClass.RETRIEVAL: 1.0,
    TurnClass.ACTION: 1.0,
    TurnClass.TRANSFORM: 0.5,
    TurnClass.OTHER: 1.0,
}


@dataclasses.dataclass(frozen=True)
class TurnStats:
  ol: float   # share of action words that reappear in the observation
  nov: float  # share of observation words absent from the action
  jac: float  # Jaccard similarity of the two word sets (logged only)
  r: float    # len(observation) / len(action) in characters; inf for an empty action


def words(text: str) -> set[str]:
  """Lowercased, deduplicated word tokens: [a-z0-9_]+ runs plus each CJK character alone."""
  low = text.lower()
  return set(_WORD_RE.findall(low)) | set(_CJK_RE.findall(low))


def turn_stats(action: str, observation: str) -> TurnStats:
  w_act, w_obs = words(action), words(observation)
  inter = len(w_act & w_obs)
  union = len(w_act | w_obs)
  ol = inter / len(w_act) if w_act else 0.0
  nov = len(w_obs - w_act) / len(w_obs) if w_obs else 0.0
  jac = inter / union if union else 0.0
  r = len(observation) / len(action) if action else math.inf
  return TurnStats(ol=ol, nov=nov, jac=jac, r=r)


def classify_stats(s: TurnStats, obs_len: int) -> TurnClass:
  """The turn-class table of docs/recipe.md, tried in order; first match wins."""
  if s.ol >= 0.7 and s.nov < 0.3:
    return TurnClass.ECHO
  if s.ol >= 0.5 and s.nov < 0.5:
    return TurnClass.BOILERPLATE
  if s.ol >= 0.5 and s.nov >= 0.5 and s.r > 1.5:
    return TurnClass.EXPANSION
  if s.nov >= 0.6 and s.r > 1:
    return TurnClass.RETRIEVAL
  if s.nov >= 0.5 and (s.r <= 1 or obs_len <= 64):
    return TurnClass.ACTION
  if s.nov < 0.5 and s.r < 1:
    return TurnClass.TRANSFORM
  return TurnClass.OTHER


def classify_turn(action: str, observation: str) -> TurnClass:
  """Class of one turn; an observation without a single word (empty, whitespace or punctuation
  only: an empty word set) is `action`, kept at 100% (docs/recipe.md)."""
  if not words(observation):
    return TurnClass.ACTION
  return classify_stats(turn_stats(action, observation), len(observation))


def keep_probability(action: str, observation: str) -> float:
  return KEEP_RATIO[classify_turn(action, observation)]


def uniform_hash(traj_id: str, turn_index: int, seed: int) -> float:
  """A number in [0, 1) fixed by (trajectory id, turn index, seed), the same in every process."""
  h = hashlib.blake2b(f"{seed}\x1f{traj_id}\x1f{turn_index}".encode("utf-8"), digest_size=8)
  return int.from_bytes(h.digest(), "big") / 2.0**64


def keep_turn(traj_id: str, turn_index: int, action: str, observation: str, seed: int = 0) -> bool:
  """Whether turn `turn_index` (0-based) of trajectory `traj_id` counts in the CPT loss."""
  p = keep_probability(action, observation)
  return p >= 1.0 or uniform_hash(traj_id, turn_index, seed) < p
