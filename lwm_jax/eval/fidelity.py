"""Instruction fidelity: does a world model follow a perturbation instruction as the real env does?

For each domain with real perturbations (mcp, search, web) and each perturbation of its menu
(`lwm_jax.envs.perturb.corpus_menu()`, or `--specs`), held-out episodes (the seeds of the corpus's
test split) are played for real under the perturbation by the scripted agent; their actions are
then replayed in the world model (`SimulatedEnv`, all episodes stepped together by `step_many`)
twice: with the perturbation's instruction in the system prompt and without it. A small detector
per perturbation kind says, turn by turn, whether an observation shows the instructed behaviour
(an error of the asked kind, at most `size` listed items, no withheld field, a partial failure, a
rate-limit rejection, a stale read); the report gives its rate on the simulated observations with
and without the instruction, and on the real ones (the detectors' own check), plus judge-free
similarity (`lwm_jax.textsim`: exact, token F1, edit similarity) of the simulated
observations to the real ones under the same perturbation. The stale detector needs the episode
so far: a read is stale when it does not show what an earlier, acknowledged write of the same
episode set; each observation sequence (real, simulated with and without the instruction) is
judged against its own earlier turns. Each held-out episode is also played for real without any
perturbation (its plain twin), and every check but the error rate is reported a second time on
the departing turns only: those where the perturbation changed the real observation (the actions
so far agree and the observations differ). A turn where a page was short anyway or a result had
no withheld field to begin with shows the behaviour with or without an instruction; the departing
turns are where following it is visible. A second, teacher-forced part (`likelihood`, on by default,
`--parts`) scores the real perturbed observations with and without the instruction in the
prompt: a model that reads the instruction predicts them better with it.

  python evals/fidelity.py --checkpoint=runs/demo/sft --out=runs/fidelity --episodes=8
  (the same as python -m lwm_jax.eval.fidelity ...)

writes `fidelity.json` and `fidelity.md` under --out. See docs/perturbations.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Callable, Sequence

from lwm_jax.data import drills, schema
from lwm_jax.envs import base, perturb, recorder
from lwm_jax import textsim

DOMAINS = tuple(perturb.corpus_menu())
PARTS = ("generate", "likelihood")

# -- detectors: pure functions of an observation -------------------------------------------------
_ERROR_RE = {
    "timeout": re.compile(r"timed?[ -]?out|HTTP 504|\(504\)|status 504", re.I),
    "server_error": re.compile(r"internal server error|HTTP 500|\(500\)|status 500", re.I),
    "unavailable": re.compile(r"unavailable|overloaded|HTTP 503|\(503\)|status 503", re.I),
}
_RATE_LIMIT_RE = re.compile(r"rate[ -]?limit|too many requests|HTTP 429|\(429\)|status 429", re.I)
_SEARCH_ITEM_RE = re.compile(r"^\s*\d+\. \[[^\]]+\]", re.M)


def _json(obs: str) -> Any:
  try:
    return json.loads(obs.strip())
  except (json.JSONDecodeError, ValueError):
    return None


def shows_error(obs: str, kind: str) -> bool:
  """The observation reports a failure of this kind (timeout, server_error, unavailable)."""
  return bool(_ERROR_RE[kind].search(obs))


def shows_rate_limit(obs: str) -> bool:
  return bool(_RATE_LIMIT_RE.search(obs))


def _update_result(obs: str) -> dict[str, Any] | None:
  """The MCP tool server's update_customer result ({"updated": [...], "customer": ...}), if it is one."""
  value = _json(obs)
  if isinstance(value, dict) and isinstance(value.get("updated"), list) and "customer" in value:
    return value
  return None


def shows_partial(obs: str) -> bool:
  """Some items of one action failed while others succeeded, and the observation says so: the
  shop's "Added k of n" page, or an MCP update whose result names the fields that failed (a
  batch whose every item failed is reported the same way, and counts too)."""
  upd = _update_result(obs)
  if upd is not None:
    return bool(upd.get("failed"))
  failed = re.search(r"\bfail|could not|not be (added|reserved)|error", obs, re.I)
  done = re.search(r"\badded\b|succeeded|\bok\b", obs, re.I)
  return bool(failed and done)


