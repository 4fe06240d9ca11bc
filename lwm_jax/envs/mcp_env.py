"""The `mcp` environment: a real MCP client talking over stdio to the shop tool server.

The server (`lwm_jax.envs.mcp_server`) runs as a subprocess for the life of the env; `reset(seed)`
rebuilds its SQLite database file, so episodes do not share state. The tools declared to the agent
in an episode (a seeded subset of the server's `tools/list`, always enough for the task) form the
action space, with their real JSON schemas. An action is a JSON object
`{"tool": NAME, "arguments": {...}}`; the observation is the tool result as the server sent it.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import threading
from typing import Any

from lwm_jax.envs import base, mcp_server

_ALWAYS = ("list_tables", "describe_table", "query")
_TASK_TOOLS = {
    "order": ("search_products", "get_customer", "create_order", "list_orders"),
    "refund": ("list_orders", "refund_order", "get_customer"),
    "update": ("get_customer", "update_customer"),
    "report": (),
    "lookup": ("get_customer", "list_orders"),
}


class _Client:
  """A synchronous face over `mcp.ClientSession`, whose event loop runs in a daemon thread."""

  def __init__(self, db_path: str) -> None:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    self.loop = asyncio.new_event_loop()
    self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
    self.thread.start()
    self.session: Any = None
    self._stop: asyncio.Event | None = None
    started = threading.Event()
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "lwm_jax.envs.mcp_server", "--db", db_path],
        env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    self._devnull = open(os.devnull, "w")

    async def hold() -> None:
      self._stop = asyncio.Event()
      async with stdio_client(params, errlog=self._devnull) as (r, w):
        async with ClientSession(r, w) as s:
          await s.initialize()
          self.session = s
          started.set()
          await self._stop.wait()

    self.task = asyncio.run_coroutine_threadsafe(hold(), self.loop)
    if not started.wait(60):
      raise RuntimeError("MCP server did not start within 60 s")

  def call(self, coro_fn: Any, timeout: float = 30.0) -> Any:
    return asyncio.run_coroutine_threadsafe(coro_fn(self.session), self.loop).result(timeout)

  def close(self) -> None:
    if self._stop is not None:
      self.loop.call_soon_threadsafe(self._stop.set)
      try:
        self.task.result(10)
      except Exception:  # the server may already be gone; nothing left to release
        pass
    self.loop.call_soon_threadsafe(self.loop.stop)
    self.thread.join(5)
    self.loop.close()
    self._devnull.close()


def render_result(result: Any) -> str:
  """A tool result as text: the content blocks, with `isError` shown when the call failed."""
  texts = [getattr(c, "text", json.dumps(c.model_dump(by_alias=True, exclude_none=True)))
           for c in result.content]
  body = "\n".join(texts)
  if getattr(result, "is_error", False):
    return json.dumps({"isError": True, "content": body})
  return body


class McpEnv(base.Env):
  domain = "mcp"

  def __init__(self) -> None:
    super().__init__()
    self.tmp = tempfile.mkdtemp(prefix="lwm_mcp_")
    self.db_path = os.path.join(self.tmp, "shop.db")
    mcp_server.build_database(self.db_path, 0)
    self.client: _Client | None = _Client(self.db_path)
    listed = self.client.call(lambda s: s.list_tools())
    self.all_tools = {t.name: {"name": t.name, "description": t.description,
                               "inputSchema": t.input_schema} for t in listed.tools}

  def reset(self, seed: int) -> str:
    if self.client is None:
      raise RuntimeError("env is closed")
    rng = self._begin(seed, close=False)  # the server lives as long as the env
    if os.path.exists(self.db_path):
      os.remove(self.db_path)
    counts = mcp_server.build_database(self.db_path, seed)
    kind = rng.choice(sorted(_TASK_TOOLS))
    extra = [t for t in self.all_tools if t not in _ALWAYS and t not in _TASK_TOOLS[kind]]
    chosen = set(_ALWAYS) | set(_TASK_TOOLS[kind]) | set(rng.sample(extra, rng.randint(0, len(extra))))
    self.tools = [self.all_tools[n] for n in self.all_tools if n in chosen]
    self.goal = self._make_goal(kind, rng, seed)
    self.goal["tools"] = [t["name"] for t in self.tools]
    initial = ("Connected to MCP server 'shop-db' (SQLite shop database).\nRow counts: " +
               ", ".join(f"{k}={v}" for k, v in counts.items()))
    space = ("Call one tool per turn as a JSON object {\"tool\": NAME, \"arguments\": {...}}. "
             "Available tools (MCP tools/list):\n" + json.dumps(self.tools, indent=1))
    return self._ready(self.goal["text"], space, initial)

  def step(self, action: str) -> str:
    if self.client is None:
      raise RuntimeError("env is closed")
    self.steps += 1
    try:
      call = json.loads(action)
    except json.JSONDecodeError as e:
      return json.dumps({"error": {"code": -32700, "message": f"Parse error: {e}"}})
    if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
      return json.dumps({"error": {"code": -32600, "message": "Invalid request: expected "
                                   "{\"tool\": NAME, \"arguments\": {...}}"}})
    name, args = call["tool"], call.get("arguments")
    args = {} if args is None else args
    if not isinstance(args, dict):
      return json.dumps({"error": {"code": -32602, "message": "Invalid params: \"arguments\" must "
                                   f"be a JSON object, got {type(args).__name__}"}})
    try:
      result = self.client.call(lambda s: s.call_tool(name, args))
    except TimeoutError:
      return json.dumps({"error": {"code": -32001, "message": "Request timed out: the server did "
                                   "not answer within 30 s"}})
    return base.truncate(render_result(result), self.max_obs_chars)

  def episode_meta(self) -> dict[str, Any]:
    return {"task_kind": self.goal.get("kind"), "declared_tools": self.goal.get("tools", []),
            "server": "lwm_jax.envs.mcp_server (mcp stdio)"}

  def close(self) -> None:
    if self.client is not None:
      self.client.close()
      self.client = None
    shutil.rmtree(self.tmp, ignore_errors=True)

  def _make_goal(self, kind: str, rng: random.Random, seed: int) -> dict[str, Any]:
    import sqlite3
    con = sqlite3.connect(self.db_path)
    try:
      custs = con.execute("SELECT id, name, email FROM customers ORDER BY id").fetchall()
      prods = con.execute("SELECT id, name, stock FROM products ORDER BY id").fetchall()
      orders = con.execute("SELECT id, customer_id, status FROM orders ORDER BY id").fetchall()
    finally:
      con.close()
    cid, cname, _ = rng.choice(custs)
    if kind == "order":
      pid, pname, stock = rng.choice(prods)
      qty = rng.choice([1, 2, stock + 1 if stock < 5 else 3])
      word = pname.split()[-1].lower()
      return {"kind": kind, "customer_id": cid, "keyword": word, "quantity": qty, "product": pname,
              "text": f"Customer #{cid} ({cname}) wants to buy {qty} x '{pname}'. Place the order."}
    if kind == "refund":
      oid, ocust, _ = rng.choice(orders)
      return {"kind": kind, "order_id": oid, "customer_id": ocust,
              "text": f"Refund order #{oid} of customer #{ocust}; the item arrived broken."}
    if kind == "update":
      other = rng.choice(custs)[2]
      new = other if rng.random() < 0.3 else f"{cname.split()[0].lower()}{seed % 97}@mail.test"
      return {"kind": kind, "customer_id": cid, "email": new, "tier": rng.choice(["gold", "platinum", "silver"]),
              "text": f"Customer #{cid} changed email to {new}; update it and review their tier."}
    if kind == "report":
      return {"kind": kind, "text": "Report the revenue per product category from paid and "
                                    "shipped orders, highest first."}
    return {"kind": kind, "customer_id": cid,
            "text": f"Find customer #{cid}'s orders and say which of them are still pending."}


def _call(tool: str, **args: Any) -> str:
  return json.dumps({"tool": tool, "arguments": args})


class McpAgent(base.PlanAgent):
  """Discovers the schema, then works through the task, sometimes with bad SQL or arguments."""

  def make_plan(self, env: base.Env, initial_state: str) -> list[Any]:
    r, g = self.rng, env.goal
    tools = set(g["tools"])
    plan: list[Any] = []
    if r.random() < 0.7:
      plan.append(_call("list_tables"))
    for t in r.sample(["customers", "orders", "products", "order_items", "refunds"], r.randint(0, 2)):
      plan.append(_call("describe_table", table=t))
    if r.random() < 0.15:
      plan.append(_call("describe_table", table="order"))  # no such table
    k = g["kind"]
    if k == "order":
      plan += [_call("get_customer", customer_id=g["customer_id"]),
               _call("search_products", keyword=g["keyword"]), self._order,
               _call("list_orders", customer_id=g["customer_id"])]
      if r.random() < 0.2:
        plan.insert(-2, _call("create_order", customer_id=g["customer_id"], product_id="first", quantity=1))
    elif k == "refund":
      plan += [_call("list_orders", customer_id=g["customer_id"]),
               _call("refund_order", order_id=g["order_id"], reason="item arrived broken")]
      if r.random() < 0.4:
        plan.append(_call("refund_order", order_id=g["order_id"], reason="duplicate request"))
      plan.append(_call("query", sql=f"SELECT * FROM refunds WHERE order_id = {g['order_id']}"))
    elif k == "update":
      plan += [_call("get_customer", customer_id=g["customer_id"]),
               _call("update_customer", customer_id=g["customer_id"], email=g["email"]),
               _call("update_customer", customer_id=g["customer_id"], tier=g["tier"]),
               _call("get_customer", customer_id=g["customer_id"])]
    elif k == "report":
      bad = "SELECT category, SUM(o.amount) FROM products p JOIN orders o ON o.product_id = p.id"
      good = ("SELECT p.category, ROUND(SUM(i.quantity * i.unit_price), 2) AS revenue FROM order_items i "
              "JOIN orders o ON o.id = i.order_id JOIN products p ON p.id = i.product_id "
              "WHERE o.status IN ('paid', 'shipped') GROUP BY p.category ORDER BY revenue DESC")
      if r.random() < 0.6:
        plan.append(_call("query", sql=bad))
      if r.random() < 0.3:
        plan.append(_call("query", sql="DELETE FROM orders WHERE status = 'pending'"))
      plan += [_call("query", sql="SELECT status, COUNT(*) FROM orders GROUP BY status"), _call("query", sql=good)]
    else:
      plan += [_call("get_customer", customer_id=g["customer_id"]),
               _call("list_orders", customer_id=g["customer_id"]),
               _call("list_orders", customer_id=g["customer_id"], status="pending")]
      if r.random() < 0.3:
        plan.insert(-2, _call("get_customer", customer_id=999))
    if r.random() < 0.2:
      plan.append("{'tool': 'list_tables'}")  # not JSON: a client-side parse error
    if r.random() < 0.3:
      plan.append(_call("query", sql=r.choice([
          "SELECT name, tier FROM customers WHERE tier = 'gold'", "SELECT COUNT(*) FROM products WHERE stock = 0",
          "SELECT name, price FROM products ORDER BY price DESC LIMIT 3", "SELEC * FROM customers"])))
    self.goal = g
    # Never call an undeclared tool: drop those steps (the task tools are always declared).
    return [p for p in plan if not isinstance(p, str) or not p.startswith("{\"tool\"")
            or json.loads(p)["tool"] in tools]

  def _order(self, observation: str) -> str:
    """Orders the product that the previous search found."""
    try:
      rows = json.loads(observation)["rows"]
    except (json.JSONDecodeError, KeyError, TypeError):
      rows = []
    named = [row for row in rows if row[1] == self.goal["product"]]
    pid = (named or rows)[0][0] if rows else 1
    return _call("create_order", customer_id=self.goal["customer_id"], product_id=pid,
                 quantity=self.goal["quantity"])
