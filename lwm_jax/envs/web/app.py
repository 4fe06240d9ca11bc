"""A small real web shop (sessions, forms, redirects) served by `http.server` on loopback.

`ShopServer(world)` starts a threaded HTTP server on 127.0.0.1 with a free port over a generated
shop (`generate_world(seed)`: name, departments, products with prices, stock and reviews, customer
accounts and their past orders), with a cart per session cookie. Session ids are counters, so a
run repeats byte for byte.
"""
from __future__ import annotations

import html
import http.server
import random
import threading
import urllib.parse
from typing import Any

# Departments a generated shop may carry: slug -> (price range, {noun: the modifiers that suit it}).
DEPARTMENTS = {
    "books": ((6, 40), {"Atlas": "World|River|Night Sky|Road", "Field Guide": "Bird|Mushroom|Seashore|Tree",
                        "Cookbook": "Vegetarian|Baking|Street Food|Weeknight", "Poems": "Collected|Pocket|Selected"}),
    "kitchen": ((8, 120), {"Pan": "Cast Iron|Copper|Carbon Steel|Nonstick", "Kettle": "Enamel|Copper|Stovetop",
                           "Knife": "Santoku|Bread|Paring", "Bowl": "Stoneware|Bamboo|Mixing",
                           "Cutting Board": "Walnut|Bamboo|Oak"}),
    "garden": ((4, 90), {"Watering Can": "Galvanised|Indoor|Copper", "Seed Kit": "Herb|Wildflower|Tomato",
                         "Shears": "Pruning|Hedge|Grass", "Planter": "Clay|Hanging|Balcony", "Trowel": "Steel|Narrow"}),
    "toys": ((5, 70), {"Train": "Wooden|Wind-up|Electric", "Puzzle": "Wooden|Floor|Magnetic",
                       "Kite": "Stunt|Diamond|Box", "Building Set": "Magnetic|Wooden|Castle", "Yo-yo": "Glow|Classic"}),
    "music": ((6, 180), {"Ukulele": "Concert|Soprano|Tenor", "Harmonica": "Blues|Chromatic",
                         "Guitar Strings": "Bronze|Nylon|Electric", "Metronome": "Digital|Clockwork",
                         "Drum Pad": "Practice|Electronic"}),
    "outdoors": ((9, 220), {"Tent": "Two-person|Ultralight|Family", "Lantern": "Solar|Folding|Camping",
                            "Backpack": "Trail|Daypack|Alpine", "Water Bottle": "Insulated|Folding|Steel",
                            "Hammock": "Travel|Double"}),
    "stationery": ((2, 45), {"Notebook": "Dotted|Recycled|Linen|Pocket", "Fountain Pen": "Brass|Student|Pastel",
                             "Planner": "Weekly|Daily|Academic", "Pencil Set": "Sketching|Coloured|Graphite"}),
    "bath": ((3, 60), {"Towel": "Cotton|Waffle|Linen", "Soap": "Lavender|Oat|Cedar|Eucalyptus",
                       "Bath Mat": "Cotton|Cedar|Woven", "Robe": "Waffle|Cotton|Hooded"}),
    "lighting": ((12, 160), {"Desk Lamp": "Brass|Clip-on|Dimmable", "Floor Lamp": "Arched|Tripod|Paper",
                             "String Lights": "Warm White|Solar|Fairy", "Night Light": "Plug-in|Dimmable"}),
    "pets": ((3, 90), {"Leash": "Reflective|Rope|Retractable", "Pet Bed": "Orthopedic|Plush|Cooling",
                       "Food Bowl": "Steel|Ceramic|Raised", "Chew Toy": "Rope|Rubber", "Cat Tree": "Tall|Corner"}),
    "games": ((8, 75), {"Chess Set": "Travel|Walnut|Magnetic", "Card Game": "Family|Party|Strategy",
                        "Board Game": "Family|Strategy|Cooperative", "Jigsaw": "1000-piece|500-piece|Panorama"}),
    "tea": ((4, 50), {"Green Tea": "Jasmine|Loose Leaf|Sencha", "Black Tea": "Smoky|Breakfast|Earl Grey",
                      "Chai": "Spiced|Vanilla", "Tea Strainer": "Steel|Bamboo", "Matcha Whisk": "Bamboo"}),
}
_SHOP_A = ["Harbour", "Juniper", "Bramble", "Lantern", "Pebble", "Thistle", "Meadow", "Quayside", "Sparrow",
           "Willow", "Copper Fox", "Blue Door", "Saffron", "Nettle", "Orchard"]
