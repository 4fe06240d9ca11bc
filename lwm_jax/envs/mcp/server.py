"""A real Model Context Protocol tool server over a shop database in SQLite.

Run as `python -m lwm_jax.envs.mcp.server --db PATH`; it speaks MCP (JSON-RPC 2.0) over stdio
through the `mcp` package. Every call opens the database afresh, so the client may rebuild the
file between episodes (`mcp_env.write_database`) and keep the server process. Errors are real: SQLite
constraint violations, unknown ids, bad arguments (validated by the MCP server from the schemas).

Perturbations (`--perturb JSON` or `make_server(db, perturb={...})`, the options that
`lwm_jax.envs.perturb.real_options` produces) make the server misbehave for real, deterministically
for a seed: `error_rate` + `error_kind` (timeout, server_error, unavailable) fail that share of
tool calls, drawn per call from a hash of (seed, call number); `page_size` cuts row lists to that
many rows (saying how many there were); `withhold` drops the named fields from every result;
`rate_limit` (+ `retry_after`) rejects every call after the first `rate_limit`; `stale_refresh`
serves reads from a snapshot of the database taken at the first call and renewed every that many
calls (0: never), so writes do not show in later reads; `partial_rate` makes `update_customer`,
whose fields (email, city, tier) are the items of one batch, fail each field at that rate: a
failed field is not written, the others are, and the result lists the fields updated and an
error per field that failed (drawn per field from a hash of (seed, field number), a stream apart
from the call draws). A JSON file `PATH.perturb.json` next to
the database (`write_perturb_file`), when present, replaces these options, and rewriting it starts
the counts afresh: a client sets each episode's perturbations (and seed) that way without
restarting the server.
Perturbations change nothing when none are given: the tools, their schemas and results stay as
they are.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import time
from typing import Any

FIXED_TIME = "2024-06-01T09:00:00Z"
QUERY_SECONDS = 2.0  # the longest a tool's SQL may run
_SCHEMA = """
CREATE TABLE customers (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE,
  city TEXT NOT NULL, tier TEXT NOT NULL CHECK (tier IN ('basic', 'silver', 'gold')));
CREATE TABLE products (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, category TEXT NOT NULL,
  price REAL NOT NULL CHECK (price > 0), stock INTEGER NOT NULL CHECK (stock >= 0));