def count_items(obs: str) -> int | None:
  """How many items an observation lists (search results, JSON rows or list entries, the shop's
  product list); None when it shows no list."""
  value = _json(obs)
  if isinstance(value, dict) and isinstance(value.get("rows"), list):
    return len(value["rows"])
  if isinstance(value, list):
    return sum(not (isinstance(x, str) and x.startswith("... ")) for x in value)
  hits = _SEARCH_ITEM_RE.findall(obs)
  if hits:
    return len(hits)
  if obs.startswith('Page "Products'):
    return len(re.findall(r"^\s*listitem\s*$", obs, re.M))
  return None


def _json_has_field(value: Any, field: str) -> bool:
  if isinstance(value, dict):
    columns = value.get("columns")  # a model's JSON may hold anything under "columns"
    if field in value or (isinstance(columns, list) and field in columns):
      return True
    return any(_json_has_field(v, field) for v in value.values())
  if isinstance(value, list):
    return any(_json_has_field(v, field) for v in value)
  return False


def shows_field(obs: str, field: str) -> bool:
  """The observation carries `field`: a search result's title, score or snippet, or a key or
  column of a JSON result."""
  items = _SEARCH_ITEM_RE.findall(obs)
  if items:
    if field == "title":
      return bool(re.search(r"^\s*\d+\. \[[^\]]+\] \S", obs, re.M))
    if field == "score":
      return bool(re.search(r"\bscore -?\d", obs))
    if field == "snippet":
      for line in re.findall(r"^ {3}(.*)$", obs, re.M):
        rest = re.sub(r"score -?[\d.]+", "", line).replace("|", "").strip()
        if rest:
          return True
      return False
  value = _json(obs)
  if value is not None:
    return _json_has_field(value, field)
  return bool(re.search(rf'"{re.escape(field)}"\s*:', obs))


def is_result(obs: str) -> bool:
  """A successful result listing (search results or a JSON result without an error)."""
  if _SEARCH_ITEM_RE.search(obs):
    return True
  value = _json(obs)
  return isinstance(value, (dict, list)) and not (isinstance(value, dict) and value.get("isError"))


# -- the stale detector: a read checked against the episode's earlier writes ---------------------
History = Sequence[tuple[str, str]]  # (action, observation) of the earlier turns


def _tool_call(action: str) -> tuple[str, dict[str, Any]] | None:
  call = _json(action)
  if isinstance(call, dict) and isinstance(call.get("tool"), str):
    args = call.get("arguments")
    return call["tool"], args if isinstance(args, dict) else {}
  return None


def _ok_result(obs: str) -> Any:
  """A tool result that is not an error, parsed; None otherwise."""
  value = _json(obs)
  if isinstance(value, dict) and (value.get("isError") or "error" in value):
    return None
  return value


def written(history: History) -> dict[tuple[str, Any], dict[str, Any]]:
  """What the acknowledged writes of `history` set, as the tool server's rows:
  (table, key) -> {column: value}, with "_created" set for a row the episode made (an order, a
  refund); a later write of a field overrides an earlier one."""
  recs: dict[tuple[str, Any], dict[str, Any]] = {}
  for action, obs in history:
    call, res = _tool_call(action), _ok_result(obs)
    if call is None or not isinstance(res, dict):
      continue
    tool, args = call
    if tool == "update_customer" and isinstance(res.get("updated"), list):
      rec = recs.setdefault(("customers", args.get("customer_id")), {})
      rec.update({f: args[f] for f in res["updated"] if isinstance(f, str) and f in args})
    elif tool == "create_order" and isinstance(res.get("order_id"), (int, str)):
      recs[("orders", res["order_id"])] = {"_created": True, "customer_id": args.get("customer_id"),
                                           "status": res.get("status", "paid")}
      if "stock_left" in res:
        recs.setdefault(("products", args.get("product_id")), {})["stock"] = res["stock_left"]
    elif tool == "refund_order" and res.get("status") == "refunded":
      oid = res.get("order_id", args.get("order_id"))
      if not isinstance(oid, (int, str)):  # a simulated result may hold anything
        continue
      recs.setdefault(("orders", oid), {})["status"] = "refunded"
      recs[("refunds", oid)] = {"_created": True}
  return recs