_SHOP_B = ["Shop", "Market", "Store", "Emporium", "Goods", "Trading Post", "Corner", "Supply"]
_TAGLINES = ["Small batches, fair prices.", "Free returns within 30 days.", "Family run since 1998.",
             "Things that last.", "Everyday goods, chosen with care.", "Local makers, shipped fast.",
             "Orders before noon ship today.", "Independent and proud of it."]
_FIRST = ["alice", "bob", "carmen", "dmitri", "elena", "farah", "gus", "hugo", "iris", "jamal", "kira",
          "liam", "mona", "nadia", "oscar", "pavel", "rhea", "sami", "tove", "yuki"]
_WORDS = ["wonderland", "builder", "harbour", "lantern", "maple", "orbit", "pepper", "quartz", "river",
          "saffron", "tundra", "violet", "walrus", "zephyr"]
_STREETS = ["Harbour Road", "Elm Street", "Mill Lane", "Station Road", "Church Walk", "Queen Street",
            "Park Avenue", "Bridge Street", "Orchard Close", "High Street", "Canal Side", "Fox Lane"]
_TOWNS = ["Bristol", "Leeds", "York", "Bath", "Derby", "Exeter", "Norwich", "Cardiff", "Dundee", "Lincoln",
          "Galway", "Hull"]
_REVIEWERS = ["Mira", "Tom", "Anouk", "Raj", "Lena", "Kofi", "Ines", "Paul", "Sana", "Ola", "Ben", "Yara"]
_REVIEW_TEXT = {5: ["Exactly as described.", "Would buy again.", "Lovely quality for the price."],
                4: ["Good, but shipping took a while.", "Solid and well made.", "Nice, slightly smaller than expected."],
                3: ["Does the job.", "Average quality.", "Fine for occasional use."],
                2: ["Arrived scratched.", "Colour differs from the photo."],
                1: ["Broke after a week.", "Not what I ordered."]}
PASSWORD_DECOY = "letmein"  # a wrong password the scripted agent tries; no account uses it


