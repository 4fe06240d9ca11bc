"""Task verifiers: did the agent of an episode do what the episode's goal (`env.goal`) asked?

`check(env, history)` judges a finished episode of any of the seven environments and returns a
`Verdict(success, credit, reason)`: binary success, partial credit in [0, 1] (1.0 exactly when
the task is done) and a one-line reason naming what was checked. `history` is the list of
(action, observation) turns of the episode (pairs, or `schema.Turn`s). Verdicts are
deterministic: they read the environment's real state after the last action and the turns.

What is checked, per domain (the goal kinds are the env modules' own):

  terminal  files in the sandbox: report.txt holds the ERROR count of the log; every CSV of the
            data folder has an identical copy in the backup folder; every note .txt became .md
            with its text. Question tasks read the agent's answer from the transcript (there is
            no answer action): sum_region, the output of the last command that printed one
            number and nothing else; top_users, the last command whose whole output is a
            `count name` table (uniq -c style), which must list every user with the right count,
            most frequent first; find_def, an observation showing `def NAME(` together with the
            path of the file that defines it; tour (asked for only, `TerminalEnv(task="tour")`),
            the share of directories that an `ls` naming them showed with all their files.
  swe       the repository's whole test suite passes when run now, and no test file was changed.
  search    the target document was opened (its page shown); half credit when it was in a result
            list but never opened. The action space has no answer action, so reading the right
            document is the answer.
  web       the shop server's orders: a new order of the user with exactly the product and
            quantity, shipping and address asked for (when the stock cannot cover the quantity,
            success is placing no order of the product after the shop refused it); cheapest,
            the last product page the agent opened is a cheapest product of the category;
            account, a page showed the account's orders while signed in as the user.
  android   the phone's live state: the contact saved with the phone number; the alarm at the
            time with the label, switched on; the switch flipped and the brightness above where
            it started; the note saved; the contact gone and every other contact kept.
  os        files in the sandbox and the settings: the line added and the file saved with the
            rest of its text kept; the folder made in Documents; the file renamed with its
            text; the file deleted; the theme switched and the volume below where it started.
  mcp       the database rows: a new order of the customer for the product and quantity; the
            order refunded (with its refunds row); the email updated. When the database refuses
            the change (stock too low, a pending order, an email that another customer has),
            success is leaving the rows as they were after the refusal was seen. Questions:
            report, the last `query` result of (category, revenue) rows must equal the real
            revenue per category of paid and shipped orders, highest first; lookup, the last
            `list_orders` result for the customer must show exactly their pending orders.

`verify_transcript.check_transcript(domain, seed, history)` judges an episode for which no real
state exists (a simulated episode): it re-creates the world and goal of `seed` with a real
environment (`reset` only; no action is replayed) and judges from the transcript alone, by the
rules its docstring lists. Question tasks are judged by the same rules in both modes.

Agent tasks are drawn by seed: `task_seeds("train")` and `task_seeds("heldout")` are disjoint
ranges, far above the episode seeds of corpus collection (base seeds below 999; the bundled
corpus uses base seed 0), so held-out tasks are seen neither by the agent in training nor by the
world model.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
from typing import Any, Iterable, Sequence

from lwm_jax import domains
from lwm_jax.envs import base, confined

# Agent task seeds: [start, stop) per split. Collection runs with base seed S play episode seeds
# S * 1_000_003 + i (`recorder.episode_seed`), so these ranges stay clear of every base seed below
# 999 (the bundled corpus uses 0).
TASK_SEED_RANGES = {"train": (1_000_000_000, 1_001_000_000), "heldout": (1_900_000_000, 1_901_000_000)}


@dataclasses.dataclass(frozen=True)
class Verdict:
  success: bool
  credit: float
  reason: str


def task_seeds(split: str, n: int | None = None) -> range:
  """The seeds of agent tasks for `split` ('train' or 'heldout'), the first `n` of them."""
  if split not in TASK_SEED_RANGES:
    raise ValueError(f"unknown task split {split!r} (expected one of {', '.join(TASK_SEED_RANGES)})")
  lo, hi = TASK_SEED_RANGES[split]
  if n is not None and not 0 <= n <= hi - lo:
    raise ValueError(f"{split} has {hi - lo} task seeds; asked for {n}")
  return range(lo, hi if n is None else lo + n)


def split_of_seed(seed: int) -> str | None:
  """'train', 'heldout' or None (a seed outside both task ranges)."""
  for name, (lo, hi) in TASK_SEED_RANGES.items():
    if lo <= seed < hi:
      return name
  return None


Turns = list[tuple[str, str]]


def _turns(history: Iterable[Any]) -> Turns:
  out = []
  for i, t in enumerate(history):
    if isinstance(t, (tuple, list)) and len(t) == 2:
      out.append((str(t[0]), str(t[1])))
    elif hasattr(t, "action") and hasattr(t, "observation"):
      out.append((t.action, t.observation))
    else:
      raise ValueError(f"history turn {i}: expected an (action, observation) pair, got {type(t).__name__}")
  return out


def _v(ok: bool, credit: float, reason: str) -> Verdict:
  return Verdict(bool(ok), 1.0 if ok else max(0.0, min(float(credit), 0.99)), reason)


def _share(done: int, total: int, what: str) -> Verdict:
  return _v(total > 0 and done == total, done / max(total, 1), f"{done} of {total} {what}")


def check(env: base.Env, history: Iterable[Any]) -> Verdict:
  """Verdict on the episode that `env` just played (its state now) with these turns."""
  goal = env.goal
  if not goal:
    raise ValueError(f"{env.domain} env has no goal: call reset(seed) and play the episode first")
  dom = domains.get_domain(env.domain)
  if not dom.verifier:
    raise ValueError(f"no verifier for environment {env.domain!r}")
  fn = dom.load("verifier")
  real = dom.load("env")
  if not isinstance(env, real):
    raise ValueError(f"{type(env).__name__} is not the real {env.domain} environment ({real.__name__}): "
                     "it has no real state to check; judge its episode with "
                     "verify_transcript.check_transcript")
  return fn(env, goal, _turns(history))


# -- reading answers from a transcript ------------------------------------------------------------
_PROMPT = re.compile(r"^\S+@sandbox:.*[#$] ?$")


def shell_output(observation: str) -> list[str]:
  """A terminal observation's output lines, without the trailing prompt line."""
  lines = observation.splitlines()
  if lines and _PROMPT.match(lines[-1]):
    lines = lines[:-1]
  return lines


