"""A small real web shop (sessions, forms, redirects) served by `http.server` on loopback.

`ShopServer(seed)` starts a threaded HTTP server on 127.0.0.1 with a free port and seeded data:
products with categories and stock, one user account, a cart and orders per session cookie.
Session ids are counters, so a run repeats byte for byte.
"""
from __future__ import annotations

import html
import http.server
import random
import threading
import urllib.parse
from typing import Any

CATEGORIES = ["books", "kitchen", "garden", "toys", "music"]
ITEMS = {"books": ["Atlas of Rivers", "Pocket Poems", "Night Sky Guide", "Bread Basics"],
         "kitchen": ["Cast Iron Pan", "Tea Kettle", "Chef Knife", "Salad Bowl"],
         "garden": ["Watering Can", "Seed Kit", "Pruning Shears", "Clay Pot"],
         "toys": ["Wooden Train", "Puzzle Cube", "Kite", "Marble Run"],
         "music": ["Ukulele", "Harmonica", "Drum Pad", "Guitar Strings"]}
PER_PAGE = 4
USERS = {"alice": "wonderland", "bob": "builder42"}


class ShopState:
  def __init__(self, seed: int) -> None:
    rng = random.Random(seed * 13 + 3)
    self.products = []
    names = [(c, n) for c in CATEGORIES for n in ITEMS[c]]
    for pid, (cat, name) in enumerate(rng.sample(names, rng.randint(9, 16)), 1):
      self.products.append({"id": pid, "name": name, "category": cat,
                            "price": rng.randint(3, 90) + rng.choice([0, 0.5, 0.99]),
                            "stock": rng.choice([0, 1, 3, 8, 20])})
    self.sessions: dict[str, dict[str, Any]] = {}
    self.orders: list[dict[str, Any]] = []
    self.lock = threading.Lock()