def generate_world(seed: int) -> dict[str, Any]:
  """The shop of world `seed`: its name, departments, catalogue (prices, stock, reviews), page
  size, customer accounts with addresses and their past orders. JSON-serialisable."""
  rng = random.Random(f"web-world-{seed}")
  cats = sorted(rng.sample(sorted(DEPARTMENTS), rng.randint(3, 5)))
  products: list[dict[str, Any]] = []
  for cat in cats:
    (lo, hi), kinds = DEPARTMENTS[cat]
    names = rng.sample([f"{m} {n}" for n, mods in kinds.items() for m in mods.split("|")], rng.randint(2, 4))
    for name in names:
      stars = [rng.choice([5, 5, 4, 4, 4, 3, 2, 1]) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
      products.append({"name": name, "category": cat,
                       "price": rng.randint(lo, hi) + rng.choice([0, 0.5, 0.99]),
                       "stock": rng.choice([0, 1, 2, 3, 5, 8, 12, 20]),
                       "reviews": [{"by": f"{rng.choice(_REVIEWERS)} {rng.choice('ABCDEFGHKLMNPRST')}.",
                                    "stars": k, "text": rng.choice(_REVIEW_TEXT[k])} for k in stars]})
  rng.shuffle(products)  # the catalogue lists products in the order they were added, not by department
  for pid, x in enumerate(products, 1):
    x["id"] = pid
  users = {}
  for name in rng.sample(_FIRST, rng.randint(2, 4)):
    users[name] = {"password": f"{rng.choice(_WORDS)}{rng.randint(1, 99)}",
                   "address": f"{rng.randint(1, 180)} {rng.choice(_STREETS)}, {rng.choice(_TOWNS)}"}
  orders = []
  for name in users:
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
      items = sorted(rng.sample(range(1, len(products) + 1), rng.randint(1, 3)))
      orders.append({"id": 1001 + len(orders), "user": name, "items": [[pid, rng.randint(1, 2)] for pid in items],
                     "address": users[name]["address"], "shipping": rng.choice(["standard", "express"])})
  return {"shop": f"{rng.choice(_SHOP_A)} {rng.choice(_SHOP_B)}", "tagline": rng.choice(_TAGLINES),
          "categories": cats, "per_page": rng.choice([4, 5, 6]), "products": products, "users": users,
          "orders": orders}


_FAULT_PAGES = {"timeout": (504, "Gateway timeout"), "server_error": (500, "Server error"),
                "unavailable": (503, "Service unavailable"), "rate_limit": (429, "Too many requests")}
_FAULT_TEXT = {"timeout": "The request timed out: the shop did not answer within 30 s.",
               "server_error": "Internal server error: the request could not be completed.",
               "unavailable": "The shop is overloaded; try again later."}


class ShopState:
  """The live state of one shop: the world's catalogue and orders, plus sessions."""

  def __init__(self, world: dict[str, Any]) -> None:
    self.world = world
    self.name, self.tagline = world["shop"], world["tagline"]
    self.categories, self.per_page = list(world["categories"]), world["per_page"]
    self.products = [dict(x) for x in world["products"]]
    self.users = {u: a["password"] for u, a in world["users"].items()}
    self.sessions: dict[str, dict[str, Any]] = {}
    self.orders: list[dict[str, Any]] = [
        {"id": o["id"], "user": o["user"], "cart": {pid: q for pid, q in o["items"]}, "address": o["address"],
         "shipping": o["shipping"]} for o in world["orders"]]
    self.lock = threading.Lock()
    self.faults: Any = None  # an envs.perturb.Faults when the episode is perturbed


# The notices with which the shop turns a request down. The page marks them as errors (class
# "error" on the notice), which the web env reports as the step's error; its `error` reader
# knows them by these templates.
REFUSALS = {"login": "Invalid username or password.", "address": "Please enter a full delivery address.",
            "stock": "Only {stock} of {name} in stock.", "product": "Unknown product.",
            "empty_cart": "Your cart is empty."}


def _note(session: dict[str, Any], text: str, refused: bool = False) -> None:
  """Keeps a notice for the next page the session is shown (a refusal when `refused`)."""
  session["notice"], session["refused"] = text, refused


def _page(title: str, body: str, user: str | None, notice: str = "", refused: bool = False) -> str:
  """A whole HTML page with the site's navigation; a refusal notice is marked as an error."""
  nav = ('<nav><a href="/">Home</a> <a href="/products">Products</a> <a href="/cart">Cart</a> '
         + (f'<a href="/account">Account ({html.escape(user)})</a> <a href="/logout">Log out</a>'
            if user else '<a href="/login">Log in</a>') + "</nav>")
  mark = ' class="error"' if refused else ""
  note = f'<p role="alert"{mark}>{html.escape(notice)}</p>' if notice else ""
  return (f"<!doctype html><html><head><title>{html.escape(title)} - Shop</title></head><body>"
          f"{nav}{note}<main><h1>{html.escape(title)}</h1>{body}</main></body></html>")


def make_handler(state: ShopState) -> type:
  class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # quiet
      pass

    def _session(self) -> tuple[str, dict[str, Any]]:
      cookies = dict(c.strip().split("=", 1) for c in self.headers.get("Cookie", "").split(";") if "=" in c)
      sid = cookies.get("sid", "")
      with state.lock:
        if sid not in state.sessions:
          sid = f"s{len(state.sessions) + 1}"
          state.sessions[sid] = {"user": None, "cart": {}, "new": True}
        return sid, state.sessions[sid]

    def _send(self, code: int, body: str, sid: str, location: str = "") -> None:
      data = body.encode()
      self.send_response(code)
      self.send_header("Set-Cookie", f"sid={sid}; Path=/; HttpOnly")
      if location:
        self.send_header("Location", location)
      self.send_header("Content-Type", "text/html; charset=utf-8")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    def _fail(self, fault: str, sid: str, user: str | None) -> None:
      """A perturbed request: the error page a failing server sends (see docs/perturbations.md)."""
      code, title = _FAULT_PAGES[fault]
      if fault == "rate_limit":
        o = state.faults.opts
        text = (f"Too many requests: {o['rate_limit']} allowed per session; retry after "
                f"{o.get('retry_after', 30)} s.")
      else:
        text = _FAULT_TEXT[fault]
      return self._send(code, _page(title, f"<p>{html.escape(text)}</p>", user), sid)

    def do_GET(self) -> None:
      self._route("GET", {})

    def do_POST(self) -> None:
      n = int(self.headers.get("Content-Length", "0"))
      form = {k: v[0] for k, v in urllib.parse.parse_qs(self.rfile.read(n).decode(), keep_blank_values=True).items()}
      self._route("POST", form)

    def _route(self, method: str, form: dict[str, str]) -> None:
      sid, s = self._session()
      if state.faults:
        with state.lock:
          fault = state.faults.call()
        if fault:
          return self._fail(fault, sid, s["user"])
      url = urllib.parse.urlsplit(self.path)
      q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
      user = s["user"]
      notice, refused = s.pop("notice", ""), s.pop("refused", False)
      p = url.path
      if p == "/":
        featured = sorted((x for x in state.products if x["stock"]), key=lambda x: (-len(x["reviews"]), x["id"]))[:3]
        body = (f'<p>Welcome to {html.escape(state.name)}. {html.escape(state.tagline)}</p>'
                '<form action="/products" method="get">'
                '<label for="q">Search products</label><input id="q" name="q" type="text">'
                '<button type="submit">Search</button></form>'
                "<h2>Categories</h2><ul>" + "".join(
                    f'<li><a href="/products?category={c}">{c.title()}</a></li>' for c in state.categories) + "</ul>"
                "<h2>Featured</h2><ul>" + "".join(
                    f'<li><a href="/product/{x["id"]}">{html.escape(x["name"])}</a> ${x["price"]:.2f}</li>'
                    for x in featured) + "</ul>")
        return self._send(200, _page("Home", body, user, notice, refused), sid)
      if p == "/products":
        items = state.products
        cat, term = q.get("category", "all"), q.get("q", "").strip().lower()
        if cat != "all":
          items = [x for x in items if x["category"] == cat]
        if term:
          items = [x for x in items if term in x["name"].lower()]
        try:
          page = max(1, int(q.get("page", "1")))
        except ValueError:
          page = 1
        per = state.per_page
        pages = max(1, (len(items) + per - 1) // per)
        shown = items[(page - 1) * per: page * per]
        opts = "".join(f'<option value="{c}"{" selected" if c == cat else ""}>{c}</option>'
                       for c in ["all"] + state.categories)
        body = ('<form action="/products" method="get"><label for="q">Search products</label>'
                f'<input id="q" name="q" type="text" value="{html.escape(term)}">'
                f'<label for="cat">Category</label><select id="cat" name="category">{opts}</select>'
                '<button type="submit">Filter</button></form>')
        if not shown:
          body += "<p>No products match.</p>"
        body += "<ul>" + "".join(
            f'<li><a href="/product/{x["id"]}">{html.escape(x["name"])}</a> ${x["price"]:.2f}'
            f'{"" if x["stock"] else " (sold out)"}</li>' for x in shown) + "</ul>"
        body += f"<p>Page {page} of {pages} ({len(items)} products)</p>"
        base_q = urllib.parse.urlencode({"q": term, "category": cat})
        if page > 1:
          body += f'<a href="/products?{base_q}&page={page - 1}">Previous page</a>'
        if page < pages:
          body += f'<a href="/products?{base_q}&page={page + 1}">Next page</a>'
        return self._send(200, _page("Products", body, user, notice, refused), sid)
      if p.startswith("/product/"):
        x = next((x for x in state.products if f"/product/{x['id']}" == p), None)
        if x is None:
          return self._send(404, _page("Not found", "<p>No such product.</p>", user), sid)
        opts = "".join(f'<option value="{k}">{k}</option>' for k in range(1, 6))
        revs = x["reviews"]
        rating = (f'<p>Rated {sum(r["stars"] for r in revs) / len(revs):.1f} of 5 ({len(revs)} '
                  f'review{"s" if len(revs) > 1 else ""})</p><ul>' + "".join(
                      f'<li>{html.escape(r["by"])} {r["stars"]}/5: {html.escape(r["text"])}</li>' for r in revs)
                  + "</ul>") if revs else "<p>No reviews yet.</p>"
        body = (f'<p>Category: {x["category"]}</p><p>Price: ${x["price"]:.2f}</p>'
                f'<p>In stock: {x["stock"]}</p><form action="/cart/add" method="post">'
                f'<input type="hidden" name="product" value="{x["id"]}"><label for="qty">Quantity</label>'
                f'<select id="qty" name="qty">{opts}</select><button type="submit">Add to cart</button></form>'
                + rating)
        return self._send(200, _page(x["name"], body, user, notice, refused), sid)
      if p == "/cart/add" and method == "POST":
        x = next((x for x in state.products if str(x["id"]) == form.get("product")), None)
        qty = int(form.get("qty", "1")) if form.get("qty", "1").isdigit() else 1
        if x is None:
          _note(s, REFUSALS["product"], refused=True)
        elif qty + s["cart"].get(x["id"], 0) > x["stock"]:
          _note(s, REFUSALS["stock"].format(stock=x["stock"], name=x["name"]), refused=True)
          return self._send(303, "", sid, f"/product/{x['id']}")
        elif state.faults and state.faults.opts.get("partial_rate"):
          with state.lock:
            failed = state.faults.partial(qty)
          ok = failed.count(False)
          if ok:
            s["cart"][x["id"]] = s["cart"].get(x["id"], 0) + ok
          if not any(failed):
            _note(s, f"Added {qty} x {x['name']} to the cart.")
          else:  # a partial failure: a real error page naming what was added and what failed
            rows = "".join(f"<li>Unit {k} of {html.escape(x['name'])}: "
                           + ("failed (reservation error)" if bad else "added") + "</li>"
                           for k, bad in enumerate(failed, 1))
            body = (f"<p>Added {ok} of {qty} x {html.escape(x['name'])}; {qty - ok} could not be "
                    f"reserved.</p><ul>{rows}</ul><a href=\"/cart\">View cart</a>")
            return self._send(409, _page("Partially added", body, user), sid)
        else:
          s["cart"][x["id"]] = s["cart"].get(x["id"], 0) + qty
          _note(s, f"Added {qty} x {x['name']} to the cart.")
        return self._send(303, "", sid, "/cart")
      if p == "/cart":
        rows, total = "", 0.0
        for pid, qty in s["cart"].items():
          x = state.products[pid - 1]
          total += qty * x["price"]
          rows += (f'<li>{html.escape(x["name"])} x {qty} ${qty * x["price"]:.2f}'
                   f'<form action="/cart/remove" method="post"><input type="hidden" name="product" '
                   f'value="{pid}"><button type="submit">Remove {html.escape(x["name"])}</button></form></li>')
        body = (f"<ul>{rows}</ul><p>Total: ${total:.2f}</p>"
                + ('<a href="/checkout">Checkout</a>' if rows else "<p>Your cart is empty.</p>"))
        return self._send(200, _page("Cart", body, user, notice, refused), sid)
      if p == "/cart/remove" and method == "POST":
        s["cart"].pop(int(form.get("product", "0") or 0), None)
        _note(s, "Item removed.")
        return self._send(303, "", sid, "/cart")
      if p == "/login":
        if method == "POST":
          name, pw = form.get("username", ""), form.get("password", "")
          if state.users.get(name) == pw and pw:
            s["user"] = name
            _note(s, f"Signed in as {name}.")
            return self._send(303, "", sid, q.get("next", "/"))
          notice, refused = REFUSALS["login"], True
        nxt = urllib.parse.quote(q.get("next", "/"))
        body = (f'<form action="/login?next={nxt}" method="post"><label for="u">Username</label>'
                '<input id="u" name="username" type="text"><label for="pw">Password</label>'
                '<input id="pw" name="password" type="password"><button type="submit">Sign in</button></form>')
        return self._send(200, _page("Log in", body, user, notice, refused), sid)
      if p == "/logout":
        s["user"] = None
        _note(s, "Signed out.")
        return self._send(303, "", sid, "/")
      if p == "/checkout":
        if not user:
          _note(s, "Please sign in to check out.")
          return self._send(303, "", sid, "/login?next=/checkout")
        if not s["cart"]:
          _note(s, REFUSALS["empty_cart"], refused=True)
          return self._send(303, "", sid, "/cart")
        if method == "POST":
          addr = form.get("address", "").strip()
          if len(addr) < 5:
            notice, refused = REFUSALS["address"], True
          else:
            with state.lock:
              oid = max((o["id"] for o in state.orders), default=1000) + 1
              state.orders.append({"id": oid, "user": user, "cart": dict(s["cart"]), "address": addr,
                                   "shipping": form.get("shipping", "standard")})
              for pid, qty in s["cart"].items():
                state.products[pid - 1]["stock"] -= qty
            s["cart"] = {}
            _note(s, f"Order #{oid} placed.")
            return self._send(303, "", sid, "/account")
        body = ('<form action="/checkout" method="post"><label for="addr">Delivery address</label>'
                '<input id="addr" name="address" type="text"><label for="ship">Shipping</label>'
                '<select id="ship" name="shipping"><option value="standard">standard</option>'
                '<option value="express">express</option></select>'
                '<button type="submit">Place order</button></form>')
        return self._send(200, _page("Checkout", body, user, notice, refused), sid)
      if p == "/account":
        if not user:
          return self._send(303, "", sid, "/login?next=/account")
        mine = [o for o in state.orders if o["user"] == user]
        body = "<h2>Orders</h2><ul>" + "".join(
            f'<li>Order #{o["id"]}: {sum(o["cart"].values())} item(s) ('
            + ", ".join(f'{html.escape(state.products[pid - 1]["name"])} x {q}' for pid, q in o["cart"].items())
            + f'), {o["shipping"]} to {html.escape(o["address"])}</li>' for o in mine) + "</ul>" + ("" if mine else "<p>No orders yet.</p>")
        return self._send(200, _page("Account", body, user, notice, refused), sid)
      return self._send(404, _page("Not found", f"<p>The page {html.escape(p)} does not exist.</p>", user), sid)

  return Handler


class ShopServer:
  """The shop on 127.0.0.1:<free port>, serving from a daemon thread until `close()`."""

  def __init__(self, world: dict[str, Any]) -> None:
    self.state = ShopState(world)
    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state))
    self.port = self.httpd.server_address[1]
    self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                   daemon=True)
    self.thread.start()

  def close(self) -> None:
    self.httpd.shutdown()
    self.httpd.server_close()