CREATE TABLE orders (
  id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
  status TEXT NOT NULL CHECK (status IN ('pending', 'paid', 'shipped', 'refunded')),
  total REAL NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE order_items (
  order_id INTEGER NOT NULL REFERENCES orders(id), product_id INTEGER NOT NULL REFERENCES products(id),
  quantity INTEGER NOT NULL CHECK (quantity > 0), unit_price REAL NOT NULL);
CREATE TABLE refunds (
  order_id INTEGER PRIMARY KEY REFERENCES orders(id), amount REAL NOT NULL, reason TEXT NOT NULL,
  created_at TEXT NOT NULL);
"""
def _rows(cur: sqlite3.Cursor, limit: int = 50) -> str:
  cols = [d[0] for d in cur.description or []]
  rows = cur.fetchmany(limit + 1)
  out = {"columns": cols, "rows": [list(r) for r in rows[:limit]], "row_count": min(len(rows), limit)}
  if len(rows) > limit:
    out["truncated"] = True
  return json.dumps(out)


ERROR_MESSAGES = {
    "timeout": "Request timed out: the server did not answer within 30 s",
    "server_error": "Internal server error (500): the request could not be completed",
    "unavailable": "Service unavailable (503): the server is overloaded; try again later",
}
_PERTURB_TYPES = {"seed": int, "error_rate": float, "error_kind": str, "page_size": int,
                  "withhold": list, "rate_limit": int, "retry_after": int, "stale_refresh": int,
                  "partial_rate": float}
# The error of one field that a partial batch failure left unwritten.
PARTIAL_MESSAGE = "Write conflict (409): the new {field} was not saved; the other fields are unaffected"


def check_perturb(opts: Any, where: str = "perturb") -> dict[str, Any]:
  """Checked perturbation options (see the module docstring); ValueError names the bad field."""
  if not isinstance(opts, dict):
    raise ValueError(f"{where}: expected a JSON object, got {type(opts).__name__}")
  out = dict(opts)
  for k, v in out.items():
    t = _PERTURB_TYPES.get(k)
    if t is None:
      raise ValueError(f"{where}.{k}: unknown option (known: {', '.join(_PERTURB_TYPES)})")
    if t is float and isinstance(v, int) and not isinstance(v, bool):
      out[k] = v = float(v)
    if isinstance(v, bool) or not isinstance(v, t) or (
        t is list and not all(isinstance(x, str) for x in v)):
      raise ValueError(f"{where}.{k}: expected {t.__name__}, got {v!r}")
  for k in ("error_rate", "partial_rate"):
    if not 0.0 <= out.get(k, 0.0) <= 1.0:
      raise ValueError(f"{where}.{k}: must be in [0, 1], got {out[k]}")
  if out.get("error_kind", "timeout") not in ERROR_MESSAGES:
    raise ValueError(f"{where}.error_kind: must be one of {', '.join(ERROR_MESSAGES)}")
  for k in ("page_size", "rate_limit"):
    if k in out and out[k] < 1:
      raise ValueError(f"{where}.{k}: must be >= 1, got {out[k]}")
  for k in ("retry_after", "stale_refresh"):
    if out.get(k, 0) < 0:
      raise ValueError(f"{where}.{k}: must be >= 0, got {out[k]}")
  return out


def perturb_file(db_path: str) -> str:
  """The side file whose options the server follows for the database at `db_path`."""
  return db_path + ".perturb.json"


def write_perturb_file(db_path: str, opts: dict[str, Any] | None) -> None:
  """Sets the perturbations of the next calls (one episode): `opts` checked and written
  atomically next to the database; None or {} removes the file (no perturbation)."""
  path = perturb_file(db_path)
  if not opts:
    if os.path.exists(path):
      os.remove(path)
    return
  text = json.dumps(check_perturb(opts), sort_keys=True)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def draw(seed: int, call: int) -> float:
  """A uniform number in [0, 1) fixed by (seed, call number): the same in every process."""
  h = hashlib.blake2b(f"{seed}/{call}".encode(), digest_size=8).digest()
  return int.from_bytes(h, "big") / 2.0 ** 64


def _withhold(value: Any, fields: set[str]) -> Any:
  if isinstance(value, dict):
    if isinstance(value.get("columns"), list) and isinstance(value.get("rows"), list):
      keep = [i for i, c in enumerate(value["columns"]) if c not in fields]
      value = dict(value, columns=[value["columns"][i] for i in keep],
                   rows=[[r[i] for i in keep] for r in value["rows"]])
    return {k: _withhold(v, fields) for k, v in value.items() if k not in fields}
  if isinstance(value, list):
    return [_withhold(v, fields) for v in value]
  return value


class Perturber:
  """The misbehaviour of one configuration (one episode when set by the side file)."""

  def __init__(self, opts: dict[str, Any], db_path: str):
    self.opts, self.db_path, self.calls, self.items = opts, db_path, 0, 0
    self.snapshot = db_path + ".stale" if "stale_refresh" in opts else None

  def before_call(self, error: type) -> None:
    """Counts the call; raises `error` when this call is rate limited or drawn to fail."""
    self.calls += 1
    o = self.opts
    if "rate_limit" in o and self.calls > o["rate_limit"]:
      raise error(f"Rate limit exceeded (429): {o['rate_limit']} calls allowed per session; "
                  f"retry after {o.get('retry_after', 30)} s")
    if draw(o.get("seed", 0), self.calls) < o.get("error_rate", 0.0):
      raise error(ERROR_MESSAGES[o.get("error_kind", "timeout")])
    if self.snapshot and (self.calls == 1 or (o["stale_refresh"] and
                                             (self.calls - 1) % o["stale_refresh"] == 0)):
      src, dst = sqlite3.connect(self.db_path), sqlite3.connect(self.snapshot)
      try:
        src.backup(dst)
      finally:
        src.close()
        dst.close()

  def failed_items(self, names: list[str]) -> dict[str, str]:
    """The items of one batch call that fail, each with its error ({} without `partial_rate`).
    Every item takes the next draw of the episode's item stream, so which ones fail depends only
    on the seed and the item's place in the episode."""
    rate = self.opts.get("partial_rate", 0.0)
    if rate <= 0:
      return {}
    out = {}
    for name in names:
      self.items += 1
      if draw(f"{self.opts.get('seed', 0)}-partial", self.items) < rate:
        out[name] = PARTIAL_MESSAGE.format(field=name)
    return out

  def read_path(self) -> str:
    return self.snapshot or self.db_path

  def after_call(self, text: str) -> str:
    o = self.opts
    if "page_size" not in o and not o.get("withhold"):
      return text
    try:
      value = json.loads(text)
    except json.JSONDecodeError:
      return text
    size = o.get("page_size")
    if size and isinstance(value, dict) and isinstance(value.get("rows"), list) and \
        len(value["rows"]) > size:
      value = dict(value, rows=value["rows"][:size], row_count=size, truncated=True,
                   page_size=size, rows_not_shown=len(value["rows"]) - size)
    if size and isinstance(value, list) and len(value) > size:
      value = value[:size] + [f"... {len(value) - size} more not shown (page size {size})"]
    if o.get("withhold"):
      value = _withhold(value, set(o["withhold"]))
    return json.dumps(value)


def make_server(db_path: str, perturb: dict[str, Any] | None = None) -> Any:
  """Builds the MCP server whose tools act on the database file at `db_path`, misbehaving as
  `perturb` (or the side file `db_path + ".perturb.json"`) says."""
  from mcp.server.mcpserver import MCPServer
  from mcp.server.mcpserver.exceptions import ToolError

  app = MCPServer("shop-db", instructions="Tools over the shop's SQLite database.")
  side = perturb_file(db_path)
  state: dict[str, Any] = {"key": None, "perturber": None}
  base_opts = check_perturb(perturb) if perturb else None
  if base_opts:
    state["perturber"] = Perturber(base_opts, db_path)

  def perturber() -> Perturber | None:
    """The current configuration: the side file's (re-read when it changes), else `perturb`."""
    try:
      st = os.stat(side)
    except FileNotFoundError:
      if state["key"] is not None:  # the side file went away: back to the start-up options
        state["key"] = None
        state["perturber"] = Perturber(base_opts, db_path) if base_opts else None
      return state["perturber"]
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    if key != state["key"]:
      with open(side, encoding="utf-8") as f:
        try:
          opts = check_perturb(json.load(f), side)
        except json.JSONDecodeError as e:
          raise ToolError(f"{side}: not valid JSON: {e}") from None
        except ValueError as e:
          raise ToolError(str(e)) from None
      state["key"], state["perturber"] = key, Perturber(opts, db_path) if opts else None
    return state["perturber"]

  def connect(read_only: bool = False, path: str = db_path) -> sqlite3.Connection:
    if read_only:  # the engine itself refuses writes, whatever the statement looks like
      con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
      con.execute("PRAGMA query_only = ON")
    else:
      con = sqlite3.connect(path)
    con.execute("PRAGMA foreign_keys = ON")
    deadline = time.monotonic() + QUERY_SECONDS
    # SQLite calls this every 10k VM steps; a non-zero answer interrupts the statement.
    con.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    return con

  def run(fn: Any, read_only: bool = False, writes: bool = False) -> str:
    p = perturber()
    if p is not None:
      p.before_call(ToolError)
    con = connect(read_only, db_path if p is None or writes else p.read_path())
    try:
      out = fn(con)
      con.commit()
      return out if p is None else p.after_call(out)
    except sqlite3.Error as e:
      con.rollback()
      if str(e) == "interrupted":
        raise ToolError(f"query interrupted: it ran longer than {QUERY_SECONDS:g} s") from None
      raise ToolError(f"sqlite3.{type(e).__name__}: {e}") from None
    finally:
      con.close()

  @app.tool()
  def list_tables() -> str:
    """Lists the tables of the shop database."""
    return run(lambda c: json.dumps([r[0] for r in c.execute(
        "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]))

  @app.tool()
  def describe_table(table: str) -> str:
    """Shows the columns (name, type, not-null, primary key) of one table."""
    def fn(c: sqlite3.Connection) -> str:
      cols = c.execute("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?)", (table,)).fetchall()
      if not cols:
        raise ToolError(f"no such table: {table}")
      return json.dumps([{"name": n, "type": t, "not_null": bool(nn), "primary_key": bool(pk)}
                         for n, t, nn, pk in cols])
    return run(fn)

  @app.tool()
  def query(sql: str) -> str:
    """Runs one read-only SELECT statement and returns up to 50 rows."""
    if not sql.lstrip().lower().startswith(("select", "with")):
      raise ToolError("only SELECT statements are allowed; use the write tools to change data")
    return run(lambda c: _rows(c.execute(sql)), read_only=True)

  @app.tool()
  def get_customer(customer_id: int) -> str:
    """Returns one customer by id."""
    def fn(c: sqlite3.Connection) -> str:
      r = c.execute("SELECT id, name, email, city, tier FROM customers WHERE id=?", (customer_id,)).fetchone()
      if r is None:
        raise ToolError(f"customer {customer_id} not found")
      return json.dumps(dict(zip(("id", "name", "email", "city", "tier"), r)))
    return run(fn)

  @app.tool()
  def search_products(keyword: str, max_price: float | None = None) -> str:
    """Finds products whose name or category contains `keyword`, optionally under a price."""
    def fn(c: sqlite3.Connection) -> str:
      sql = ("SELECT id, name, category, price, stock FROM products WHERE (name LIKE ? OR category LIKE ?)")
      args: list[Any] = [f"%{keyword}%", f"%{keyword}%"]
      if max_price is not None:
        sql += " AND price <= ?"
        args.append(max_price)
      return _rows(c.execute(sql + " ORDER BY id", args))
    return run(fn)

  @app.tool()
  def list_orders(customer_id: int, status: str | None = None) -> str:
    """Lists a customer's orders, optionally only those with one status."""
    sql = "SELECT id, status, total, created_at FROM orders WHERE customer_id=?"
    args: list[Any] = [customer_id]
    if status is not None:
      sql += " AND status=?"
      args.append(status)
    return run(lambda c: _rows(c.execute(sql + " ORDER BY id", args)))

  @app.tool()
  def create_order(customer_id: int, product_id: int, quantity: int) -> str:
    """Places a paid order of `quantity` units of one product and takes them from stock."""
    def fn(c: sqlite3.Connection) -> str:
      p = c.execute("SELECT price, stock, name FROM products WHERE id=?", (product_id,)).fetchone()
      if p is None:
        raise ToolError(f"product {product_id} not found")
      oid = (c.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM orders").fetchone()[0])
      total = round(p[0] * quantity, 2)
      c.execute("INSERT INTO orders VALUES (?,?,?,?,?)", (oid, customer_id, "paid", total, FIXED_TIME))
      c.execute("INSERT INTO order_items VALUES (?,?,?,?)", (oid, product_id, quantity, p[0]))
      c.execute("UPDATE products SET stock = stock - ? WHERE id=?", (quantity, product_id))
      return json.dumps({"order_id": oid, "status": "paid", "product": p[2], "quantity": quantity,
                         "total": total, "stock_left": p[1] - quantity})
    return run(fn, writes=True)

  @app.tool()
  def update_customer(customer_id: int, email: str | None = None, city: str | None = None,
                      tier: str | None = None) -> str:
    """Changes a customer's email, city or tier (basic, silver, gold)."""
    def fn(c: sqlite3.Connection) -> str:
      fields = {k: v for k, v in (("email", email), ("city", city), ("tier", tier)) if v is not None}
      if not fields:
        raise ToolError("nothing to update: give email, city or tier")
      if c.execute("SELECT 1 FROM customers WHERE id=?", (customer_id,)).fetchone() is None:
        raise ToolError(f"customer {customer_id} not found")
      # A partial batch failure: each field is one item; those drawn to fail are not written.
      # A real refusal (UNIQUE email, tier CHECK) of a field that is written still fails the call.
      p = state["perturber"]
      failed = p.failed_items(list(fields)) if p is not None else {}
      done = {k: v for k, v in fields.items() if k not in failed}
      if done:
        sets = ", ".join(f"{k}=?" for k in done)
        c.execute(f"UPDATE customers SET {sets} WHERE id=?", (*done.values(), customer_id))
      r = c.execute("SELECT id, name, email, city, tier FROM customers WHERE id=?", (customer_id,)).fetchone()
      out: dict[str, Any] = {"updated": sorted(done)}
      if failed:
        out["failed"] = {k: failed[k] for k in sorted(failed)}
      out["customer"] = dict(zip(("id", "name", "email", "city", "tier"), r))
      return json.dumps(out)
    return run(fn, writes=True)

  @app.tool()
  def refund_order(order_id: int, reason: str) -> str:
    """Refunds a paid or shipped order in full and marks it refunded."""
    def fn(c: sqlite3.Connection) -> str:
      o = c.execute("SELECT status, total FROM orders WHERE id=?", (order_id,)).fetchone()
      if o is None:
        raise ToolError(f"order {order_id} not found")
      if o[0] == "pending":
        raise ToolError(f"order {order_id} is pending and has not been paid; nothing to refund")
      c.execute("INSERT INTO refunds VALUES (?,?,?,?)", (order_id, o[1], reason, FIXED_TIME))
      c.execute("UPDATE orders SET status='refunded' WHERE id=?", (order_id,))
      return json.dumps({"order_id": order_id, "refunded": o[1], "status": "refunded"})
    return run(fn, writes=True)

  return app


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--db", required=True, help="SQLite database file the tools act on")
  ap.add_argument("--perturb", default="", help="perturbation options as a JSON object, e.g. "
                  "'{\"error_rate\": 0.2, \"error_kind\": \"timeout\", \"seed\": 3}'")
  args = ap.parse_args()
  try:
    perturb = check_perturb(json.loads(args.perturb), "--perturb") if args.perturb else None
  except (json.JSONDecodeError, ValueError) as e:
    ap.error(f"--perturb: {e}")
  make_server(args.db, perturb).run("stdio")


if __name__ == "__main__":
  main()
