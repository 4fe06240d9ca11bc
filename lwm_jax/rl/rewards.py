"""Rewards for world-model RL: a registry of components mixed by configured weights.

Every component scores a batch of `RewardInput`s (domain, history, action, the policy's whole
reply, the real observation) and returns one `Score` per input: a value on the 0-25 scale and
details for the logs. `make_reward({"rubric": 0.9, "rule": 0.1}, ...)` builds the mix
`r = sum_k w_k r_k` (the paper's mix; see docs/recipe.md).

Components:

- `rule`: deterministic verifiers, binary, 25 when every check passes and 0 otherwise:
  1. the reply parses: outside its reasoning, it holds exactly one complete
     `<predicted_observation>` block and nothing else;
  2. the observation is clean: no foreign or meta region (see `lwm_jax.rl.guard`);
  3. it has the domain's form: mcp -> valid JSON of a tool result's shape (an object or array;
     an `{"error": {"code", "message"}}` or `{"isError": true, "content": ...}` failure);
     android, web, os -> it parses as a UI tree; terminal, swe, search -> any non-empty text
     (an empty output is right when the reference is empty too);
  4. the deterministic part matches the reference where there is one: terminal and swe -> the
     whole output, line by line, after masking volatile spans (timestamps, clock times,
     durations, long hex ids); mcp -> success or failure agrees (and the error code), and the
     JSON has the reference's shape (object keys, value types, recursively); android, web, os
     -> the header line (page, window or screen) after masking volatile spans; search -> no
     deterministic part (results of a live engine).
- `rubric`: the five-dimension judge (`lwm_jax.judge`) through any backend
  (`lwm_jax.sampling.backends`): the sum of the five 1-5 scores, 5-25, and 0 when the judge's
  reply cannot be parsed or the backend fails. The judge sees the parsed, sanitized prediction
  only: the policy's thinking never reaches it.
- `reference`: judge-free similarity of the sanitized prediction to the reference, 25 x the mean
  of token F1 and edit similarity (or either alone), for runs without a judge model.
- `replay` (`lwm_jax.rl.replay`, registered when that module is imported, as the RL stage does):
  the prediction against what the bundled real environment prints when the trajectory's actions
  are replayed from its seed.

Each component scores the sanitized prediction, so text added to sway a grader earns nothing
(`flagged="strip"`, the default: the rest is scored on its merits); with `flagged="zero"` the
reference and rubric rewards give 0 to a prediction holding any foreign or meta text, as the rule
reward always does.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Mapping, Sequence

from lwm_jax import judge as judge_lib
from lwm_jax.data.reply import OBS_CLOSE, OBS_OPEN, parse_prediction, strip_reasoning
from lwm_jax import textsim
from lwm_jax.rl import guard

MAX_REWARD = 25.0


@dataclasses.dataclass
class RewardInput:
  domain: str
  context: Sequence[tuple[str, str]]  # earlier (action, observation) pairs
  action: str
  reply: str                          # the policy's whole reply (thinking included)
  reference: str                      # the real observation
  meta: Mapping[str, Any] | None = None  # the trajectory's meta (the replay reward's seed)


@dataclasses.dataclass
class Score:
  value: float
  details: dict[str, Any] = dataclasses.field(default_factory=dict)


class Reward:
  """A component: `score(inputs) -> [Score]`, values on the 0-25 scale."""
  name = "reward"

  def score(self, inputs: Sequence[RewardInput]) -> list[Score]:
    raise NotImplementedError


REGISTRY: dict[str, Callable[..., Reward]] = {}


def register(name: str):
  def deco(cls):
    cls.name = name
    REGISTRY[name] = cls
    return cls
  return deco


def prediction_of(domain: str, reply: str) -> tuple[str, guard.Classified]:
  """The sanitized prediction in a reply (reasoning removed, last complete block) and its regions."""
  return guard.sanitize(domain, parse_prediction(reply))


# -------------------------------------------------------------------------------------- rule

_VOLATILE = [
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
     "<DATETIME>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), "<DATE>"),
    (re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s+(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|"
                r"Nov|Dec)\s+\d{1,2}\b"), "<DAY>"),
    (re.compile(r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?\b"), "<TIME>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds)\b"), "<DURATION>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
     "<UUID>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b", re.I), "<HEX>"),
]


def mask_volatile(text: str) -> str:
  """Text with volatile spans replaced by placeholders and lines normalised (trailing spaces,
  blank lines around)."""
  for rx, sub in _VOLATILE:
    text = rx.sub(sub, text)
  return textsim.normalise(text)


def reply_parses(reply: str) -> bool:
  """Outside its reasoning the reply is exactly one complete observation block."""
  content = strip_reasoning(reply or "")
  if content.count(OBS_OPEN) != 1 or content.count(OBS_CLOSE) != 1:
    return False
  start, end = content.find(OBS_OPEN), content.find(OBS_CLOSE)
  if end < start:
    return False
  return not content[:start].strip() and not content[end + len(OBS_CLOSE):].strip()


def _json_shape(v: Any) -> Any:
  if isinstance(v, dict):
    return {k: _json_shape(x) for k, x in v.items()}
  if isinstance(v, list):
    return ["list", _json_shape(v[0]) if v else None]
  if isinstance(v, bool):
    return "bool"
  if isinstance(v, (int, float)):
    return "number"
  if v is None:
    return "null"
  return "string"


def _same_shape(a: Any, b: Any) -> bool:
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same_shape(a[k], b[k]) for k in a)
  if isinstance(a, list) and isinstance(b, list):  # ["list", element shape or None]
    return a[1] is None or b[1] is None or _same_shape(a[1], b[1])
  if "null" in (a, b):  # a missing value may stand for any type
    return True
  return a == b


def tool_result_status(value: Any) -> tuple[str, Any] | None:
  """("ok", None), ("error", code) or ("tool_error", None) for a tool result of our MCP env's
  shape; None when the JSON is not a tool result (a bare scalar)."""
  if isinstance(value, dict):
    err = value.get("error")
    if isinstance(err, dict) and "code" in err and isinstance(err.get("message"), str):
      return "error", err.get("code")
    if value.get("isError") is True and "content" in value:
      return "tool_error", None
    return "ok", None
  if isinstance(value, list):
    return "ok", None
  return None


_BAD = object()


def _load_json(text: str) -> Any:
  try:
    return json.loads(text)
  except (json.JSONDecodeError, TypeError):
    return _BAD


def _header(text: str) -> str:
  lines = [ln for ln in text.strip("\n").split("\n") if ln.strip()]
  if lines and lines[0].startswith("Error: "):
    lines = lines[1:]
  return lines[0] if lines else ""


def rule_checks(domain: str, reply: str, reference: str) -> dict[str, Any]:
  """Each check of the rule reward (see the module docstring) and which deterministic part was
  compared; `passed` is their conjunction."""
  pred, c = prediction_of(domain, reply)
  out: dict[str, Any] = {"parses": reply_parses(reply), "clean": c.ok,
                         "flagged": len(c.flagged)}
  kind = guard.DOMAIN_CONTENT[domain]
  ref_body = guard.classify(domain, reference).clean
  if kind == "json":
    value = _load_json(pred)
    status = tool_result_status(value) if value is not _BAD else None
    out["form"] = status is not None
    ref_value = _load_json(ref_body)
    ref_status = tool_result_status(ref_value) if ref_value is not _BAD else None
    if ref_status is None:
      out["deterministic"], out["checked"] = None, "none (reference is not a tool result)"
    else:
      out["checked"] = "status and JSON shape"
      out["deterministic"] = bool(status == ref_status and _same_shape(
          _json_shape(value), _json_shape(ref_value)))
  elif kind == "tree":
    out["form"] = guard.parse_tree(pred) is not None
    out["checked"] = "header line"
    out["deterministic"] = mask_volatile(_header(pred)) == mask_volatile(_header(ref_body))
  elif kind == "output":
    out["form"] = True
    out["checked"] = "whole output, volatile spans masked"
    out["deterministic"] = mask_volatile(pred) == mask_volatile(ref_body)
  else:
    out["form"] = bool(pred.strip()) or not reference.strip()
    out["deterministic"], out["checked"] = None, "none (live results)"
  out["passed"] = bool(out["parses"] and out["clean"] and out["form"]
                       and out["deterministic"] is not False)
  return out


@register("rule")
class RuleReward(Reward):
  """Binary deterministic verifiers, 0 or 25 (see the module docstring)."""

  def __init__(self, **_: Any):
    pass

  def score(self, inputs: Sequence[RewardInput]) -> list[Score]:
    out = []
    for x in inputs:
      d = rule_checks(x.domain, x.reply, x.reference)
      out.append(Score(MAX_REWARD if d["passed"] else 0.0, d))
    return out


# --------------------------------------------------------------------------------- reference

SIMILARITIES = ("mean", "token_f1", "edit_sim")
FLAGGED = ("strip", "zero")


def _check_flagged(mode: str) -> str:
  if mode not in FLAGGED:
    raise ValueError(f"reward.flagged: '{mode}' is not one of {', '.join(FLAGGED)}")
  return mode


@register("reference")
class ReferenceReward(Reward):
  """25 x similarity of the sanitized prediction to the reference (no judge needed)."""

  def __init__(self, similarity: str = "mean", flagged: str = "strip", **_: Any):
    if similarity not in SIMILARITIES:
      raise ValueError(f"reward.similarity: '{similarity}' is not one of {', '.join(SIMILARITIES)}")
    self.similarity, self.flagged = similarity, _check_flagged(flagged)

  def score(self, inputs: Sequence[RewardInput]) -> list[Score]:
    out = []
    for x in inputs:
      pred, c = prediction_of(x.domain, x.reply)
      pred = textsim.normalise(pred)
      ref = textsim.normalise(guard.classify(x.domain, x.reference).clean)
      f1, es = textsim.token_f1(pred, ref), textsim.edit_similarity(pred, ref)
      sim = {"mean": (f1 + es) / 2, "token_f1": f1, "edit_sim": es}[self.similarity]
      value = 0.0 if c.flagged and self.flagged == "zero" else MAX_REWARD * sim
      out.append(Score(value, {"token_f1": f1, "edit_sim": es, "flagged": len(c.flagged)}))
    return out


# ------------------------------------------------------------------------------------ rubric


@register("rubric")
class RubricReward(Reward):
  """The judge's five scores summed (5-25); 0 when unparseable or the backend fails.

  `backend` is any `lwm_jax.sampling.backends.Backend`; `style` a `lwm_jax.judge.JudgeStyle`
  (default: our rubric). A reply that gives no usable scores is asked again up to `tries` times.
  """

  def __init__(self, backend: Any = None, style: judge_lib.JudgeStyle | None = None,
               tries: int = 2, flagged: str = "strip", **_: Any):
    if backend is None:
      raise ValueError("reward 'rubric' needs a judge backend (an OpenAI-compatible endpoint or a "
                       "local checkpoint); use 'reference' for runs without a judge")
    self.backend, self.style, self.tries = backend, style or judge_lib.rubric_style(), tries
    self.flagged = _check_flagged(flagged)

  def score(self, inputs: Sequence[RewardInput]) -> list[Score]:
    preds = [prediction_of(x.domain, x.reply) for x in inputs]
    convs = [self.style.messages(x.domain, list(x.context), x.action, p, x.reference)
             for x, (p, _) in zip(inputs, preds)]
    results: list[Score | None] = [None] * len(inputs)
    todo = list(range(len(inputs)))
    for attempt in range(max(1, self.tries)):
      retry = []
      for j, res in self.backend.complete_many([convs[i] for i in todo]):
        i = todo[j]
        if isinstance(res, Exception):
          results[i] = Score(0.0, {"error": f"{type(res).__name__}: {res}"})
          continue
        parsed = self.style.parse(res.text)
        scores = parsed["scores"] if parsed else None
        value = judge_lib.rubric_reward(scores)
        if preds[i][1].flagged and self.flagged == "zero":
          value = 0.0
        results[i] = Score(value, {"scores": scores, "flagged": len(preds[i][1].flagged),
                                   "attempts": attempt + 1})
        if not self.style.usable(parsed):
          retry.append(i)
      todo = retry
      if not todo:
        break
    return [r if r is not None else Score(0.0, {"error": "no reply"}) for r in results]


# ---------------------------------------------------------------------------------------- mix


class MixedReward:
  """`r = sum_k w_k r_k` over named components; `score` returns per-input
  `{"total", "components": {name: value}, "details": {name: details}}`."""

  def __init__(self, weights: Mapping[str, float], components: Mapping[str, Reward]):
    self.weights = {k: float(v) for k, v in weights.items() if float(v) != 0.0}
    self.components = {k: components[k] for k in self.weights}

  def score(self, inputs: Sequence[RewardInput]) -> list[dict[str, Any]]:
    per = {k: c.score(inputs) for k, c in self.components.items()}
    out = []
    for i in range(len(inputs)):
      comps = {k: per[k][i].value for k in self.components}
      out.append({"total": sum(self.weights[k] * v for k, v in comps.items()),
                  "components": comps, "details": {k: per[k][i].details for k in per}})
    return out


def parse_weights(spec: str | Mapping[str, float]) -> dict[str, float]:
  """`"rubric=0.9,rule=0.1"` (or a mapping) -> weights; unknown names are an error."""
  if isinstance(spec, Mapping):
    weights = {str(k): float(v) for k, v in spec.items()}
  else:
    weights = {}
    for part in str(spec).split(","):
      if not part.strip():
        continue
      name, sep, w = part.partition("=")
      if not sep:
        raise ValueError(f"reward weights: '{part}' is not NAME=WEIGHT")
      try:
        weights[name.strip()] = float(w)
      except ValueError:
        raise ValueError(f"reward weights: '{part}': weight is not a number") from None
  unknown = sorted(set(weights) - set(REGISTRY))
  if unknown:
    raise ValueError(f"reward weights: unknown reward(s) {', '.join(unknown)} "
                     f"(known: {', '.join(sorted(REGISTRY))})")
  if not any(weights.values()):
    raise ValueError("reward weights: at least one reward needs a non-zero weight")
  return weights


def make_reward(weights: str | Mapping[str, float], **options: Any) -> MixedReward:
  """The configured mix; `options` go to every component (e.g. `backend=`, `style=` for the
  rubric, `similarity=` for the reference reward)."""
  w = parse_weights(weights)
  comps = {k: REGISTRY[k](**options) for k, v in w.items() if v}
  return MixedReward(w, comps)