def _number(text: str) -> float | None:
  try:
    return float(text.strip())
  except ValueError:
    return None


def last_number_answer(turns: Turns) -> float | None:
  """The output of the last command that printed exactly one number and nothing else."""
  for _, obs in reversed(turns):
    out = [l for l in shell_output(obs) if l.strip()]
    if len(out) == 1 and _number(out[0]) is not None:
      return _number(out[0])
  return None


def _fmt(x: float) -> str:
  return str(int(x)) if float(x).is_integer() else f"{x:.6f}".rstrip("0")


_COUNT_ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s*$")


def last_count_table(turns: Turns) -> list[tuple[int, str]] | None:
  """The last command output made only of `count name` rows (as `uniq -c` prints them)."""
  for _, obs in reversed(turns):
    out = [l for l in shell_output(obs) if l.strip()]
    rows = [_COUNT_ROW.match(l) for l in out]
    if out and all(rows):
      return [(int(m.group(1)), m.group(2)) for m in rows]
  return None


# -- terminal -------------------------------------------------------------------------------------
def _log_users(env_files: dict[str, str], lay: dict[str, Any]) -> dict[str, int]:
  counts: dict[str, int] = {}
  pat = r"\[([^\]]+)\]" if lay.get("log_format") == "bracket" else r"\buser=(\S+)"
  for line in env_files[lay["log"]].splitlines():
    m = re.search(pat, line)
    if m:
      counts[m.group(1)] = counts.get(m.group(1), 0) + 1
  return counts


