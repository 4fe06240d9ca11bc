"""Judge-free text similarity between a predicted and a real observation: exact match after
normalising line ends, token F1 over words, and edit similarity (1 - Levenshtein distance / the
longer length). A leaf module:
evaluation (`eval/metrics.py`, the free-running and fidelity reports) and RL (`rl/rewards.py`,
`rl/heldout.py`) both score with it.

Judge-free metrics compare a prediction with the ground truth:
- exact match after normalising line ends, trailing spaces on each line and blank lines around;
- token F1 over lowercased word tokens (`\\w+`) counted as multisets (both empty -> 1);
- edit similarity 1 - levenshtein / max(len): exact Levenshtein with the bit-parallel algorithm of
  Myers/Hyyrö (Python big ints as bit vectors: about len(a) big-int steps, ~0.1 s for two 10k-char
  strings). Past `EDIT_CAP` characters the distance is the exact distance of the prefixes plus the
  longer remaining tail (an upper bound), so the similarity there is a lower bound.
"""
from __future__ import annotations

import collections
import re

EDIT_CAP = 20_000


def normalise(text: str) -> str:
  lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
  return "\n".join(lines).strip("\n")


def exact_match(pred: str, truth: str) -> float:
  return float(normalise(pred) == normalise(truth))


_WORD_RE = re.compile(r"\w+")


def token_f1(pred: str, truth: str) -> float:
  p = collections.Counter(_WORD_RE.findall(pred.lower()))
  t = collections.Counter(_WORD_RE.findall(truth.lower()))
  if not p and not t:
    return 1.0
  common = sum((p & t).values())
  if common == 0:
    return 0.0
  precision = common / sum(p.values())
  recall = common / sum(t.values())
  return 2 * precision * recall / (precision + recall)


def levenshtein(a: str, b: str) -> int:
  """Exact edit distance (unit insert/delete/substitute), bit-parallel over the shorter string."""
  if a == b:
    return 0
  # Common prefix and suffix cost nothing and are often long (a copied observation).
  n = 0
  while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
  a, b = a[n:], b[n:]
  n = 0
  while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
    n += 1
  if n:
    a, b = a[:-n], b[:-n]
  if len(a) < len(b):
    a, b = b, a
  m = len(b)
  if m == 0:
    return len(a)
  peq: dict[str, int] = {}
  for i, ch in enumerate(b):
    peq[ch] = peq.get(ch, 0) | (1 << i)
  mask = (1 << m) - 1
  high = 1 << (m - 1)
  pv, mv, dist = mask, 0, m
  for ch in a:
    eq = peq.get(ch, 0)
    xv = eq | mv
    xh = ((((eq & pv) + pv) & mask) ^ pv) | eq
    ph = (mv | ~(xh | pv)) & mask
    mh = pv & xh
    if ph & high:
      dist += 1
    elif mh & high:
      dist -= 1
    ph = ((ph << 1) | 1) & mask
    mh = (mh << 1) & mask
    pv = (mh | ~(xv | ph)) & mask
    mv = ph & xv
  return dist


def edit_similarity(pred: str, truth: str, cap: int = EDIT_CAP) -> float:
  """1 - levenshtein / max length, in [0, 1]; both empty -> 1. See the module note on `cap`."""
  longest = max(len(pred), len(truth))
  if longest == 0:
    return 1.0
  dist = levenshtein(pred[:cap], truth[:cap])
  dist += max(len(pred[cap:]), len(truth[cap:]))
  return 1.0 - dist / longest


FREE_METRICS = {"exact": exact_match, "token_f1": token_f1, "edit_sim": edit_similarity}


def free_metrics(pred: str, truth: str) -> dict[str, float]:
  return {k: fn(pred, truth) for k, fn in FREE_METRICS.items()}
