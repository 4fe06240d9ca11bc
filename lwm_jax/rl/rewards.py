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
  (`lwm_jax.sampling.backends`): 5 x the mean of the valid 1-5 dimensions, 5-25 (the sum of the
  five when all are valid; a partial judgement follows the evaluation's rule and is counted as
  partial). A judge call that fails, a reply that cannot be parsed or that the judge's token
  limit cut off is asked again up to `tries` times; after that the judgement is INVALID, never
  0: the score carries `valid=False` and the failure kind (`error`, `unparseable`,
  `truncated`), and RL leaves the reply out of its group's advantages (see docs/recipe.md). The
  judge sees the parsed, sanitized prediction and the reference under the same transformation;
  the policy's thinking never reaches it.
- `reference`: judge-free similarity of the sanitized prediction to the reference, 25 x the mean
  of token F1 and edit similarity (or either alone), for runs without a judge model.
- `replay` (`lwm_jax.rl.replay`, registered when that module is imported, as the RL stage does):
  the prediction against what the bundled real environment prints when the trajectory's actions
  are replayed from its seed.

Each component scores the sanitized prediction. A prediction holding self-praise or text
addressed to a grader (`meta`, `lwm_jax.rl.guard`) earns 0 from every component; text outside the
domain's content (`foreign`, e.g. prose after a JSON result) is stripped and the rest scored
(`flagged="strip"`, the default) or earns 0 (`flagged="zero"`); the rule reward fails on either.
A line the real observation itself holds is real content, never flagged (a prediction that
copies the reference is never penalised for what the environment printed).

The mix `r = sum_k w_k r_k` runs over the components that apply to the input: the rule reward
does not apply to search (no deterministic part, no verifier), so `rubric=0.9,rule=0.1` gives
`r = rubric` there (the weights are renormalised over the components that apply). A mix whose
applicable, weighted component is invalid is invalid as a whole (`valid: False`, total NaN).
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
  """A component's score: `valid=False` marks a judgement that failed (excluded, never 0);
  `applies=False` a component with nothing to check for this input (the rule on search)."""
  value: float
  details: dict[str, Any] = dataclasses.field(default_factory=dict)
  valid: bool = True
  applies: bool = True


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


def prediction_of(domain: str, reply: str, reference: str | None = None
                  ) -> tuple[str, guard.Classified]:
  """The sanitized prediction in a reply (reasoning removed, last complete block) and its regions;
  with the `reference`, text the real observation holds is never flagged."""
  allow = guard.real_texts(reference) if reference is not None else frozenset()
  return guard.sanitize(domain, parse_prediction(reply), allow)


def reference_of(domain: str, reference: str) -> str:
  """The reference under the transformation its prediction gets (header removed, all of its own
  text allowed): what every component compares a prediction with."""
  return guard.sanitize(domain, reference, guard.real_texts(reference))[0]


def _self_praise(c: guard.Classified) -> bool:
  return c.count("meta") > 0


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
  pred, c = prediction_of(domain, reply, reference)
  out: dict[str, Any] = {"parses": reply_parses(reply), "clean": c.ok,
                         "flagged": len(c.flagged)}
  kind = guard.content_of(domain)
  ref_body = reference_of(domain, reference)
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
      # search has no deterministic part and no verifier: the rule does not apply (r = rubric)
      applies = guard.content_of(x.domain) in guard.DETERMINISTIC
      out.append(Score(MAX_REWARD if d["passed"] else 0.0, d, applies=applies))
    return out


# --------------------------------------------------------------------------------- reference

SIMILARITIES = ("mean", "token_f1", "edit_sim")
FLAGGED = ("strip", "zero")


def _check_flagged(mode: str) -> str:
  if mode not in FLAGGED:
    raise ValueError(f"reward.flagged: '{mode}' is not one of {', '.join(FLAGGED)}")
  return mode


def _flag_zero(c: guard.Classified, mode: str) -> bool:
  """Whether a prediction earns 0: self-praise always; foreign text only in "zero" mode."""
  return _self_praise(c) or (bool(c.flagged) and mode == "zero")


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
      pred, c = prediction_of(x.domain, x.reply, x.reference)
      pred = textsim.normalise(pred)
      ref = textsim.normalise(reference_of(x.domain, x.reference))
      f1, es = textsim.token_f1(pred, ref), textsim.edit_similarity(pred, ref)
      sim = {"mean": (f1 + es) / 2, "token_f1": f1, "edit_sim": es}[self.similarity]
      value = 0.0 if _flag_zero(c, self.flagged) else MAX_REWARD * sim
      out.append(Score(value, {"token_f1": f1, "edit_sim": es, "flagged": len(c.flagged),
                               "self_praise": _self_praise(c)}))
    return out


# ------------------------------------------------------------------------------------ rubric