_KEY = {"customers": "id", "orders": "id", "products": "id", "refunds": "order_id"}
_SIMPLE_SELECT = re.compile(r"^\s*select\s+.+?\s+from\s+(\w+)(?:\s+where\s+(\w+)\s*=\s*(\d+))?"
                            r"\s*;?\s*$", re.I | re.S)
_ONE_TABLE = re.compile(r"^\s*select\s+.+?\s+from\s+(\w+)\b(?!.*\bjoin\b)(?!\s*,)", re.I | re.S)


def _read(action: str, obs: str) -> tuple[str, list[dict[str, Any]], Callable[[Any, dict], bool]
                                          ] | None:
  """(table, rows as dicts, whether a record (key, written fields) must be listed) of a read, or
  None when the turn is no read of one table (or its result is an error)."""
  call, res = _tool_call(action), _ok_result(obs)
  if call is None or res is None:
    return None
  tool, args = call
  nothing = lambda key, rec: False
  if tool == "get_customer" and isinstance(res, dict) and "id" in res:
    return "customers", [res], lambda key, rec: key == args.get("customer_id")
  if not isinstance(res, dict) or not isinstance(res.get("columns"), list) or \
      not isinstance(res.get("rows"), list) or \
      not all(isinstance(c, str) for c in res["columns"]):  # a model may write any JSON here
    return None
  rows = [dict(zip(res["columns"], r)) for r in res["rows"] if isinstance(r, list)]
  whole = not res.get("truncated")  # a cut list says nothing about what it left out
  if tool == "list_orders":
    want = args.get("status")
    cid = args.get("customer_id")
    return "orders", rows, lambda key, rec: (whole and cid is not None and rec.get("customer_id") == cid
                                             and want in (None, rec.get("status")))
  if tool == "search_products":
    return "products", rows, nothing
  if tool == "query" and isinstance(args.get("sql"), str):
    m = _ONE_TABLE.match(args["sql"])
    if not m or m.group(1).lower() not in _KEY:
      return None
    table = m.group(1).lower()
    s = _SIMPLE_SELECT.match(args["sql"])
    if not (whole and s and s.group(1).lower() == table):
      return table, rows, nothing
    col, val = s.group(2), s.group(3)
    if col is None:
      return table, rows, lambda key, rec: True
    if col.lower() == _KEY[table]:
      return table, rows, lambda key, rec: key == int(val)
    if table == "orders" and col.lower() == "customer_id":
      return table, rows, lambda key, rec: rec.get("customer_id") == int(val)
    return table, rows, nothing
  return None


def shows_stale(action: str, obs: str, history: History) -> bool | None:
  """Whether the read `action` -> `obs` shows data as it was before an acknowledged write of
  `history` (the episode's earlier turns) changed it: a written field with another value, or a
  record the write created (an order, a refund) missing from a complete listing that would hold
  it. False when the read shows every written value it covers; None when the turn is not a read,
  reads no record written earlier, or cannot tell (the field left out, the list cut)."""
  got = _read(action, obs)
  if got is None:
    return None
  table, rows, must_list = got
  key_col = _KEY[table]
  verdicts = []
  for (t, key), rec in written(history).items():
    if t != table:
      continue
    row = next((r for r in rows if r.get(key_col) == key), None)
    if row is None:
      if must_list(key, rec):
        verdicts.append(True)
      continue
    shown = [f for f in rec if f in row]
    if shown:
      verdicts.append(any(row[f] != rec[f] for f in shown))
    elif rec.get("_created"):
      verdicts.append(False)  # a row the episode made, listed
  return any(verdicts) if verdicts else None


