"""Task verdicts from a transcript alone, for episodes without a real state (simulated episodes).

`check_transcript(domain, seed, history)` re-creates the world and the goal of `seed` with a
fresh real environment (`reset` only; none of the agent's actions is replayed) and judges the
recorded turns. Question tasks use the same rules as `verify.check` (they read the answer from
the transcript in both modes). A task that changes state is judged from the LAST observation
that shows that state, as the simulated environment reported it:

  terminal  count_errors: the last command that printed report.txt (cat/head/tail, no
            redirection) shows the right count on its first line; backup_csv: the last `ls` that
            names the backup folder lists every CSV of the data folder; rename_notes: the last
            `ls` that shows any of the notes lists every note as .md and none as .txt.
  swe       after the last successful edit, every test run exited 0 and at least one of them
            covers the failing test (the whole suite, its file or its node id); no `edit` touched
            a file under tests/. (The real-state check runs the whole suite instead.)
  web       buy: the account page lists an order of the product x quantity with the shipping and
            address asked for; no stock for the quantity: no order of the product was placed
            and the shop's refusal was shown.
  android   the last screen of the app concerned: the contact list names the contact and the
            form saved just before it held the name and phone; the alarm list shows the alarm
            switched on; the settings screen shows the switch flipped and the brightness above
            its start; the notes list names the note; the contact list no longer names the
            deleted contact and still names every other one.
  os        edit: a "Saved FILE" status line with the added line in the editor's text; mkdir,
            rename, delete: the last file-manager listing of the folder concerned; theme: the last
            settings window shows the theme asked for and a volume below its start.
  mcp       the tool results: a create_order result for the customer, product and quantity; a
            refund_order result for the order; an update_customer result with the new email.
            Refused changes (too little stock, a pending order, a taken email) succeed when no
            such result appears and the refusal does.

A simulated environment that reports success it did not achieve fools these rules; the verdicts
are only as good as the world model's fidelity, which the fidelity report measures.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
from typing import Any, Callable, Iterable, Iterator

from lwm_jax import domains
from lwm_jax.envs import base
from lwm_jax.envs import verify as V


def check_transcript(domain: str, seed: int, history: Iterable[Any],
                     env: base.Env | None = None) -> V.Verdict:
  """Verdict on a recorded episode of `domain` at `seed` from its turns alone (see the module
  docstring). `env` (a real env of that domain, reused across calls) is reset to `seed`."""
  turns = V._turns(history)
  with _world(domain, seed, env) as env:
    return _rule(domain)(env, env.goal, turns)


def check_trajectory(traj: Any, env: base.Env | None = None) -> V.Verdict:
  """`check_transcript` of a recorded `schema.Trajectory`; its seed comes from `meta["seed"]`."""
  return check_transcript(traj.domain, _seed_of(traj), traj.turns, env)


def solved_turns(traj: Any, env: base.Env | None = None) -> int | None:
  """The number of turns after which the recorded trajectory `traj` first meets its task (the
  transcript rules of `check_transcript` on each prefix, one `reset`), or None if it never does."""
  turns = V._turns(traj.turns)
  with _world(traj.domain, _seed_of(traj), env) as env:
    return next((k for k in range(1, len(turns) + 1)
                 if _rule(traj.domain)(env, env.goal, turns[:k]).success), None)


@contextlib.contextmanager
def _world(domain: str, seed: int, env: base.Env | None) -> Iterator[base.Env]:
  """`env` (or a fresh real env of `domain`, closed afterwards) reset to the world of `seed`."""
  if domain not in verified_domains():
    raise ValueError(f"no transcript verifier for environment {domain!r} "
                     f"(expected one of {', '.join(verified_domains())})")
  own = env is None
  env = env or base.make_env(domain)
  try:
    if env.domain != domain:
      raise ValueError(f"env is a {env.domain!r} environment, not {domain!r}")
    env.reset(seed)
    yield env
  finally:
    if own:
      env.close()


def _seed_of(traj: Any) -> int:
  seed = traj.meta.get("seed")
  if not isinstance(seed, int):
    raise ValueError(f"trajectory {traj.id}: meta['seed'] is missing or not an integer ({seed!r}); "
                     "the world of the episode cannot be re-created without it")
  return seed


def _last(turns: V.Turns, pred: Callable[[str, str], bool]) -> tuple[str, str] | None:
  for a, o in reversed(turns):
    if pred(a, o):
      return a, o
  return None


# -- terminal -------------------------------------------------------------------------------------
def _terminal(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  files, lay = env.files, env.layout
  q = V._terminal_question(g, files, lay, turns)
  if q is not None:
    return q
  k = g["kind"]
  if k == "count_errors":
    n = sum("ERROR" in l for l in files[lay["log"]].splitlines())
    hit = _last(turns, lambda a, o: re.search(r"\b(cat|head|tail)\b[^>|]*report\.txt", a) is not None
                and ">" not in a)
    if hit is None:
      return V._v(False, 0, f"report.txt never printed; the log has {n} ERROR lines")
    out = V.shell_output(hit[1])
    first = out[0].strip() if out else ""
    return V._v(first == str(n), 0, f"report.txt printed as {first[:40]!r}; the log has {n} ERROR lines")
  if k == "backup_csv":
    names = sorted(os.path.basename(p) for p in files if p.startswith(lay["data"] + "/") and p.endswith(".csv"))
    hit = _last(turns, lambda a, o: a.lstrip().startswith("ls") and g["backup"] in a)
    shown = set(" ".join(V.shell_output(hit[1])).split()) if hit else set()
    return V._share(sum(n in shown for n in names), len(names),
                    f"CSV files listed in the last `ls` of {g['backup']}/")
  if k == "rename_notes":
    txts = sorted(os.path.basename(p) for p in files if os.path.dirname(p) == lay["notes"] and p.endswith(".txt"))
    mds = [t[:-4] + ".md" for t in txts]
    hit = _last(turns, lambda a, o: a.lstrip().startswith("ls")
                and any(x in o.split() for x in txts + mds))
    shown = set(" ".join(V.shell_output(hit[1])).split()) if hit else set()
    done = sum(m in shown and t not in shown for t, m in zip(txts, mds))
    return V._share(done, len(txts), "notes shown renamed to .md in the last listing")
  raise ValueError(f"terminal: unknown goal kind {k!r}")


# -- swe ------------------------------------------------------------------------------------------
def _swe(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  edited = [a for a in turns if re.match(r"\s*edit\(\s*(path\s*=\s*)?['\"]tests/", a[0])]
  if edited:
    return V._v(False, 0, "an edit changed a test file")
  last_edit = max((i for i, (a, o) in enumerate(turns) if o.startswith("Edited ")), default=-1)
  runs = [(a, o) for a, o in turns[last_edit + 1:] if re.match(r"\s*run_tests\(", a)]
  target = re.compile(r"\s*run_tests\(\s*(target\s*=\s*)?(['\"](tests/?|" + re.escape(g["test_path"])
                      + "(::" + re.escape(g["test"]) + r")?)['\"])?\s*\)\s*$")
  covering = [o for a, o in runs if target.match(a)]
  if not covering:
    return V._v(False, 0, f"no test run after the last edit covers {g['test']}")
  passed, failed = V._pytest_counts(runs[-1][1])
  ok = all(o.rstrip().endswith("[exit code 0]") for _, o in runs)
  return V._v(ok, passed / max(passed + failed, 1),
              f"{len(runs)} test runs after the last edit, {len(covering)} covering {g['test']}; "
              f"{'all passed' if ok else 'not all passed'}")


# -- web ------------------------------------------------------------------------------------------
def _web(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  world = env.server.state.world
  if g["kind"] == "cheapest":
    return V._web_cheapest(world, g, turns)
  if g["kind"] == "account":
    ok = V._web_account_seen(g, turns)
    return V._v(ok, 0, f"account page of {g['user']} {'shown' if ok else 'never shown'}")
  prod = next(p for p in world["products"] if p["name"] == g["product"])
  placed = [o for _, o in turns if o.startswith('Page "Account - Shop"') and re.search(r'alert "Order #\d+ placed', o)]
  line = f"({g['product']} x {g['qty']}), {g['shipping']} to {g['address']}"
  if prod["stock"] < g["qty"]:
    bought = any(g["product"] in o for o in placed)
    refused = V._web_refused(g, turns)
    return V._v(not bought and refused, 0, f"only {prod['stock']} in stock: order of it "
                                           f"{'shown' if bought else 'not shown'}, refusal {'seen' if refused else 'not seen'}")
  ok = any(line in o for o in placed)
  return V._v(ok, 0.5 if placed else 0, f"{len(placed)} order confirmations; "
                                        f"{'one' if ok else 'none'} lists {line}")


# -- android --------------------------------------------------------------------------------------
def _screen(o: str) -> str:
  m = re.search(r'screen="([^"]+)"', o.split("\n", 1)[0] if not o.startswith("Error") else o)
  return m.group(1) if m else ""


def _android(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  start = env.initial_world
  k = g["kind"]
  last = lambda screen: _last(turns, lambda a, o: _screen(o) == screen)
  if k in ("add_contact", "delete_contact"):
    hit = last("Contacts")
    names = set(re.findall(r'text="([^"]*)" clickable', hit[1])) if hit else set()
    if k == "delete_contact":
      others = [c["name"] for c in start["contacts"] if c["name"] != g["victim"]]
      kept = sum(n in names for n in others)
      gone = hit is not None and g["victim"] not in names
      return V._v(gone and kept == len(others), 0.5 * gone + 0.5 * kept / max(len(others), 1),
                  f"last contact list: {g['victim']} {'absent' if gone else 'present or never shown'}, "
                  f"{kept} of {len(others)} others shown")
    i = turns.index(hit) if hit else -1
    form = _last(turns[:i], lambda a, o: _screen(o) == "Contacts:edit") if hit else None
    filled = form is not None and f'text="{g["name"]}" hint="Name"' in form[1] \
        and f'text="{g["phone"]}" hint="Phone"' in form[1]
    listed = g["name"] in names
    return V._v(listed and filled, 0.5 * listed, f"{g['name']} {'listed' if listed else 'not listed'}; "
                                                 f"saved form {'matches' if filled else 'does not match'}")
  if k == "alarm":
    hit = last("Clock")
    t = f"{g['hour']:02d}:{g['minute']:02d}"
    m = hit and re.search(rf'text="{t} {re.escape(g["label"])}" />\n[^\n]*checked="(true|false)"', hit[1])
    return V._v(bool(m) and m.group(1) == "true", 0.5 * bool(m),
                f"alarm {t} {g['label']} {'shown ' + ('on' if m.group(1) == 'true' else 'off') if m else 'not shown'}")
  if k == "settings":
    hit = last("Settings")
    if hit is None:
      return V._v(False, 0, "the settings screen was never shown")
    m = re.search(rf'text="{re.escape(g["toggle"])}" checked="(true|false)"', hit[1])
    b = re.search(r'text="Brightness" progress="(\d+)"', hit[1])
    flipped = bool(m) and (m.group(1) == "true") != start["settings"][g["toggle"]]
    brighter = bool(b) and int(b.group(1)) > start["settings"]["brightness"]
    return V._v(flipped and brighter, (flipped + brighter) / 2,
                f"last settings screen: {g['toggle']} {'flipped' if flipped else 'not flipped'}, "
                f"brightness {'raised' if brighter else 'not raised'}")
  if k == "note":
    hit = last("Notes")
    ok = bool(hit) and f'text="{g["note"]}"' in hit[1]
    return V._v(ok, 0, f"note {g['note']!r} {'listed' if ok else 'not listed'} on the last notes screen")
  raise ValueError(f"android: unknown goal kind {k!r}")


# -- os -------------------------------------------------------------------------------------------
def _os(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  world, shown_home = env.world, env.home_shown
  k = g["kind"]

  def listing(folder: str) -> set[str] | None:
    head = f'window "Files - {shown_home}/{folder}" app=Files'
    hit = _last(turns, lambda a, o: o.split("\n", 1)[0].startswith(head)
                or o.startswith("Error") and head in o)
    return set(re.findall(r'listitem "([^"]*)"', hit[1])) if hit else None

  if k == "edit":
    name = os.path.basename(g["file"])
    saved = [o for _, o in turns if f'statusbar "Saved {name}"' in o]
    ok = any(g["line"] in re.findall(r'textarea "(.*)"', o)[0].split("\\n")
             for o in saved if re.findall(r'textarea "(.*)"', o))
    return V._v(ok, 0.5 * bool(saved), f"{len(saved)} saves of {name}; the line "
                                       f"{'is' if ok else 'is not'} in the saved text")
  if k == "mkdir":
    items = listing("Documents")
    ok = items is not None and g["folder"] in items
    return V._v(ok, 0, f"last listing of Documents {'shows' if ok else 'lacks'} {g['folder']}")
  if k == "theme":
    want = "Light" if world["settings"]["theme"] == "Dark" else "Dark"
    hit = _last(turns, lambda a, o: o.split("\n", 1)[0].startswith('window "Settings"'))
    if hit is None:
      return V._v(False, 0, "the settings window was never shown")
    themed = f'radio "{want}" checked=yes' in hit[1]
    v = re.search(r'slider "Volume" value=(\d+)', hit[1])
    quieter = bool(v) and int(v.group(1)) < world["settings"]["volume"]
    return V._v(themed and quieter, (themed + quieter) / 2,
                f"last settings window: theme {want} {'on' if themed else 'off'}, volume "
                f"{'lowered' if quieter else 'not lowered'}")
  folder, fname = g["file"].split("/")
  items = listing(folder)
  if items is None:
    return V._v(False, 0, f"{folder} was never listed")
  if k == "rename":
    ok = g["newname"] in items and fname not in items
    return V._v(ok, 0.5 * (g["newname"] in items), f"last listing of {folder}: {sorted(items)}")
  if k == "delete":
    others = [p.split("/")[1] for p in world["files"] if p.startswith(folder + "/") and p != g["file"]]
    ok = fname not in items and all(n in items for n in others)
    return V._v(ok, 0.5 * (fname not in items), f"last listing of {folder}: {sorted(items)}")
  raise ValueError(f"os: unknown goal kind {k!r}")


# -- mcp ------------------------------------------------------------------------------------------
def _json(o: str) -> Any:
  try:
    return json.loads(o)
  except json.JSONDecodeError:
    return None


def _mcp(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  con = sqlite3.connect(f"file:{env.db_path}?mode=ro", uri=True)  # the re-created world, untouched
  try:
    q = V._mcp_question(g, con, turns)
  finally:
    con.close()
  if q is not None:
    return q
  tables, calls = env.world["tables"], V._calls(turns)
  refused = lambda word: any('"isError": true' in o and word in o for _, o in turns)
  results = lambda tool: [(a, r) for t, a, o in calls if t == tool for r in [_json(o)] if isinstance(r, dict)
                          and not r.get("isError")]
  k = g["kind"]
  if k == "order":
    prod = next(p for p in tables["products"] if p[1] == g["product"])
    made = [(a, r) for a, r in results("create_order") if r.get("product") == g["product"]]
    if prod[4] < g["quantity"]:
      seen = refused("CHECK constraint")
      return V._v(not made and seen, 0, f"stock {prod[4]} < {g['quantity']}: {len(made)} orders of it "
                                        f"reported, refusal {'seen' if seen else 'not seen'}")
    ok = any(a.get("customer_id") == g["customer_id"] and r.get("quantity") == g["quantity"] for a, r in made)
    return V._v(ok, 0.5 * bool(made), f"{len(made)} create_order results for '{g['product']}'")
  if k == "refund":
    before = next(o[2] for o in tables["orders"] if o[0] == g["order_id"])
    done = any(r.get("order_id") == g["order_id"] and r.get("status") == "refunded"
               for _, r in results("refund_order"))
    if before == "pending":
      seen = refused("pending")
      return V._v(not done and seen, 0, f"order #{g['order_id']} was pending: refusal {'seen' if seen else 'not seen'}")
    if before == "refunded":
      return V._v(True, 1, f"order #{g['order_id']} was already refunded")
    return V._v(done, 0, f"refund of order #{g['order_id']} {'reported' if done else 'not reported'}")
  if k == "update":
    cid = g["customer_id"]
    done = any((r.get("customer") or {}).get("id") == cid and r["customer"].get("email") == g["email"]
               for _, r in results("update_customer"))
    owner = next((c[0] for c in tables["customers"] if c[2] == g["email"]), None)
    if owner is not None and owner != cid:
      seen = refused("UNIQUE")
      return V._v(not done and seen, 0, f"{g['email']} belongs to #{owner}: refusal {'seen' if seen else 'not seen'}")
    return V._v(done, 0, f"email update of #{cid} {'reported' if done else 'not reported'}")
  raise ValueError(f"mcp: unknown goal kind {k!r}")


def _search(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  return V._check_search_turns(g, turns)


def verified_domains() -> tuple[str, ...]:
  """The registered domains with a transcript verifier (their record's `transcript_verifier`)."""
  return tuple(d.name for d in domains.domains() if d.transcript_verifier)


def _rule(domain: str) -> Callable[[Any, dict[str, Any], V.Turns], V.Verdict]:
  return domains.get_domain(domain).load("transcript_verifier")
