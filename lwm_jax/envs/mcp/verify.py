"""The mcp domain's task verifiers (the record's `verifier` and `transcript_verifier`).

`check(env, goal, turns)` judges a finished episode on the real environment's state;
`check_transcript(env, goal, turns)` judges it from the transcript alone, with `env` only reset to
the episode's world. What each checks is listed in `lwm_jax/envs/verify.py` and
`lwm_jax/envs/verify_transcript.py`, which dispatch to these through the domain registry.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from lwm_jax.envs import verify as V
from lwm_jax.envs.verify import Turns, Verdict, _v


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


def check(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
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


def _json(o: str) -> Any:
  try:
    return json.loads(o)
  except json.JSONDecodeError:
    return None


def check_transcript(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  con = sqlite3.connect(f"file:{env.db_path}?mode=ro", uri=True)  # the re-created world, untouched
  try:
    q = _mcp_question(g, con, turns)
  finally:
    con.close()
  if q is not None:
    return q
  tables, calls = env.world["tables"], _calls(turns)
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