def followed(p: perturb.Perturbation, sim: str, real: str, *, action: str = "",
             sim_history: History = (), real_history: History = ()) -> bool | None:
  """Whether the simulated observation `sim` shows what `p` asks, on a turn where it applies
  (judged from the real observation `real` under the same perturbation); None elsewhere.
  `stale` needs the turn's `action` and the earlier turns of each side."""
  if p.name == "errors":
    return shows_error(sim, p.params["kind"])
  if p.name == "page_size":
    if not count_items(real):
      return None
    n = count_items(sim)
    return n is not None and 1 <= n <= p.params["size"]
  if p.name == "withhold":
    if not is_result(real):
      return None
    return is_result(sim) and not any(shows_field(sim, f) for f in p.params["fields"])
  if p.name == "partial":
    if not (re.search(r"\bAdded \d+ (of \d+ )?x ", real) or _update_result(real)):
      return None
    return shows_partial(sim)
  if p.name == "rate_limit":
    return shows_rate_limit(sim) if shows_rate_limit(real) else None
  if p.name == "stale":
    if shows_stale(action, real, real_history) is not True:
      return None
    return shows_stale(action, sim, sim_history) is True
  return None


def _rate(xs: Sequence[bool | None]) -> tuple[int, float | None]:
  got = [x for x in xs if x is not None]
  return len(got), (sum(got) / len(got) if got else None)


# -- the run ---------------------------------------------------------------------------------------
def held_out_seeds(corpus_dir: str, domain: str, n: int) -> list[tuple[str, int]]:
  """(id, seed) of the first `n` test-split episodes of `domain` in the corpus."""
  path = os.path.join(corpus_dir, f"{domain}_test.jsonl.gz")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no test split for '{domain}' (see tools/make_corpus.py)")
  out = []
  for t in schema.read_jsonl(path):
    if "seed" not in t.meta:
      raise ValueError(f"{path}: trajectory {t.id} has no meta.seed")
    out.append((t.id, int(t.meta["seed"])))
    if len(out) == n:
      break
  return out


def record_real(domain: str, episodes: Sequence[tuple[str, int]], specs: Sequence[str],
                max_turns: int) -> list[schema.Trajectory]:
  """The real perturbed trajectories: each held-out episode under each spec."""
  env = base.make_env(domain)
  try:
    out = []
    for spec in specs:
      env.set_perturb(spec)
      for tid, seed in episodes:
        out.append(recorder.record(domain, seed, f"{tid}|{spec}", env=env, max_turns=max_turns))
    return out
  finally:
    env.close()


def simulate(sampler: Any, trajs: Sequence[schema.Trajectory], instructed: bool,
             params: Any, batch: int) -> list[list[str]]:
  """Simulated observations of each trajectory's real actions, with or without its instruction."""
  from lwm_jax.sim.env import SimulatedEnv, World, step_many
  out: list[list[str]] = []
  for lo in range(0, len(trajs), batch):
    group = trajs[lo:lo + batch]
    envs = []
    for t in group:
      world = World.from_trajectory(t)
      if not instructed:
        world = world.replace(simulation_instruction="")
      env = SimulatedEnv(sampler, world, params=params, max_turns=max(1, len(t.turns)))
      env.reset(int(t.meta.get("seed", 0)))
      envs.append(env)
    for k in range(max(len(t.turns) for t in group)):
      live = [i for i, t in enumerate(group) if k < len(t.turns) and not envs[i].done]
      if live:
        step_many([envs[i] for i in live], [group[i].turns[k].action for i in live])
    out += [[turn.observation for turn in e.turns] for e in envs]
  return out


def episode_of(trajectory_id: str) -> str:
  """The held-out episode a recorded trajectory replays (`record_real` ids are `EPISODE|SPEC`)."""
  return trajectory_id.split("|")[0]


# per turn: whether the perturbation changed the real observation there (lwm_jax/data/drills.py)
departing_turns = drills.departing_turns