def _terminal_question(g: dict[str, Any], files: dict[str, str], lay: dict[str, Any],
                       turns: Turns) -> Verdict | None:
  """Verdicts of the terminal tasks that are questions (judged from the transcript alone)."""
  k = g["kind"]
  if k == "sum_region":
    cols = lay["sales_columns"]
    rc, ac = cols.index("region"), cols.index(lay["amount"])
    rows = [l.split(",") for l in files[lay["sales"]].splitlines()[1:] if l]
    total = sum(float(r[ac]) for r in rows if r[rc] == g["region"])
    got = last_number_answer(turns)
    if got is None:
      return _v(False, 0, f"no command printed a lone number; the total is {_fmt(total)}")
    return _v(abs(got - total) < 1e-6, 0, f"answer {_fmt(got)}, total {_fmt(total)}")
  if k == "tour":
    listed = 0
    for d in g["dirs"]:
      names = {os.path.basename(p) for p in files if os.path.dirname(p) == d}
      listed += any(a.split()[:1] == ["ls"] and d in a.split()
                    and names <= set(" ".join(shell_output(o)).split()) for a, o in turns)
    return _share(listed, len(g["dirs"]), "directories listed with all their files")
  if k == "top_users":
    truth = _log_users(files, lay)
    table = last_count_table(turns)
    if table is None:
      return _v(False, 0, f"no command printed a count table; {len(truth)} users in the log")
    got = {name.strip("[]").removeprefix("user="): n for n, name in table}
    right = sum(got.get(u) == n for u, n in truth.items())
    ordered = all(a[0] >= b[0] for a, b in zip(table, table[1:]))
    ok = got == truth and ordered
    return _v(ok, right / max(len(truth), 1) * (1.0 if ordered else 0.5),
              f"{right} of {len(truth)} users counted right, {len(got)} listed, "
              f"{'most frequent first' if ordered else 'not sorted by count'}")
  if k == "find_def":
    path = lay["functions"][g["func"]]
    shown = [(a, o) for a, o in turns if f"def {g['func']}(" in o]
    named = any(path in a or path in o or f"./{path}" in o for a, o in shown)
    if named:
      return _v(True, 1, f"the definition of {g['func']} was shown with its file {path}")
    return _v(False, 0.5 if shown else 0,
              f"definition {'shown without its file' if shown else 'never shown'}; it is in {path}")
  return None


def _check_terminal(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  files, lay, home = env.files, env.layout, env.home
  q = _terminal_question(g, files, lay, turns)
  if q is not None:
    return q
  k = g["kind"]
  if k == "count_errors":
    n = sum("ERROR" in l for l in files[lay["log"]].splitlines())
    text = _read(home, "report.txt")
    if text is None:
      return _v(False, 0, f"no ~/report.txt (a regular file); the log has {n} ERROR lines")
    text = text.strip()
    return _v(text == str(n), 0, f"report.txt holds {text[:40]!r}, the log has {n} ERROR lines")
  if k == "backup_csv":
    csvs = sorted(p for p in files if p.startswith(lay["data"] + "/") and p.endswith(".csv"))
    done = sum(_read(home, os.path.join(g["backup"], os.path.basename(p))) == files[p] for p in csvs)
    return _share(done, len(csvs), f"CSV files of {lay['data']}/ copied intact to {g['backup']}/")
  if k == "rename_notes":
    txts = sorted(p for p in files if os.path.dirname(p) == lay["notes"] and p.endswith(".txt"))
    done = sum(confined.kind(home, p) is None and _read(home, p[:-4] + ".md") == files[p]
               for p in txts)
    return _share(done, len(txts), f".txt notes of {lay['notes']}/ renamed to .md with their text")
  raise ValueError(f"terminal: unknown goal kind {k!r}")


def _read(root: str, rel: str) -> str | None:
  """The text of regular file `rel` under the episode folder `root`, or None (missing, or a link,
  FIFO or device the agent left there: the host never follows or opens those), read up to
  `confined.MAX_READ` bytes."""
  return confined.read_text(root, rel)


# -- swe ------------------------------------------------------------------------------------------
_SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors)\b")