@register("rubric")
class RubricReward(Reward):
  """The judge's 5-25 score (5 x the mean of the valid dimensions); invalid when the judge fails.

  `backend` is any `lwm_jax.sampling.backends.Backend`; `style` a `lwm_jax.judge.JudgeStyle`
  (default: our rubric). A call that raises, a reply that gives no valid dimension or one cut off
  by the judge's token limit is asked again, up to `tries` calls in all; then the score is
  invalid (`valid=False`, `details["failure"]` = error | unparseable | truncated). A reply with
  some but not all dimensions valid is partial (`details["partial"]`). A self-praising prediction
  earns 0 without a judge call.
  """

  def __init__(self, backend: Any = None, style: judge_lib.JudgeStyle | None = None,
               tries: int = 3, flagged: str = "strip", **_: Any):
    if backend is None:
      raise ValueError("reward 'rubric' needs a judge backend (an OpenAI-compatible endpoint or a "
                       "local checkpoint); use 'reference' for runs without a judge")
    if int(tries) < 1:
      raise ValueError(f"reward 'rubric': tries must be >= 1, got {tries}")
    self.backend, self.style, self.tries = backend, style or judge_lib.rubric_style(), int(tries)
    self.flagged = _check_flagged(flagged)

  def score(self, inputs: Sequence[RewardInput]) -> list[Score]:
    preds = [prediction_of(x.domain, x.reply, x.reference) for x in inputs]
    results: list[Score | None] = [None] * len(inputs)
    todo = []
    for i, (x, (_, c)) in enumerate(zip(inputs, preds)):
      if _flag_zero(c, self.flagged):  # self-praise (or foreign text in "zero" mode) earns 0
        results[i] = Score(0.0, {"flagged": len(c.flagged), "self_praise": _self_praise(c),
                                 "attempts": 0})
      else:
        todo.append(i)
    convs = {i: self.style.messages(inputs[i].domain, list(inputs[i].context), inputs[i].action,
                                    preds[i][0], reference_of(inputs[i].domain,
                                                              inputs[i].reference))
             for i in todo}
    last: dict[int, dict[str, Any]] = {}
    truncated: dict[int, int] = {i: 0 for i in todo}
    for attempt in range(self.tries):
      retry = []
      for j, res in self.backend.complete_many([convs[i] for i in todo]):
        i = todo[j]
        if isinstance(res, Exception):
          last[i] = {"failure": "error", "error": f"{type(res).__name__}: {res}"}
          retry.append(i)
          continue
        cut = getattr(res, "finish_reason", None) == "length"
        truncated[i] += int(cut)
        parsed = self.style.parse(res.text)
        scores = parsed["scores"] if parsed else None
        value = judge_lib.rubric_reward(scores) if self.style.usable(parsed) else None
        if value is None:
          last[i] = {"failure": "truncated" if cut else "unparseable", "scores": scores}
          retry.append(i)
          continue
        n_valid = judge_lib.valid_dimensions(scores)
        results[i] = Score(value, {"scores": scores, "flagged": len(preds[i][1].flagged),
                                   "attempts": attempt + 1, "partial": n_valid < 5,
                                   "valid_dimensions": n_valid, "truncated": truncated[i]})
      todo = sorted(retry)
      if not todo:
        break
    for i in todo:
      results[i] = Score(0.0, dict(last.get(i, {"failure": "error", "error": "no reply"}),
                                   attempts=self.tries, truncated=truncated.get(i, 0)),
                         valid=False)
    return [r if r is not None else Score(0.0, {"failure": "error", "error": "no reply"},
                                          valid=False) for r in results]


# ---------------------------------------------------------------------------------------- mix


class MixedReward:
  """`r = sum_k w_k r_k` over the named components that apply to an input, renormalised to the
  whole weight (the rule does not apply to search: there `rubric=0.9,rule=0.1` is `r = rubric`).

  `score` returns per input `{"total", "valid", "components": {name: value}, "applied": [names],
  "failures": {name: failure kind}, "details": {name: details}}`; an invalid applicable
  component (a failed judgement) makes the input invalid: `valid` False and `total` NaN, to be
  excluded, never scored."""

  def __init__(self, weights: Mapping[str, float], components: Mapping[str, Reward]):
    self.weights = {k: float(v) for k, v in weights.items() if float(v) != 0.0}
    self.components = {k: components[k] for k in self.weights}

  def score(self, inputs: Sequence[RewardInput]) -> list[dict[str, Any]]:
    per = {k: c.score(inputs) for k, c in self.components.items()}
    whole = sum(self.weights.values())
    out = []
    for i in range(len(inputs)):
      got = {k: per[k][i] for k in self.components}
      applied = [k for k, s in got.items() if s.applies] or list(got)
      failures = {k: got[k].details.get("failure", "invalid") for k in applied
                  if not got[k].valid}
      w_applied = sum(self.weights[k] for k in applied)
      if failures:
        total = float("nan")
      else:
        total = sum(self.weights[k] * got[k].value for k in applied) * (whole / w_applied)
      out.append({"total": total, "valid": not failures,
                  "components": {k: (s.value if s.valid else float("nan"))
                                 for k, s in got.items()},
                  "applied": applied, "failures": failures,
                  "details": {k: s.details for k, s in got.items()}})
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