def measure(trajs: Sequence[schema.Trajectory], with_obs: Sequence[Sequence[str]],
            without_obs: Sequence[Sequence[str]],
            plain: dict[str, schema.Trajectory] | None = None) -> list[dict[str, Any]]:
  """One row per (domain, spec, perturbation) plus the spec's similarity to the real env.
  `plain`: each episode's plain twin, keyed by `episode_of(trajectory id)`; with it, the
  checks but the error rate are also rated on the departing turns (`departing_turns`)."""
  rows: dict[tuple[str, str], dict[str, Any]] = {}
  for t, w_obs, o_obs in zip(trajs, with_obs, without_obs):
    spec = t.meta["perturb"]
    key = (t.domain, spec)
    row = rows.setdefault(key, {"domain": t.domain, "spec": spec, "episodes": 0, "turns": 0,
                                "checks": {}, "sim": {"with": [], "without": []}})
    row["episodes"] += 1
    row["turns"] += len(w_obs)
    departs = departing_turns(t, plain.get(episode_of(t.id))) if plain is not None else None
    for p in perturb.parse(spec):
      c = row["checks"].setdefault(p.name, {"with": [], "without": [], "real": [],
                                            "departing": {"with": [], "without": [], "real": []},
                                            "target": p.params.get("rate")
                                            if p.name == "errors" else 1.0})
      seen: dict[str, list[tuple[str, str]]] = {"with": [], "without": [], "real": []}
      for k, (turn, sw, so) in enumerate(zip(t.turns, w_obs, o_obs)):
        real, a = turn.observation, turn.action
        for cond, obs in (("with", sw), ("without", so), ("real", real)):
          c[cond].append(followed(p, obs, real, action=a, sim_history=seen[cond],
                                  real_history=seen["real"]))
          if departs is not None and p.name != "errors":  # an error rate counts every call
            c["departing"][cond].append(c[cond][-1] if departs[k] else None)
        for cond, obs in (("with", sw), ("without", so), ("real", real)):
          seen[cond].append((a, obs))
    for turn, sw, so in zip(t.turns, w_obs, o_obs):
      row["sim"]["with"].append(textsim.free_metrics(sw, turn.observation))
      row["sim"]["without"].append(textsim.free_metrics(so, turn.observation))
  out = []
  for row in rows.values():
    checks = {}
    for name, c in row["checks"].items():
      n, w = _rate(c["with"])
      _, wo = _rate(c["without"])
      _, real = _rate(c["real"])
      checks[name] = {"turns": n, "with_instruction": w, "without_instruction": wo, "real": real,
                      "target": c["target"] if n else None}
      dep = c["departing"]
      if dep["with"]:
        dn, dw = _rate(dep["with"])
        checks[name]["departing"] = {"turns": dn, "with_instruction": dw,
                                     "without_instruction": _rate(dep["without"])[1],
                                     "real": _rate(dep["real"])[1]}
    sim = {}
    for cond, ms in row["sim"].items():
      sim[cond] = {k: (sum(m[k] for m in ms) / len(ms) if ms else None)
                   for k in textsim.FREE_METRICS}
    out.append({"domain": row["domain"], "spec": row["spec"], "episodes": row["episodes"],
                "turns": row["turns"], "checks": checks, "similarity_to_real": sim})
  return out