def _page(title: str, body: str, user: str | None, notice: str = "") -> str:
  nav = ('<nav><a href="/">Home</a> <a href="/products">Products</a> <a href="/cart">Cart</a> '
         + (f'<a href="/account">Account ({html.escape(user)})</a> <a href="/logout">Log out</a>'
            if user else '<a href="/login">Log in</a>') + "</nav>")
  note = f'<p role="alert">{html.escape(notice)}</p>' if notice else ""
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

    def do_GET(self) -> None:
      self._route("GET", {})

    def do_POST(self) -> None:
      n = int(self.headers.get("Content-Length", "0"))
      form = {k: v[0] for k, v in urllib.parse.parse_qs(self.rfile.read(n).decode(), keep_blank_values=True).items()}
      self._route("POST", form)

    def _route(self, method: str, form: dict[str, str]) -> None:
      sid, s = self._session()
      url = urllib.parse.urlsplit(self.path)
      q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
      user = s["user"]
      notice = s.pop("notice", "")
      p = url.path
      if p == "/":
        body = ('<p>Welcome to the shop.</p><form action="/products" method="get">'
                '<label for="q">Search products</label><input id="q" name="q" type="text">'
                '<button type="submit">Search</button></form>'
                "<h2>Categories</h2><ul>" + "".join(
                    f'<li><a href="/products?category={c}">{c.title()}</a></li>' for c in CATEGORIES) + "</ul>")
        return self._send(200, _page("Home", body, user, notice), sid)
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
        pages = max(1, (len(items) + PER_PAGE - 1) // PER_PAGE)
        shown = items[(page - 1) * PER_PAGE: page * PER_PAGE]
        opts = "".join(f'<option value="{c}"{" selected" if c == cat else ""}>{c}</option>'
                       for c in ["all"] + CATEGORIES)
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
        return self._send(200, _page("Products", body, user, notice), sid)
      if p.startswith("/product/"):
        x = next((x for x in state.products if f"/product/{x['id']}" == p), None)
        if x is None:
          return self._send(404, _page("Not found", "<p>No such product.</p>", user), sid)
        opts = "".join(f'<option value="{k}">{k}</option>' for k in range(1, 6))
        body = (f'<p>Category: {x["category"]}</p><p>Price: ${x["price"]:.2f}</p>'
                f'<p>In stock: {x["stock"]}</p><form action="/cart/add" method="post">'
                f'<input type="hidden" name="product" value="{x["id"]}"><label for="qty">Quantity</label>'
                f'<select id="qty" name="qty">{opts}</select><button type="submit">Add to cart</button></form>')
        return self._send(200, _page(x["name"], body, user, notice), sid)
      if p == "/cart/add" and method == "POST":
        x = next((x for x in state.products if str(x["id"]) == form.get("product")), None)
        qty = int(form.get("qty", "1")) if form.get("qty", "1").isdigit() else 1
        if x is None:
          s["notice"] = "Unknown product."
        elif qty + s["cart"].get(x["id"], 0) > x["stock"]:
          s["notice"] = f"Only {x['stock']} of {x['name']} in stock."
          return self._send(303, "", sid, f"/product/{x['id']}")
        else:
          s["cart"][x["id"]] = s["cart"].get(x["id"], 0) + qty
          s["notice"] = f"Added {qty} x {x['name']} to the cart."
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
        return self._send(200, _page("Cart", body, user, notice), sid)
      if p == "/cart/remove" and method == "POST":
        s["cart"].pop(int(form.get("product", "0") or 0), None)
        s["notice"] = "Item removed."
        return self._send(303, "", sid, "/cart")
      if p == "/login":
        if method == "POST":
          name, pw = form.get("username", ""), form.get("password", "")
          if USERS.get(name) == pw and pw:
            s["user"] = name
            s["notice"] = f"Signed in as {name}."
            return self._send(303, "", sid, q.get("next", "/"))
          notice = "Invalid username or password."
        nxt = urllib.parse.quote(q.get("next", "/"))
        body = (f'<form action="/login?next={nxt}" method="post"><label for="u">Username</label>'
                '<input id="u" name="username" type="text"><label for="pw">Password</label>'
                '<input id="pw" name="password" type="password"><button type="submit">Sign in</button></form>')
        return self._send(200, _page("Log in", body, user, notice), sid)
      if p == "/logout":
        s["user"] = None
        s["notice"] = "Signed out."
        return self._send(303, "", sid, "/")
      if p == "/checkout":
        if not user:
          s["notice"] = "Please sign in to check out."
          return self._send(303, "", sid, "/login?next=/checkout")
        if not s["cart"]:
          s["notice"] = "Your cart is empty."
          return self._send(303, "", sid, "/cart")
        if method == "POST":
          addr = form.get("address", "").strip()
          if len(addr) < 5:
            notice = "Please enter a full delivery address."
          else:
            with state.lock:
              oid = len(state.orders) + 1001
              state.orders.append({"id": oid, "user": user, "cart": dict(s["cart"]), "address": addr,
                                   "shipping": form.get("shipping", "standard")})
              for pid, qty in s["cart"].items():
                state.products[pid - 1]["stock"] -= qty
            s["cart"] = {}
            s["notice"] = f"Order #{oid} placed."
            return self._send(303, "", sid, "/account")
        body = ('<form action="/checkout" method="post"><label for="addr">Delivery address</label>'
                '<input id="addr" name="address" type="text"><label for="ship">Shipping</label>'
                '<select id="ship" name="shipping"><option value="standard">standard</option>'
                '<option value="express">express</option></select>'
                '<button type="submit">Place order</button></form>')
        return self._send(200, _page("Checkout", body, user, notice), sid)
      if p == "/account":
        if not user:
          return self._send(303, "", sid, "/login?next=/account")
        mine = [o for o in state.orders if o["user"] == user]
        body = "<h2>Orders</h2><ul>" + "".join(
            f'<li>Order #{o["id"]}: {sum(o["cart"].values())} item(s), {o["shipping"]} to '
            f'{html.escape(o["address"])}</li>' for o in mine) + "</ul>" + ("" if mine else "<p>No orders yet.</p>")
        return self._send(200, _page("Account", body, user, notice), sid)
      return self._send(404, _page("Not found", f"<p>The page {html.escape(p)} does not exist.</p>", user), sid)

  return Handler


class ShopServer:
  """The shop on 127.0.0.1:<free port>, serving from a daemon thread until `close()`."""

  def __init__(self, seed: int) -> None:
    self.state = ShopState(seed)
    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state))
    self.port = self.httpd.server_address[1]
    self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                   daemon=True)
    self.thread.start()

  def close(self) -> None:
    self.httpd.shutdown()
    self.httpd.server_close()
