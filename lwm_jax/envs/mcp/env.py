"""The `mcp` environment: a real MCP client talking over stdio to the shop tool server.

The server (`lwm_jax.envs.mcp.server`) runs as a subprocess for the life of the env; `reset(seed)`
rebuilds its SQLite database file from the seed's generated world (`generate_world`: a fictional
business with 300-500 rows over five related tables), so episodes do not share state. The tools declared to the agent
in an episode (a seeded subset of the server's `tools/list`, always enough for the task) form the
action space, with their real JSON schemas. An action is a JSON object
`{"tool": NAME, "arguments": {...}}`; the observation is the tool result as the server sent it.
Perturbations (`set_perturb(spec)` or `McpEnv(perturb=spec)`; see docs/perturbations.md) are set
per episode at reset through the server's side file (`mcp_server.write_perturb_file`), seeded
with the episode seed.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
import sys
import tempfile
import threading
from typing import Any

import lwm_jax
from lwm_jax.envs import base
from lwm_jax.envs.mcp import server as mcp_server
from lwm_jax.envs.perturb import Perturbable

_ALWAYS = ("list_tables", "describe_table", "query")
_TASK_TOOLS = {
    "order": ("search_products", "get_customer", "create_order", "list_orders"),
    "refund": ("list_orders", "refund_order", "get_customer"),
    "update": ("get_customer", "update_customer"),
    "report": (),
    "lookup": ("get_customer", "list_orders"),
}


# -- the generated business --------------------------------------------------------------------------
# Each kind of business: (description, {category: {product noun: the modifiers that suit it}}).
_TRADES = {
    "electronics": ("an electronics accessories shop", {
        "cables": {"Cable": "USB-C|HDMI|Braided USB-C|Lightning", "Adapter": "Travel|USB-C to HDMI|Ethernet"},
        "desk": {"Laptop Stand": "Aluminium|Folding|Adjustable", "Desk Lamp": "LED|Clip-on|Dimmable"},
        "input": {"Mouse": "Wireless|Ergonomic|Travel", "Keyboard": "Mechanical|Compact|Wireless"},
        "audio": {"Headset": "Studio|Wireless|Gaming", "Speaker": "Bluetooth|Desk|Waterproof",
                  "Microphone": "USB|Clip-on"},
        "power": {"Charger": "Wall|Fast|Dual-port", "Power Bank": "Slim|20000mAh|Solar"},
        "video": {"Webcam": "HD|4K|Wide-angle", "Monitor": "27in|24in|Portable"}}),
    "outdoor": ("an outdoor gear retailer", {
        "camping": {"Tent": "Two-person|Ultralight|Family", "Sleeping Bag": "Summer|Down|Three-season",
                    "Stove": "Camp|Backpacking"},
        "hiking": {"Backpack": "Trail|Daypack|Alpine", "Trekking Pole": "Carbon|Folding",
                   "Water Filter": "Squeeze|Pump"},
        "clothing": {"Rain Jacket": "Packable|Storm|Breathable", "Fleece": "Midweight|Grid",
                     "Socks": "Wool|Hiking"},
        "climbing": {"Harness": "Sport|Alpine", "Carabiner": "Locking|Wiregate", "Chalk Bag": "Canvas|Belt"},
        "water": {"Dry Bag": "20L|10L|Roll-top", "Life Vest": "Touring|Kids"}}),
    "coffee": ("a coffee roaster and cafe supplier", {
        "beans": {"Espresso Blend": "House|Dark|Velvet", "Single Origin": "Ethiopian|Colombian|Kenyan",
                  "Decaf": "Swiss Water|Mountain"},
        "brewing": {"French Press": "Glass|Steel", "Pour-Over Kit": "Ceramic|Glass", "Moka Pot": "3-cup|6-cup"},
        "grinders": {"Grinder": "Burr|Hand|Conical Burr"},
        "cups": {"Mug": "Ceramic|Enamel|Stoneware", "Travel Cup": "Insulated|Bamboo"},
        "tea": {"Green Tea": "Sencha|Jasmine", "Chai": "Spiced|Masala", "Herbal Tea": "Mint|Chamomile"}}),
    "books": ("an independent bookshop", {
        "fiction": {"Mystery": "Harbour|Winter|Locked Room", "Novel": "Debut|Historical|Coastal"},
        "history": {"Atlas": "Historical|Ocean|World", "Biography": "Illustrated|Short"},
        "science": {"Field Guide": "Bird|Mushroom|Seashore|Tree", "Primer": "Physics|Astronomy|Geology"},
        "children": {"Picture Book": "Bedtime|Animal|Counting", "Activity Book": "Sticker|Puzzle"},
        "cooking": {"Cookbook": "Vegetarian|Baking|Weeknight|Street Food"}}),
    "pets": ("a pet supplies store", {
        "dogs": {"Leash": "Reflective|Rope|Retractable", "Dog Bed": "Orthopedic|Cooling|Plush",
                 "Chew Toy": "Rubber|Rope"},
        "cats": {"Scratching Post": "Sisal|Tall", "Cat Tunnel": "Crinkle|Folding", "Litter Tray": "Hooded|Corner"},
        "food": {"Kibble": "Grain-free|Senior|Puppy", "Treats": "Salmon|Chicken|Dental"},
        "aquarium": {"Fish Tank": "20L|60L|Nano", "Water Pump": "Quiet|Mini"},
        "grooming": {"Brush": "Slicker|Bristle|Deshedding", "Shampoo": "Oatmeal|Gentle"}}),
    "bikes": ("a bicycle shop", {
        "parts": {"Chain": "8-speed|11-speed", "Brake Pads": "Disc|Rim", "Inner Tube": "Road|Mountain|Gravel"},
        "accessories": {"Bell": "Brass|Compact", "Bottle Cage": "Carbon|Alloy", "Pannier": "Waterproof|Commuter"},
        "safety": {"Helmet": "Commuter|Road|Kids", "Rear Light": "USB|Radar", "Front Light": "800-lumen|Commuter"},
        "tools": {"Pump": "Floor|Mini", "Multi Tool": "Compact|16-function", "Tyre Levers": "Plastic|Steel"},
        "apparel": {"Gloves": "Winter|Fingerless", "Jersey": "Road|Merino"}}),
    "stationery": ("a stationery and art supplies shop", {
        "paper": {"Notebook": "Dotted|Recycled|Linen", "Sketchbook": "A4|Pocket|Watercolour",
                  "Envelopes": "Kraft|Pastel"},
        "pens": {"Fountain Pen": "Brass|Student|Pastel", "Gel Pen": "Fine|Retractable", "Fineliner": "Archival|0.3mm"},
        "paint": {"Watercolour Set": "Travel|Studio", "Brush Set": "Synthetic|Sable", "Acrylic Paint": "Primary|Neon"},
        "desk": {"Stapler": "Long-reach|Mini", "Desk Tray": "Bamboo|Steel"},
        "cards": {"Greeting Card": "Birthday|Thank-you|Blank", "Postcards": "Vintage|Botanical"}}),
    "home": ("a home and kitchen store", {
        "kitchen": {"Skillet": "Cast Iron|Carbon Steel|Nonstick", "Cutting Board": "Oak|Bamboo|Walnut",
                    "Knife Set": "Chef|Steak"},
        "bath": {"Towel": "Cotton|Waffle|Linen", "Bath Mat": "Cotton|Cedar"},
        "decor": {"Vase": "Stoneware|Glass|Bud", "Candle": "Beeswax|Soy|Pillar", "Picture Frame": "Oak|Brass"},
        "storage": {"Basket": "Woven|Wire", "Jar Set": "Glass|Enamel"},
        "textiles": {"Throw": "Wool|Linen|Knitted", "Cushion": "Velvet|Linen"}}),
}
_NAME_A = ["Larkspur", "Beacon", "Tidewater", "Copper Kettle", "Maple Row", "Bluestem", "Foxglove", "Granite",
           "Saltmarsh", "Kestrel", "Orchard Lane", "Brightwater", "Ironbridge", "Wren & Finch", "Cedar Hill"]
_NAME_B = ["Supply", "Trading Co.", "Goods", "Outfitters", "& Sons", "Collective", "Depot", "Market"]
_FIRST = ["Ana", "Ben", "Chloe", "Dmitri", "Elif", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kemi", "Luca",
          "Maya", "Nils", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Uma", "Viktor", "Wen", "Ximena",
          "Yusuf", "Zara", "Aiko", "Bruno", "Carmen", "Dara", "Emeka", "Freya", "Goran", "Hana", "Idris"]
_LAST = ["Silva", "Novak", "Okafor", "Berg", "Tanaka", "Moreau", "Khan", "Rossi", "Weber", "Lund", "Costa",
         "Haddad", "Ivanova", "Jensen", "Kowalski", "Mendez", "Nakamura", "Olsen", "Petrov", "Quist", "Reyes",
         "Sato", "Torres", "Varga", "Walsh"]
_CITIES = ["Lisbon", "Oslo", "Lagos", "Kyoto", "Lyon", "Austin", "Pune", "Graz", "Porto", "Tartu", "Cork",
           "Leeds", "Bergen", "Quito", "Perth", "Malmo", "Ghent", "Brno", "Denver", "Halifax", "Nantes", "Turku"]
_MAIL = ["example.com", "mail.test", "post.example", "inbox.test"]
_REFUND_REASONS = ["damaged item", "arrived late", "wrong size", "changed mind", "duplicate order",
                   "missing parts"]
_TABLES = ("customers", "products", "orders", "order_items", "refunds")
MIN_ROWS, MAX_ROWS = 300, 500


def generate_world(seed: int) -> dict[str, Any]:
  """The fictional business database of world `seed`: a trade, a name and 300-500 rows over
  customers, products, orders, order items and refunds whose foreign keys all resolve."""
  rng = random.Random(f"mcp-world-{seed}")
  trade = rng.choice(sorted(_TRADES))
  desc, cats = _TRADES[trade]
  business = f"{rng.choice(_NAME_A)} {rng.choice(_NAME_B)}"
  people = rng.sample([f"{f} {l}" for f in _FIRST for l in _LAST], rng.randint(35, 70))
  customers = [[i, name, f"{name.lower().replace(' ', '.')}@{rng.choice(_MAIL)}", rng.choice(_CITIES),
                rng.choice(["basic", "basic", "basic", "silver", "silver", "gold"])]
               for i, name in enumerate(people, 1)]
  catalogue = [(f"{m} {n}", c) for c in sorted(cats) for n, mods in cats[c].items() for m in mods.split("|")]
  pairs = rng.sample(catalogue, rng.randint(18, min(28, len(catalogue))))
  products = [[i, name, cat, round(rng.uniform(4, 260), 2), rng.choice([0, 0, 3, 5, 12, 25, 40, 80])]
              for i, (name, cat) in enumerate(sorted(pairs, key=lambda p: (p[1], p[0])), 1)]
  weights = [rng.choice([1, 1, 2, 4]) for _ in customers]  # some customers order far more often
  orders: list[list[Any]] = []
  items: list[list[Any]] = []
  refunds: list[list[Any]] = []
  target = rng.randint(MIN_ROWS, MAX_ROWS - 10)
  while len(customers) + len(products) + len(orders) + len(items) + len(refunds) < target:
    oid = len(orders) + 1
    cust = rng.choices(range(1, len(customers) + 1), weights)[0]
    status = rng.choice(["pending", "paid", "paid", "shipped", "shipped", "refunded"])
    month, day = rng.randint(1, 5), rng.randint(1, 28)
    created = f"2024-{month:02d}-{day:02d}T{rng.randint(8, 20):02d}:{rng.choice(['00', '15', '30', '45'])}:00Z"
    total = 0.0
    for pid in sorted(rng.sample(range(1, len(products) + 1), rng.choice([1, 1, 1, 2, 2, 3]))):
      qty, price = rng.choice([1, 1, 2, 3]), products[pid - 1][3]
      items.append([oid, pid, qty, price])
      total += qty * price
    orders.append([oid, cust, status, round(total, 2), created])
    if status == "refunded":
      refunds.append([oid, round(total, 2), rng.choice(_REFUND_REASONS),
                      f"2024-{min(month + 1, 5):02d}-{min(day + 3, 28):02d}T12:00:00Z"])
  return {"business": business, "trade": trade, "description": desc,
          "tables": {"customers": customers, "products": products, "orders": orders,
                     "order_items": items, "refunds": refunds}}


def write_database(path: str, world: dict[str, Any]) -> dict[str, int]:
  """Writes `world`'s tables into a fresh SQLite file at `path` (the tool server's schema, foreign
  keys enforced while loading); returns the row count of each table."""
  con = sqlite3.connect(path)
  try:
    con.execute("PRAGMA foreign_keys = ON")
    con.executescript(mcp_server._SCHEMA)
    for table in _TABLES:
      rows = world["tables"][table]
      if rows:
        con.executemany(f"INSERT INTO {table} VALUES ({','.join('?' * len(rows[0]))})", rows)
    con.commit()
    return {t: len(world["tables"][t]) for t in _TABLES}
  finally:
    con.close()


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
        command=sys.executable, args=["-m", "lwm_jax.envs.mcp.server", "--db", db_path],
        env={"PYTHONPATH": lwm_jax.child_pythonpath()})
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


def _failed_fields(result: Any) -> list[str]:
  """The fields a write answered as not saved (a partial batch failure's `failed` object)."""
  texts = [getattr(c, "text", "") for c in result.content]
  try:
    body = json.loads("\n".join(texts))
  except json.JSONDecodeError:
    return []
  return sorted(body["failed"]) if isinstance(body, dict) and isinstance(body.get("failed"), dict) else []


def error(observation: str) -> str:
  """The error an observation shows ("" when none): a JSON-RPC `error` object, a tool result
  marked `isError`, or a write whose `failed` object lists fields it did not save."""
  text = observation.lstrip()
  try:
    body = json.loads(text)
  except json.JSONDecodeError:  # cut by the length limit: read the opening
    if re.match(r'\{\s*"isError"\s*:\s*true', text):
      return "tool error (isError)"
    m = re.match(r'\{\s*"error"\s*:\s*\{\s*"code"\s*:\s*(-?\d+)', text)
    return f"JSON-RPC error {m.group(1)}" if m else ""
  if not isinstance(body, dict):
    return ""
  if body.get("isError") is True:
    return "tool error (isError)"
  if isinstance(body.get("error"), dict):
    return f"JSON-RPC error {body['error'].get('code')}"
  if isinstance(body.get("failed"), dict) and body["failed"]:
    return "partial failure: " + ", ".join(sorted(body["failed"]))
  return ""


class McpEnv(Perturbable, base.Env):
  domain = "mcp"

  def __init__(self, perturb: Any = None) -> None:
    super().__init__()
    self.set_perturb(perturb)
    self.tmp = tempfile.mkdtemp(prefix="lwm_mcp_")
    self.db_path = os.path.join(self.tmp, "shop.db")
    write_database(self.db_path, generate_world(0))
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
    world = generate_world(seed)
    counts = write_database(self.db_path, world)
    # This episode's misbehaviour (none: the side file is removed), counted afresh by the server.
    mcp_server.write_perturb_file(self.db_path, self.begin_faults(seed) or None)
    self._set_world(world)
    self.world = world  # the tables as generated; the database file holds the live state
    kind = rng.choice(sorted(_TASK_TOOLS))
    extra = [t for t in self.all_tools if t not in _ALWAYS and t not in _TASK_TOOLS[kind]]
    chosen = set(_ALWAYS) | set(_TASK_TOOLS[kind]) | set(rng.sample(extra, rng.randint(0, len(extra))))
    self.tools = [self.all_tools[n] for n in self.all_tools if n in chosen]
    self.goal = self._make_goal(kind, rng, seed)
    self.goal["tools"] = [t["name"] for t in self.tools]
    initial = (f"Connected to MCP server 'shop-db' (SQLite database of {world['business']}, "
               f"{world['description']}).\nRow counts: " +
               ", ".join(f"{k}={v}" for k, v in counts.items()))
    space = ("Call one tool per turn as a JSON object {\"tool\": NAME, \"arguments\": {...}}. "
             "Available tools (MCP tools/list):\n" + json.dumps(self.tools, indent=1))
    return self._ready(self.goal["text"], space, initial)

  def step(self, action: str) -> str:
    if self.client is None:
      raise RuntimeError("env is closed")
    self.steps += 1
    self.step_error = ""
    try:
      call = json.loads(action)
    except json.JSONDecodeError as e:
      return self._rpc_error(-32700, f"Parse error: {e}")
    if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
      return self._rpc_error(-32600, "Invalid request: expected {\"tool\": NAME, \"arguments\": {...}}")
    name, args = call["tool"], call.get("arguments")
    args = {} if args is None else args
    if not isinstance(args, dict):
      return self._rpc_error(-32602, "Invalid params: \"arguments\" must be a JSON object, got "
                             f"{type(args).__name__}")
    try:
      result = self.client.call(lambda s: s.call_tool(name, args))
    except TimeoutError:
      return self._rpc_error(-32001, "Request timed out: the server did not answer within 30 s")
    if getattr(result, "is_error", False):
      self.step_error = "tool error (isError)"
    elif _failed_fields(result):
      self.step_error = "partial failure: " + ", ".join(_failed_fields(result))
    return base.truncate(render_result(result), self.max_obs_chars)

  def _rpc_error(self, code: int, message: str) -> str:
    """A JSON-RPC error answer (the request never became a tool call)."""
    self.step_error = f"JSON-RPC error {code}"
    return json.dumps({"error": {"code": code, "message": message}})

  def state_digest(self) -> str | None:
    """The database's rows (every table, as SQL), which the write tools change."""
    if self.client is None or not os.path.exists(self.db_path):
      return None
    con = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
    try:
      return hashlib.sha256("\n".join(con.iterdump()).encode()).hexdigest()
    finally:
      con.close()

  def episode_meta(self) -> dict[str, Any]:
    return {"task_kind": self.goal.get("kind"), "declared_tools": self.goal.get("tools", []),
            "server": "lwm_jax.envs.mcp_server (mcp stdio)"}  # the recorded label, kept byte for byte

  def close(self) -> None:
    if self.client is not None:
      self.client.close()
      self.client = None
    shutil.rmtree(self.tmp, ignore_errors=True)

  def _make_goal(self, kind: str, rng: random.Random, seed: int) -> dict[str, Any]:
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


def corpus_problem(traj: Any) -> str | None:
  """Why a recorded episode must stay out of a corpus (a call of a tool the episode's server did
  not declare), or None; the domain record's `corpus_check`."""
  declared = set(traj.meta.get("declared_tools", []))
  for i, t in enumerate(traj.turns):
    try:
      call = json.loads(t.action)
    except json.JSONDecodeError:
      continue  # a malformed request calls no tool; the server answers with a parse error
    if isinstance(call, dict) and call.get("tool") not in declared:
      return f"turn {i}: undeclared tool {call.get('tool')!r}"
  return None