def likelihood(model: Any, tokenizer: Any, trajs: Sequence[schema.Trajectory], *,
               thinking: bool, max_len: int) -> list[dict[str, Any]]:
  """Teacher-forced view of the same question, free of sampling noise: the negative
  log-likelihood (nats per token) the model gives the REAL perturbed observations, with the
  instruction in the system prompt and without it. A model that reads the instruction predicts
  the instructed behaviour better with it: `gain` = without - with is positive. One entry per
  (domain, spec): over all its turns, and per check over the turns where the real observation
  shows the instructed behaviour (an error of the asked kind, a short page, a withheld field,
  ...), where the instruction should matter most."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from lwm_jax.eval.teacher_forced import observation_nll  # pylint: disable=C0415
  kw = dict(stage="sft", max_len=max_len, thinking=thinking)
  with_i, skip_w = observation_nll(model, tokenizer, trajs, **kw)
  without_i, skip_o = observation_nll(
      model, tokenizer, [dataclasses.replace(t, simulation_instruction="") for t in trajs], **kw)
  w_of = {(r.traj, r.turn): r for r in with_i}
  o_of = {(r.traj, r.turn): r for r in without_i}
  groups: dict[tuple[str, str], dict[str, list]] = {}
  for i, t in enumerate(trajs):
    spec = t.meta["perturb"]
    perts = perturb.parse(spec)
    g = groups.setdefault((t.domain, spec), {"all": [], **{p.name: [] for p in perts}})
    hist: History = []
    for k, turn in enumerate(t.turns):
      pair = (w_of.get((i, k)), o_of.get((i, k)))
      if None not in pair:
        g["all"].append(pair)
        for p in perts:
          if followed(p, turn.observation, turn.observation, action=turn.action,
                      sim_history=hist, real_history=hist):
            g[p.name].append(pair)
      hist.append((turn.action, turn.observation))

  def summary(pairs: list) -> dict[str, Any]:
    tokens = sum(w.tokens for w, _ in pairs)
    if not tokens:
      return {"turns": len(pairs), "tokens": 0, "nll_with": None, "nll_without": None,
              "gain": None}
    w = sum(x.nll for x, _ in pairs) / tokens
    o = sum(x.nll for _, x in pairs) / tokens
    return {"turns": len(pairs), "tokens": tokens, "nll_with": w, "nll_without": o,
            "gain": o - w}

  out = []
  for (domain, spec), g in groups.items():
    out.append({"domain": domain, "spec": spec, "all": summary(g.pop("all")),
                "checks": {name: summary(pairs) for name, pairs in g.items()}})
  if out:
    out[0]["skipped_turns"] = {"with": skip_w, "without": skip_o}
  return out


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{100 * x:.1f}"


def _nats(x: float | None) -> str:
  return "-" if x is None else f"{x:.3f}"


def _signed(x: float | None) -> str:
  return "-" if x is None else f"{x:+.3f}"


def likelihood_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
  lines = ["Teacher-forced: negative log-likelihood of the REAL perturbed observations (nats per "
           "body token) with the instruction in the system prompt and without it; `gain` = "
           "without - with (positive: the instruction helps the model predict what the real "
           "environment did). `shown` rows keep only the turns where the real observation shows "
           "the instructed behaviour.", "",
           "| domain | perturbation | turns | tokens | with | without | gain |",
           "|---|---|---|---|---|---|---|"]
  for r in rows:
    for label, c in [("all turns", r["all"])] + [(f"{n} shown", c) for n, c in r["checks"].items()]:
      lines.append(f"| {r['domain']} | `{r['spec']}` ({label}) | {c['turns']} | {c['tokens']} | "
                   f"{_nats(c['nll_with'])} | {_nats(c['nll_without'])} | "
                   f"{_signed(c['gain'])} |")
  return lines


def markdown(report: dict[str, Any]) -> str:
  short = [f"{d} {n}" for d, n in report.get("episodes_found", {}).items()
           if n < report["episodes_per_domain"]]
  found = f" (all the test split has: {', '.join(short)})" if short else ""
  lines = [f"# Instruction fidelity: {report['checkpoint']}", "",
           f"{report['episodes_per_domain']} held-out episodes per domain and perturbation{found}, "
           f"at most {report['max_turns']} turns, {report['max_tokens']} new tokens per observation, "
           + (f"sampled at temperature {report['temperature']:g} (seed {report['seed']}). "
              if report.get("temperature") else "greedy. ") +
           "Rates in percent of the turns where the check applies; `real` is the detector on the "
           "real environment's observations; `target` is the asked error rate (100 for the other "
           "kinds). The departing columns rate the same check on the turns where the "
           "perturbation changed the real observation (against the episode played without it); "
           "the error rate counts every call and has none.", ""]
  if report["rows"]:
    lines += ["| domain | perturbation | check | turns | with instruction | without | real | "
              "target | departing turns | with | without |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in report["rows"]:
    for name, c in r["checks"].items():
      d = c.get("departing")
      dep = (f"{d['turns']} | {_pct(d['with_instruction'])} | {_pct(d['without_instruction'])}"
             if d else "- | - | -")
      lines.append(f"| {r['domain']} | `{r['spec']}` | {name} | {c['turns']} | "
                   f"{_pct(c['with_instruction'])} | {_pct(c['without_instruction'])} | "
                   f"{_pct(c['real'])} | {_pct(c['target'])} | {dep} |")
  if report["rows"]:
    lines += ["", "Judge-free similarity of the simulated observations to the real ones under the "
              "same perturbation (percent; with / without the instruction):", "",
              "| domain | perturbation | turns | exact | token F1 | edit similarity |",
              "|---|---|---|---|---|---|"]
  for r in report["rows"]:
    s = r["similarity_to_real"]
    cells = " | ".join(f"{_pct(s['with'][k])} / {_pct(s['without'][k])}"
                       for k in textsim.FREE_METRICS)
    lines.append(f"| {r['domain']} | `{r['spec']}` | {r['turns']} | {cells} |")
  if report.get("likelihood"):
    lines += [""] + likelihood_markdown(report["likelihood"])
  return "\n".join(lines) + "\n"


def run(sampler: Any, *, domains: Sequence[str], specs: dict[str, Sequence[str]],
        corpus_dir: str, episodes: int, max_turns: int, max_tokens: int, batch: int,
        checkpoint: str = "", temperature: float = 0.0, seed: int = 0,
        parts: Sequence[str] = PARTS, thinking: bool | None = None) -> dict[str, Any]:
  """`temperature` 0 is greedy. A rate-type instruction (errors at 20% of the calls) can only show
  at its rate when observations are sampled: a greedy model that learned "1 call in 5 fails"
  still writes the likelier success every time. `parts`: "generate" (the rates and similarity
  above) and/or "likelihood" (`likelihood`, rendered as the model was trained: `thinking`, by
  default as recorded in the checkpoint's provenance.json)."""
  from lwm_jax.sampling.params import SamplingParams
  params = SamplingParams(temperature=temperature, max_new_tokens=max_tokens, seed=seed)
  trajs: list[schema.Trajectory] = []
  t0 = time.time()
  plain: dict[str, schema.Trajectory] = {}
  found: dict[str, int] = {}
  for d in domains:
    seeds = held_out_seeds(corpus_dir, d, episodes)
    found[d] = len(seeds)
    trajs += record_real(d, seeds, specs[d], max_turns)
    plain.update((episode_of(t.id), t) for t in record_real(d, seeds, [""], max_turns))
  t1 = time.time()
  report = {"checkpoint": checkpoint, "episodes_per_domain": episodes, "max_turns": max_turns,
            "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "domains": list(domains), "episodes_found": found, "rows": [],
            "seconds": {"real": round(t1 - t0, 1)}}
  if "generate" in parts:
    with_obs = simulate(sampler, trajs, True, params, batch)
    without_obs = simulate(sampler, trajs, False, params, batch)
    report["rows"] = measure(trajs, with_obs, without_obs, plain)
    report["seconds"]["simulated"] = round(time.time() - t1, 1)
  if "likelihood" in parts:
    t2 = time.time()
    if thinking is None:
      from lwm_jax.checkpoints import recorded_thinking  # pylint: disable=C0415
      thinking = recorded_thinking(checkpoint) if checkpoint else True
    report["likelihood_thinking"] = bool(thinking)
    report["likelihood"] = likelihood(sampler.model, sampler.tokenizer, trajs,
                                      thinking=thinking,
                                      max_len=int(sampler.cfg.max_position_embeddings))
    report["seconds"]["likelihood"] = round(time.time() - t2, 1)
  return report


def parse_specs(text: str, domains: Sequence[str]) -> dict[str, list[str]]:
  """`--specs`: "" for each domain's menu, else `domain=SPEC|SPEC,...` entries separated by
  `&&` (`lwm_jax.envs.perturb.parse_menu`)."""
  return perturb.parse_menu(text, domains, "--specs")


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--checkpoint", required=True, help="workdir, step folder or Hugging Face folder")
  ap.add_argument("--tokenizer", default=None)
  ap.add_argument("--out", required=True, help="folder for fidelity.json and fidelity.md")
  ap.add_argument("--domains", default=",".join(DOMAINS))
  ap.add_argument("--specs", default="", help="'search=page_size:size=2|errors:rate=0.3 && web=...'"
                  " (default: each domain's menu)")
  ap.add_argument("--corpus_dir", default="data/corpus")
  ap.add_argument("--episodes", type=int, default=8, help="held-out episodes per domain and spec")
  ap.add_argument("--max_turns", type=int, default=12)
  ap.add_argument("--max_tokens", type=int, default=384)
  ap.add_argument("--batch", type=int, default=16, help="episodes stepped per engine call")
  ap.add_argument("--temperature", type=float, default=0.0,
                  help="0: greedy; sample (e.g. 1.0) to see rate-type instructions at their rate")
  ap.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature > 0)")
  ap.add_argument("--parts", default=",".join(PARTS), help="generate (simulated observations: "
                  "rates and similarity) and/or likelihood (teacher-forced NLL of the real "
                  "observations with and without the instruction)")
  ap.add_argument("--thinking", default="auto", choices=("auto", "on", "off"),
                  help="likelihood: render targets in thinking mode or not (auto: as recorded in "
                  "the checkpoint's provenance.json, else on)")
  ap.add_argument("--engine", default="{}", help="engine options as a JSON object, e.g. "
                  "'{\"min_prompt_bucket\": 1024}' (fewer compiled shapes)")
  args = ap.parse_args(argv)
  domains = [d.strip() for d in args.domains.split(",") if d.strip()]
  bad = [d for d in domains if d not in DOMAINS]
  try:
    if bad:
      raise ValueError(f"--domains: '{bad[0]}' has no real perturbations (use {', '.join(DOMAINS)})")
    for name in ("episodes", "max_turns", "max_tokens", "batch"):
      if getattr(args, name) < 1:
        raise ValueError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or any(p not in PARTS for p in parts):
      raise ValueError(f"--parts: expected a comma list of {', '.join(PARTS)}, got "
                       f"'{args.parts}'")
    specs = parse_specs(args.specs, domains)
    try:
      engine = json.loads(args.engine)
    except json.JSONDecodeError as e:
      raise ValueError(f"--engine: not valid JSON: {e}") from None
    if not isinstance(engine, dict):
      raise ValueError(f"--engine: expected a JSON object, got {type(engine).__name__}")
  except (ValueError, NotImplementedError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  from lwm_jax.sampling.sampler import Sampler
  sampler = Sampler.from_checkpoint(args.checkpoint, tokenizer=args.tokenizer,
                                    **{"max_batch": max(4, args.batch), **engine})
  report = run(sampler, domains=domains, specs=specs, corpus_dir=args.corpus_dir,
               episodes=args.episodes, max_turns=args.max_turns, max_tokens=args.max_tokens,
               batch=args.batch, checkpoint=args.checkpoint, temperature=args.temperature,
               seed=args.seed, parts=parts,
               thinking=None if args.thinking == "auto" else args.thinking == "on")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "fidelity.json"), "w") as f:
    json.dump(report, f, indent=1, sort_keys=True)
    f.write("\n")
  with open(os.path.join(args.out, "fidelity.md"), "w") as f:
    f.write(markdown(report))
  print(markdown(report))
  return 0


if __name__ == "__main__":
  sys.exit(main())
