"""Fidelity by kind of turn: where a world model's predictions go wrong in ways an agent trained
inside it would learn from, measured per domain beside the baselines.

The free-running report (`eval/free_running.py`) gives one similarity per domain. An agent in a
simulator trips on particular kinds of turn, which that average hides. This module looks at each
held-out turn and its prediction for:

  loop         the prediction ends in (or holds) a run of one n-gram repeated many times
               (`loop_run`): generation that repeats itself until the token limit.
  header leak  the prediction holds pieces of the chat rendering around observations (the
               benchmark's observation and action headers, our reply tags, the chat markers) or
               a section heading of our system-prompt templates (`header_leak`): text of the
               prompt, not of the environment.
  GUI screen   for domains whose record names a `screen` reader (android, os, web): which screen
               or window the observation shows (its title, as the environment renders it). A
               prediction is on the right screen when its reader gives the truth's title;
               a transition is a turn whose true screen differs from the screen before it.

  error        on turns whose real step carries the environment's own report (`Turn.env`,
               kept by the recorder since environment version 3): the truth is the error the
               environment reported (an exit status, a JSON-RPC error, a refused action, an
               HTTP error); the prediction is read by the domain's `error` rule (the text
               an error shows). Recall: error turns whose prediction shows an error; precision:
               predictions showing an error on a turn that had one. The rule's agreement with
               the signal on the real observations themselves is reported beside them: it is
               the floor of what the reading can tell.
  state change on turns whose record says whether the step changed the world's state (files,
               rows, app data): token F1 of the prediction on state-changing turns and on
               read-only ones, apart.
  content      the words of the real observation that appear somewhere in the prompt (system
               prompt, history, action: copyable) and those that do not (world-specific: new
               log lines, counts, names the environment had to produce); the share of each that
               the prediction holds, and the share of the prediction's own words found in
               neither the prompt nor the truth (invented: products and people from other
               worlds, made-up log lines). Words are runs of letters, digits and underscores,
               compared as sets per turn.

The loop and leak rules are checked against every real observation of the bundled corpus (none
is a loop or a leak: tests/test_turn_kinds.py), so a flagged prediction is the model's doing.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

from lwm_jax import domains, textsim
from lwm_jax.data import prompts
from lwm_jax.data.bench_records import ENV_KEY, OBSERVATION_HEADER
from lwm_jax.eval import records
from lwm_jax.data.reply import OBS_CLOSE, OBS_OPEN, THINK_CLOSE, THINK_OPEN

# A loop: a unit of 1..LOOP_MAX_UNIT tokens, at least one of them a word, repeated back to back
# at least LOOP_TAIL_REPEATS times where the text ends (generation stopped inside it), or
# LOOP_ANY_REPEATS times anywhere.
LOOP_MAX_UNIT = 24
LOOP_TAIL_REPEATS = 6
LOOP_ANY_REPEATS = 16
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# The chat rendering around an observation: the benchmark's headers, our reply tags, the chat
# template's markers. Any of these inside an observation is prompt text.
_MARKERS = (OBSERVATION_HEADER, "**Action:**", THINK_OPEN, THINK_CLOSE, OBS_OPEN, OBS_CLOSE,
            "<|im_start|>", "<|im_end|>", "<|endoftext|>")
# Pieces of those headers as a model garbles them ("**Environment - Shop", "# Observation:**").
_FRAGMENTS = re.compile(r"\*\*Environment\b|\bObservation:\*\*|^#{1,6} ?Turn \d+\s*$|"
                        r"^#{1,6} ?(?:Environment )?Observation\b(?::\*\*)?", re.M)


def _heading_re() -> re.Pattern:
  titles = prompts.SECTION_TITLES
  alt = "|".join(re.escape(t) for t in titles)
  tags = "|".join(re.escape(t.lower().replace(" ", "_")) for t in titles)
  upper = "|".join(re.escape(t.upper()) for t in titles)
  # the markdown (## Task), xml (<task>), numbered (3. ACTION SPACE) layouts; the plain layout's
  # "Task:" is too common in real output to count alone
  return re.compile(rf"^(?:#{{1,6}} ?(?:{alt})\s*$|</?(?:{tags})>\s*$|\d+\. (?:{upper})\s*$)", re.M)


_HEADINGS = _heading_re()


def loop_run(text: str) -> tuple[int, int]:
  """(unit length, repeats) of the longest back-to-back repetition that makes `text` a loop, or
  (0, 0). See LOOP_* for the rule."""
  return _loop(text)[:2]


def cut_loop(text: str) -> str:
  """`text` with its loop (the run `loop_run` finds) cut to one copy of the repeated unit, and
  whatever followed the run dropped; `text` itself when it is no loop."""
  n, k, start, spans = _loop(text)
  if not k:
    return text
  return text[:spans[start + n - 1][1]]


def _loop(text: str) -> tuple[int, int, int, list[tuple[int, int]]]:
  """(unit length, repeats, first token of the run, token spans) of `loop_run`'s run."""
  found = list(_TOKEN_RE.finditer(text))
  toks = [m.group(0) for m in found]
  spans = [m.span() for m in found]
  n_tok = len(toks)
  best = (0, 0, 0)
  for n in range(1, min(LOOP_MAX_UNIT, n_tok // 2) + 1):
    i = 0
    while i + 2 * n <= n_tok:
      unit = toks[i:i + n]
      k = 1
      while toks[i + k * n:i + (k + 1) * n] == unit:
        k += 1
      if k > 1:
        rest = toks[i + k * n:]
        tail = len(rest) < n and rest == unit[:len(rest)]  # the text stops inside the run
        wordy = any(t[0].isalnum() or t[0] == "_" for t in unit)
        if wordy and (k >= LOOP_ANY_REPEATS or (tail and k >= LOOP_TAIL_REPEATS)):
          if k * n > best[0] * best[1]:
            best = (n, k, i)
        i += (k - 1) * n + 1
      else:
        i += 1
  return (*best, spans)


def is_loop(text: str) -> bool:
  return loop_run(text)[1] > 0


def header_leak(text: str) -> str:
  """The first piece of prompt or chat rendering found in `text` ("" when there is none)."""
  for m in _MARKERS:
    if m in text:
      return m
  hit = _FRAGMENTS.search(text) or _HEADINGS.search(text)
  return hit.group(0).strip() if hit else ""


def screen_reader(domain: str) -> Callable[[str], str | None] | None:
  """The domain's `screen(observation) -> title or None` reader, or None when it has none."""
  d = domains.get_domain(domain)
  return d.load("screen") if d.screen else None


@dataclasses.dataclass(frozen=True)
class Case:
  """What `turn_kinds` reads of one scored turn (free_running.Case has the same fields)."""
  key: str
  domain: str
  truth: str
  previous: str
  messages: tuple = ()           # the prompt: chat messages {"role", "content"} (for `content`)
  error: str | None = None       # the error the environment reported ("" none; None: not recorded)
  changed: bool | None = None    # whether the step changed the world's state (None: not recorded)


def case_of_record(rec: Any, key: str, truth: str) -> Case:
  """The `Case` of a benchmark record: its domain, the observation before the action, and the
  environment facts a record made from a recorded trajectory carries (`bench_records.ENV_KEY`)."""
  facts = rec.extra.get(ENV_KEY) if isinstance(rec.extra.get(ENV_KEY), dict) else {}
  return Case(key=key, domain=records.domain(rec), truth=truth,
              previous=records.previous_observation(rec), messages=tuple(rec.messages()),
              error=facts.get("error"), changed=facts.get("changed"))


def error_reader(domain: str) -> Callable[[str], str] | None:
  """The domain's `error(observation) -> str` rule, or None when it has none."""
  d = domains.get_domain(domain)
  return d.load("error") if d.error else None


def turn_kinds(cases: Sequence[Any], predictions: Mapping[str, str]) -> dict[str, Any]:
  """Per domain, for one system's predictions of `cases` (free_running.Case: key, domain, truth,
  previous, and the recorded `error` and `changed` facts, None where absent): turns, loops,
  header leaks; on turns with a recorded error fact, the error counts (`error_turns` with the
  fact, `errors` true errors, `errors_predicted`, `errors_found` both, `error_rule_agrees` the
  rule read the real observation as the fact says); on turns with a `changed` fact, the count
  and summed token F1 of state-changing and of read-only turns; on screen domains the
  screen-identity counts (GUI turns whose truth shows a screen, those the prediction shows the
  same screen on, and the same two over transitions)."""
  out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  readers: dict[str, Any] = {}
  for c in cases:
    pred = str(predictions[c.key])
    s = out[c.domain]
    s["turns"] += 1
    s["loops"] += is_loop(pred)
    s["header_leaks"] += bool(header_leak(pred))
    if getattr(c, "messages", ()):
      s.update(content_counts(c.messages, c.truth, pred))
    if c.domain not in readers:
      readers[c.domain] = (screen_reader(c.domain), error_reader(c.domain))
    read, read_error = readers[c.domain]
    fact = getattr(c, "error", None)
    if fact is not None and read_error is not None:
      shown = bool(read_error(pred))
      s["error_turns"] += 1
      s["errors"] += bool(fact)
      s["errors_predicted"] += shown
      s["errors_found"] += bool(fact) and shown
      s["error_rule_agrees"] += bool(read_error(c.truth)) == bool(fact)
    changed = getattr(c, "changed", None)
    if changed is not None:
      kind = "changing" if changed else "read_only"
      s[f"{kind}_turns"] += 1
      s[f"{kind}_f1_sum"] += textsim.token_f1(pred, c.truth)
    if read is None:
      continue
    truth = read(c.truth)
    if truth is None:
      continue
    right = read(pred) == truth
    s["screen_turns"] += 1
    s["screen_right"] += right
    if read(c.previous) != truth:
      s["transitions"] += 1
      s["transitions_right"] += right
  return {d: dict(v) for d, v in out.items()}


_WORD_RE = re.compile(r"\w+")


def content_counts(messages: Sequence[Mapping[str, Any]], truth: str, pred: str
                   ) -> dict[str, int]:
  """One turn's `content` counts (see the module docstring): distinct words of the truth that
  the prompt holds (`copyable`) and that it does not (`specific`), those of each the prediction
  holds (`copyable_found`, `specific_found`), the prediction's distinct words (`pred_words`) and
  those in neither the prompt nor the truth (`invented`)."""
  context = set(_WORD_RE.findall(" ".join(str(m.get("content", "")) for m in messages)))
  t, p = set(_WORD_RE.findall(truth)), set(_WORD_RE.findall(pred))
  return {"copyable": len(t & context), "copyable_found": len(t & context & p),
          "specific": len(t - context), "specific_found": len((t - context) & p),
          "pred_words": len(p), "invented": len(p - context - t)}


def rates(kinds: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, float | None]]:
  """Percentages of `turn_kinds`' counts: loops and leaks per turn, screens per screen turn,
  transitions per transition (None where there is nothing to divide by)."""
  def pct(a, b):
    return 100.0 * a / b if b else None
  return {d: {"loops": pct(k.get("loops", 0), k["turns"]),
              "header_leaks": pct(k.get("header_leaks", 0), k["turns"]),
              "error_recall": pct(k.get("errors_found", 0), k.get("errors", 0)),
              "error_precision": pct(k.get("errors_found", 0), k.get("errors_predicted", 0)),
              "error_rule_agrees": pct(k.get("error_rule_agrees", 0), k.get("error_turns", 0)),
              "copyable_found": pct(k.get("copyable_found", 0), k.get("copyable", 0)),
              "specific_found": pct(k.get("specific_found", 0), k.get("specific", 0)),
              "invented": pct(k.get("invented", 0), k.get("pred_words", 0)),
              "changing_f1": pct(k.get("changing_f1_sum", 0), k.get("changing_turns", 0)),
              "read_only_f1": pct(k.get("read_only_f1_sum", 0), k.get("read_only_turns", 0)),
              "screen_right": pct(k.get("screen_right", 0), k.get("screen_turns", 0)),
              "transitions_right": pct(k.get("transitions_right", 0), k.get("transitions", 0))}
          for d, k in kinds.items()}


def flagged_real(observations: Iterable[tuple[str, str]]) -> list[tuple[str, str, str]]:
  """(where, kind, what) for each real observation the loop or leak rule flags; `observations`
  are (where, text) pairs. Used to check the rules against real output."""
  bad = []
  for where, text in observations:
    n, k = loop_run(text)
    if k:
      bad.append((where, "loop", f"{k} x {n} tokens"))
    leak = header_leak(text)
    if leak:
      bad.append((where, "header_leak", leak))
  return bad


def _display(domain: str) -> str:
  return domains.get_domain(domain).display if domains.is_domain(domain) else domain


def markdown(res: Mapping[str, Any]) -> list[str]:
  """The report's section "By kind of turn" (lines), from `res["systems"][name]["kinds"]` and
  `res["domains"]` (the free-running results and the benchmark scores share that shape): loops and
  header leaks per turn, the right screen over all turns and over transitions on screen domains,
  and on turns with recorded facts the error and state-change tables; nothing without kinds."""
  systems = {n: e["kinds"] for n, e in res["systems"].items() if e.get("kinds")}
  if not systems:
    return []
  doms = res["domains"]
  lines = ["", "## By kind of turn", "",
           "Loops: the prediction repeats one n-gram back to back until it stops (or 16 times "
           "anywhere). Header leaks: it holds the chat rendering or a system-prompt heading. "
           "Right screen: on screen domains, the prediction shows the screen or window the real "
           "one shows; transitions are the turns whose real screen differs from the one before. "
           "Percent (count of all).", ""]
  def cell(k, num, den):
    return f"{100.0 * k.get(num, 0) / k[den]:.1f} ({k.get(num, 0)}/{k[den]})" if k.get(den) else "-"
  for title, num, den, only_screens in (
      ("Loops", "loops", "turns", False), ("Header leaks", "header_leaks", "turns", False),
      ("Right screen", "screen_right", "screen_turns", True),
      ("Right screen on transitions", "transitions_right", "transitions", True)):
    cols = [d for d in doms if not only_screens or any(
        k.get(d, {}).get(den) for k in systems.values())]
    if not cols:
      continue
    lines += ["", f"### {title}", "",
              "| System | " + " | ".join(_display(d) for d in cols) + " |",
              "|:--" + "|:-:" * len(cols) + "|"]
    for name, kinds in systems.items():
      lines.append(f"| {name} | " + " | ".join(cell(kinds.get(d, {}), num, den) for d in cols)
                   + " |")
  lines += _facts_markdown(systems, doms)
  return lines


def _facts_markdown(systems: Mapping[str, Mapping[str, Any]], doms: Sequence[str]) -> list[str]:
  """The error, state-change and content tables, each over the domains whose turns it could
  count (error and state facts come from the environment's own report, `Turn.env`)."""
  by_rates = {n: rates(k) for n, k in systems.items()}
  any_kinds = next(iter(systems.values()))

  def num(x):
    return "-" if x is None else f"{x:.1f}"

  def table(title: str, note: str, needs: tuple[str, ...], cell: Callable[[Any, Any], str]
            ) -> list[str]:
    cols = [d for d in doms if any(any_kinds.get(d, {}).get(k) for k in needs)]
    if not cols:
      return []
    out = ["", f"### {title}", "", note, "",
           "| System | " + " | ".join(_display(d) for d in cols) + " |",
           "|:--" + "|:-:" * len(cols) + "|"]
    for name, kinds in systems.items():
      out.append(f"| {name} | " + " | ".join(cell(by_rates[name][d], kinds[d]) for d in cols)
                 + " |")
    return out

  lines = table(
      "Error turns", "Truth: the error the real environment reported for the step (recorded at "
      "collection). Recall: error turns whose prediction shows an error (the domain's `error` "
      "rule); precision: predicted errors on turns that had one. Percent, recall / precision "
      "(error turns of turns with the fact).", ("error_turns",),
      lambda r, k: f"{num(r['error_recall'])} / {num(r['error_precision'])} "
                   f"({k.get('errors', 0)}/{k['error_turns']})")
  if lines:
    agree = by_rates[next(iter(systems))]
    lines += ["", "The rule reads the real observations as the environment reported them on: " +
              ", ".join(f"{_display(d)} {num(agree[d]['error_rule_agrees'])}%" for d in doms
                        if any_kinds.get(d, {}).get("error_turns")) + "."]
  lines += table(
      "Token F1 on state-changing and read-only turns", "Whether the real step changed the "
      "world's state (files, rows, app data), as the environment recorded it. Token F1, "
      "state-changing / read-only (turns of each).", ("changing_turns", "read_only_turns"),
      lambda r, k: f"{num(r['changing_f1'])} / {num(r['read_only_f1'])} "
                   f"({k.get('changing_turns', 0)}/{k.get('read_only_turns', 0)})")
  lines += table(
      "Copyable and world-specific content", "Words of the real observation found in the prompt "
      "(copyable) and not found there (world-specific), and the share of each the prediction "
      "holds; invented: the prediction's words found in neither the prompt nor the truth. "
      "Percent, copyable / world-specific / invented.", ("copyable", "specific"),
      lambda r, k: f"{num(r['copyable_found'])} / {num(r['specific_found'])} / "
                   f"{num(r['invented'])}")
  return lines