def _pytest_counts(out: str) -> tuple[int, int]:
  passed = failed = 0
  for n, what in _SUMMARY.findall(out):
    if what == "passed":
      passed += int(n)
    else:
      failed += int(n)
  return passed, failed


def _check_swe(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  changed = sorted(p for p, text in env.world.files.items()
                   if p.startswith("tests/") and _read(env.repo, p) != text)
  rc, out = env.suite_result()
  passed, failed = _pytest_counts(out)
  share = passed / max(passed + failed, 1)
  if changed:
    return _v(False, 0, f"test files changed: {', '.join(changed)}")
  return _v(rc == 0, share, f"test suite: {passed} passed, {failed} failed (exit code {rc})")


# -- search ---------------------------------------------------------------------------------------
def _check_search_turns(g: dict[str, Any], turns: Turns) -> Verdict:
  target = g["target"]
  if any(o.startswith(f"[{target}] page ") for _, o in turns):
    return _v(True, 1, f"opened the target document {target}")
  listed = any(re.search(rf"^\d+\. \[{re.escape(target)}\]", o, re.M) for _, o in turns)
  return _v(False, 0.5 if listed else 0,
            f"target {target} {'listed in results but never opened' if listed else 'never found'}")


def _check_search(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  return _check_search_turns(g, turns)


# -- web ------------------------------------------------------------------------------------------
def _web_account_seen(g: dict[str, Any], turns: Turns) -> bool:
  return any(o.startswith('Page "Account - Shop"') and f'link "Account ({g["user"]})"' in o
             for _, o in turns)


def _web_refused(g: dict[str, Any], turns: Turns) -> bool:
  """The shop refused the quantity ("Only N of X in stock."), or the product page showed its stock."""
  refusal = re.compile(rf"Only \d+ of {re.escape(g['product'])} in stock")
  page = f'Page "{g["product"]} - Shop"'
  return any(refusal.search(o) or (page in o and "In stock: " in o) for _, o in turns)


def _cheapest(world: dict[str, Any], category: str) -> tuple[float, list[dict[str, Any]]]:
  prods = [p for p in world["products"] if p["category"] == category]
  low = min(p["price"] for p in prods)
  return low, [p for p in prods if p["price"] == low]


def _web_cheapest(world: dict[str, Any], g: dict[str, Any], turns: Turns) -> Verdict:
  """The answer is the last product page the agent opened."""
  low, best = _cheapest(world, g["category"])
  pages = [m.group(1) for _, o in turns for m in [_PRODUCT_PAGE.match(o)] if m]
  last = pages[-1] if pages else None
  ok = last in {str(p["id"]) for p in best}
  return _v(ok, 0, f"last product page opened: {'/product/' + last if last else 'none'}; cheapest in "
                   f"{g['category']}: {', '.join(p['name'] for p in best)} (${low:.2f})")


_PRODUCT_PAGE = re.compile(r'^(?:Error: .*\n)?Page "[^\n]*" at http://shop\.local/product/(\d+)\n')


def _check_web(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  world = env.server.state.world
  k = g["kind"]
  if k == "cheapest":
    return _web_cheapest(world, g, turns)
  if k == "account":
    ok = _web_account_seen(g, turns)
    return _v(ok, 0, f"account page of {g['user']} {'shown' if ok else 'never shown'}")
  prod = next(p for p in world["products"] if p["name"] == g["product"])
  first_id = max((o["id"] for o in world["orders"]), default=1000)
  new = [o for o in env.server.state.orders if o["id"] > first_id]
  if prod["stock"] < g["qty"]:
    bought = [o for o in new if prod["id"] in o["cart"]]
    refused = _web_refused(g, turns)
    return _v(not bought and refused, 0,
              f"only {prod['stock']} in stock for {g['qty']} asked: {len(bought)} orders of it placed, "
              f"refusal {'seen' if refused else 'not seen'}")
  want = {"user": g["user"], "cart": {prod["id"]: g["qty"]}, "shipping": g["shipping"],
          "address": g["address"]}
  best = 0.0
  for o in new:
    got = {"user": o["user"], "cart": o["cart"], "shipping": o["shipping"], "address": o["address"].strip()}
    best = max(best, sum(got[x] == want[x] for x in want) / len(want))
  return _v(best == 1.0, best, f"{len(new)} new orders; best matches {best:.0%} of user, items, "
                               "shipping and address")


# -- android --------------------------------------------------------------------------------------
def _check_android(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  start = env.initial_world
  k = g["kind"]
  if k == "add_contact":
    named = [c for c in env.contacts if c["name"] == g["name"]]
    ok = any(c["phone"] == g["phone"] for c in named)
    return _v(ok, 0.5 if named else 0, f"contact {g['name']} {'saved' if named else 'missing'}"
                                       + (f" with phone {named[0]['phone']!r}" if named else ""))
  if k == "alarm":
    t = f"{g['hour']:02d}:{g['minute']:02d}"
    labelled = [a for a in env.alarms if a["label"] == g["label"]]
    ok = any(a["time"] == t and a["on"] for a in labelled)
    return _v(ok, 0.5 if labelled else 0, f"alarm '{g['label']}' at {t}: "
              + (", ".join(f"{a['time']} {'on' if a['on'] else 'off'}" for a in labelled) or "missing"))
  if k == "settings":
    key = g["toggle"]
    flipped = env.settings[key] != start["settings"][key]
    brighter = env.settings["brightness"] > start["settings"]["brightness"]
    return _v(flipped and brighter, (flipped + brighter) / 2,
              f"{key} {'flipped' if flipped else 'unchanged'}; brightness "
              f"{start['settings']['brightness']} -> {env.settings['brightness']}")
  if k == "note":
    ok = any(n["title"] == g["note"] for n in env.notes)
    return _v(ok, 0, f"note '{g['note']}' {'saved' if ok else 'missing'}")
  if k == "delete_contact":
    names = {c["name"] for c in env.contacts}
    others = [c["name"] for c in start["contacts"] if c["name"] != g["victim"]]
    kept = sum(n in names for n in others)
    gone = g["victim"] not in names
    return _v(gone and kept == len(others), 0.5 * gone + 0.5 * kept / max(len(others), 1),
              f"{g['victim']} {'deleted' if gone else 'still there'}; {kept} of {len(others)} others kept")
  raise ValueError(f"android: unknown goal kind {k!r}")


# -- os -------------------------------------------------------------------------------------------
def _check_os(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  home, world = env.home, env.world
  k = g["kind"]
  if k == "edit":
    text = _read(home, g["file"])
    if text is None:
      return _v(False, 0, f"~/{g['file']} is gone")
    lines = text.splitlines()
    if g["line"] not in lines:
      return _v(False, 0, f"~/{g['file']} does not contain the line {g['line']!r}")
    lines.remove(g["line"])
    kept = lines == world["files"][g["file"]].splitlines()
    return _v(kept, 0.5, f"line added; the rest of the file {'kept' if kept else 'changed'}")
  if k == "mkdir":
    ok = os.path.isdir(os.path.join(home, "Documents", g["folder"]))
    return _v(ok, 0, f"folder Documents/{g['folder']} {'exists' if ok else 'missing'}")
  if k == "rename":
    new = os.path.join(home, os.path.dirname(g["file"]), g["newname"])
    old_gone = not os.path.exists(os.path.join(home, g["file"]))
    same = _read(home, os.path.join(os.path.dirname(g["file"]), g["newname"])) == world["files"][g["file"]]
    return _v(old_gone and same, 0.5 * same,
              f"~/{g['file']} {'gone' if old_gone else 'still there'}; {g['newname']} "
              f"{'holds its text' if same else 'missing or different'}")
  if k == "delete":
    gone = not os.path.exists(os.path.join(home, g["file"]))
    others = [p for p in world["files"] if p != g["file"]]
    kept = sum(os.path.exists(os.path.join(home, p)) for p in others)
    return _v(gone and kept == len(others), 0.5 * gone + 0.5 * kept / max(len(others), 1),
              f"~/{g['file']} {'deleted' if gone else 'still there'}; {kept} of {len(others)} other files kept")
  if k == "theme":
    want = "Light" if world["settings"]["theme"] == "Dark" else "Dark"
    themed = env.settings["theme"] == want
    quieter = env.settings["volume"] < world["settings"]["volume"]
    return _v(themed and quieter, (themed + quieter) / 2,
              f"theme {env.settings['theme']} (asked {want}); volume {world['settings']['volume']} -> "
              f"{env.settings['volume']}")
  raise ValueError(f"os: unknown goal kind {k!r}")


# -- mcp ------------------------------------------------------------------------------------------
def _calls(turns: Turns) -> list[tuple[str, dict[str, Any], str]]:
  """(tool, arguments, observation) of every well-formed tool call."""
  out = []
  for a, o in turns:
    try:
      call = json.loads(a)
    except json.JSONDecodeError:
      continue
    if isinstance(call, dict) and isinstance(call.get("tool"), str):
      args = call.get("arguments")
      out.append((call["tool"], args if isinstance(args, dict) else {}, o))
  return out


def _rows(observation: str) -> list[list[Any]] | None:
  try:
    res = json.loads(observation)
  except json.JSONDecodeError:
    return None
  rows = res.get("rows") if isinstance(res, dict) else None
  return rows if isinstance(rows, list) else None


_REVENUE_SQL = ("SELECT p.category, ROUND(SUM(i.quantity * i.unit_price), 2) AS revenue FROM order_items i "
                "JOIN orders o ON o.id = i.order_id JOIN products p ON p.id = i.product_id "
                "WHERE o.status IN ('paid', 'shipped') GROUP BY p.category ORDER BY revenue DESC, p.category")


def _mcp_question(g: dict[str, Any], con: sqlite3.Connection, turns: Turns) -> Verdict | None:
  """Verdicts of the MCP tasks that are questions, from the last matching tool result."""
  calls = _calls(turns)
  if g["kind"] == "report":
    truth = con.execute(_REVENUE_SQL).fetchall()
    answers = [r for t, _, o in calls if t == "query" for r in [_rows(o)]
               if r and all(len(x) == 2 and isinstance(x[1], (int, float)) for x in r)]
    if not answers:
      return _v(False, 0, f"no query returned (category, revenue) rows; {len(truth)} categories")
    got = answers[-1]
    right = sum(i < len(got) and got[i][0] == c and abs(got[i][1] - v) < 0.01
                for i, (c, v) in enumerate(truth))
    ok = right == len(truth) == len(got)
    return _v(ok, right / max(len(truth), 1), f"{right} of {len(truth)} categories right, in order")
  if g["kind"] == "lookup":
    cid = g["customer_id"]
    truth = {r[0] for r in con.execute("SELECT id FROM orders WHERE customer_id=? AND status='pending'", (cid,))}
    seen = [o for t, a, o in calls if t == "list_orders" and a.get("customer_id") == cid and _rows(o) is not None]
    if not seen:
      return _v(False, 0, f"customer #{cid}'s orders never listed; {len(truth)} pending")
    res = json.loads(seen[-1])
    col = res.get("columns", [])
    if "id" not in col or "status" not in col:
      return _v(False, 0, "the last listing has no id and status columns")
    got = {r[col.index("id")] for r in res["rows"] if r[col.index("status")] == "pending"}
    return _v(got == truth, 0, f"pending in the last listing: {sorted(got)}; really pending: {sorted(truth)}")
  return None


def _check_mcp(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  con = sqlite3.connect(f"file:{env.db_path}?mode=ro", uri=True)
  try:
    q = _mcp_question(g, con, turns)
    return q if q is not None else _mcp_state(env.world["tables"], g, con, turns)
  finally:
    con.close()


def _mcp_state(tables: dict[str, list], g: dict[str, Any], con: sqlite3.Connection,
               turns: Turns) -> Verdict:
  k = g["kind"]
  refused = lambda word: any('"isError": true' in o and word in o for _, o in turns)
  if k == "order":
    prod = next(p for p in tables["products"] if p[1] == g["product"])
    first = max((o[0] for o in tables["orders"]), default=0)
    new = con.execute("SELECT o.id, o.customer_id, i.product_id, i.quantity FROM orders o JOIN order_items i "
                      "ON i.order_id = o.id WHERE o.id > ?", (first,)).fetchall()
    mine = [r for r in new if r[2] == prod[0]]
    if prod[4] < g["quantity"]:
      seen = refused("CHECK constraint")
      return _v(not mine and seen, 0, f"stock {prod[4]} < {g['quantity']} asked: {len(mine)} orders of it "
                                      f"placed, refusal {'seen' if seen else 'not seen'}")
    ok = any(r[1] == g["customer_id"] and r[3] == g["quantity"] for r in mine)
    return _v(ok, 0.5 if mine else 0, f"{len(new)} new order lines, {len(mine)} of '{g['product']}'"
                                      f"{'' if ok else ', none for the customer with the quantity asked'}")
  if k == "refund":
    oid = g["order_id"]
    before = next(o[2] for o in tables["orders"] if o[0] == oid)
    now = con.execute("SELECT status FROM orders WHERE id=?", (oid,)).fetchone()[0]
    row = con.execute("SELECT 1 FROM refunds WHERE order_id=?", (oid,)).fetchone()
    if before == "pending":
      seen = refused("pending")
      return _v(now == "pending" and not row and seen, 0,
                f"order #{oid} was pending (nothing to refund): now {now}, refusal {'seen' if seen else 'not seen'}")
    return _v(now == "refunded" and bool(row), 0, f"order #{oid}: {before} -> {now}, "
                                                  f"refund row {'present' if row else 'missing'}")
  if k == "update":
    cid = g["customer_id"]
    owner = next((c[0] for c in tables["customers"] if c[2] == g["email"]), None)
    now = con.execute("SELECT email FROM customers WHERE id=?", (cid,)).fetchone()[0]
    if owner is not None and owner != cid:
      before = next(c[2] for c in tables["customers"] if c[0] == cid)
      seen = refused("UNIQUE")
      return _v(now == before and seen, 0, f"{g['email']} belongs to customer #{owner}: email of #{cid} "
                                           f"{'kept' if now == before else 'changed'}, refusal {'seen' if seen else 'not seen'}")
    return _v(now == g["email"], 0, f"email of #{cid} is {now}; asked {g['email']}")
  raise ValueError(f"mcp: unknown goal kind {k!r}")


def scripted_success(domain: str, seeds: Iterable[int]) -> dict[str, list[bool]]:
  """Success of the scripted agent on each seed, grouped by goal kind (how hard each task is)."""
  import random
  from lwm_jax.envs import recorder
  env = base.make_env(domain)
  out: dict[str, list[bool]] = {}
  try:
    for seed in seeds:
      traj = recorder.run_episode(env, base.make_agent(domain, random.Random(seed)), seed, f"{domain}-{seed}")
      out.setdefault(env.goal.get("kind", "fix"), []).append(check(env, traj.turns).success)
  finally:
    env.close()
  return out


if __name__ == "__main__":
  import argparse
  ap = argparse.ArgumentParser(description="Success rate of the scripted agents, per domain and goal kind.")
  ap.add_argument("--domains", default=",".join(base.env_names()))
  ap.add_argument("--split", default="heldout", choices=sorted(TASK_SEED_RANGES))
  ap.add_argument("--episodes", type=int, default=30)
  args = ap.parse_args()
  print(f"| domain | success | per goal kind |\n|---|---|---|")
  for name in args.domains.split(","):
    res = scripted_success(name, task_seeds(args.split, args.episodes))
    ok = sum(sum(v) for v in res.values())
    kinds = ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in sorted(res.items()))
    print(f"| {name} | {ok}/{args.episodes} ({100 * ok / args.episodes:.0f}%) | {kinds} |", flush=True)
