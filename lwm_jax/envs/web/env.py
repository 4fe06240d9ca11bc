"""The `web` environment: a browser-like client for the local shop, seeing an accessibility tree.

Each episode starts the real HTTP shop (`web_app.ShopServer`) on loopback over the seed's
generated shop (`generate_world`: catalogue, accounts, past orders); the client keeps a
cookie, follows redirects, and renders each HTML page as an accessibility-tree text in which
interactive elements carry numeric ids. Actions: `click(id)`, `type(id, "text")`,
`select(id, "option")`, `submit(id)`, `goto("/path")`, `back()`. URLs are shown on the fixed host
`http://shop.local` (the real port never appears). An invalid action leaves the page as it was and
shows an error line above it.

Perturbations (`set_perturb(spec)` or `WebEnv(perturb=spec)`; see docs/perturbations.md) are
served by the shop itself after the first page of the episode: `errors` answers that share of
requests with a real error page (504, 500 or 503), `page_size` lists that many products per page,
`partial` makes each unit of an add-to-cart fail at that rate (a 409 page says which were added
and which failed), `rate_limit` answers 429 after the first `limit` requests. All drawn from the
episode seed.
"""
from __future__ import annotations

import html.parser
import http.client
import re
import urllib.parse
from typing import Any

from lwm_jax.envs import base
from lwm_jax.envs.web import app as web_app
from lwm_jax.envs.perturb import Perturbable
from lwm_jax.envs.web.app import generate_world  # noqa: F401  (each env module offers its world generator)

HOST = "http://shop.local"
SIGNATURES = {"click": ("id",), "type": ("id", "text"), "select": ("id", "option"),
              "submit": ("id",), "goto": ("url",), "back": ()}
ACTION_SPACE = """\
One browser action per turn, Python call syntax:
  click(id)               follow a link or press a button (buttons submit their form)
  type(id, "text")        replace the text of a textbox
  select(id, "option")    choose an option of a combobox
  submit(id)              submit the form that contains element `id`
  goto("/path?query")     open a URL of the site
  back()                  return to the previous page
Observation: the page as an accessibility tree; interactive elements are shown as [id] role "name"."""

TASKS = {
    "buy": "Sign in as {user} (password {password}) and order {qty} x '{product}' with {shipping} "
           "shipping to {address}.",
    "cheapest": "Find the cheapest product in the '{category}' category and open its page.",
    "account": "Sign in as {user} (password {password}) and check the account's orders."}
_CONTAINERS = {"nav": "navigation", "main": "main", "ul": "list", "li": "listitem", "form": "form"}


class _TreeParser(html.parser.HTMLParser):
  """HTML -> a flat list of nodes (role, name, depth, attrs, form index)."""

  def __init__(self) -> None:
    super().__init__(convert_charrefs=True)
    self.nodes: list[dict[str, Any]] = []
    self.forms: list[dict[str, Any]] = []
    self.labels: dict[str, str] = {}
    self.title = ""
    self.depth = 0
    self.stack: list[str] = []
    self.capture: dict[str, Any] | None = None
    self.in_title = False
    self.label_for = ""
    self.form = -1
    self.select: dict[str, Any] | None = None

  def handle_starttag(self, tag: str, attrs_list: list[tuple[str, str | None]]) -> None:
    a = {k: v or "" for k, v in attrs_list}
    if tag == "title":
      self.in_title = True
    elif tag in _CONTAINERS:
      if tag == "form":
        self.form = len(self.forms)
        self.forms.append({"action": a.get("action", ""), "method": a.get("method", "get").upper(),
                           "hidden": {}})
      self.nodes.append({"role": _CONTAINERS[tag], "name": "", "depth": self.depth})
      self.depth += 1
      self.stack.append(tag)
    elif tag in ("a", "button", "h1", "h2", "p", "label", "option"):
      role = {"a": "link", "button": "button", "h1": "heading", "h2": "heading", "p": "text",
              "label": "label", "option": "option"}[tag]
      node = {"role": role, "name": "", "depth": self.depth, "attrs": a, "form": self.form}
      if tag == "p" and a.get("role") == "alert":
        node["role"] = "alert"
      if tag == "option":
        if self.select is not None:
          self.select["options"].append(a.get("value", ""))
          if "selected" in a:
            self.select["value"] = a.get("value", "")
        self.capture = None
        return
      if tag == "label":
        self.label_for = a.get("for", "")
      self.capture = node
      if role != "label":
        self.nodes.append(node)
    elif tag == "input":
      if a.get("type") == "hidden":
        if self.form >= 0:
          self.forms[self.form]["hidden"][a.get("name", "")] = a.get("value", "")
        return
      self.nodes.append({"role": "textbox", "name": a.get("id", ""), "depth": self.depth, "attrs": a,
                         "form": self.form, "value": a.get("value", ""), "secret": a.get("type") == "password"})
    elif tag == "select":
      self.select = {"role": "combobox", "name": a.get("id", ""), "depth": self.depth, "attrs": a,
                     "form": self.form, "options": [], "value": None}
      self.nodes.append(self.select)

  def handle_endtag(self, tag: str) -> None:
    if tag == "title":
      self.in_title = False
    elif tag in _CONTAINERS and self.stack and self.stack[-1] == tag:
      self.stack.pop()
      self.depth -= 1
      if tag == "form":
        self.form = -1
    elif tag == "select" and self.select is not None:
      if self.select["value"] is None:
        self.select["value"] = self.select["options"][0] if self.select["options"] else ""
      self.select = None
    elif tag == "label" and self.capture is not None:
      self.labels[self.label_for] = self.capture["name"].strip()
      self.capture = None
    elif tag in ("a", "button", "h1", "h2", "p"):
      self.capture = None

  def handle_data(self, data: str) -> None:
    if self.in_title:
      self.title += data
    elif self.capture is not None:
      self.capture["name"] += data
    elif data.strip() and self.select is None:
      self.nodes.append({"role": "text", "name": data, "depth": self.depth})


_PAGE_RE = re.compile(r'^Page "(.*)" at \S+', re.M)


def screen(observation: str) -> str | None:
  """The page an observation shows (its title, as `WebEnv.render` writes it), or None."""
  m = _PAGE_RE.search(observation)
  return m.group(1) if m else None


_STATUS_RE = re.compile(r'^Page "[^\n]*" at \S+ \[HTTP (\d+)\]$', re.M)
_REFUSAL_RE = re.compile(r'^alert "(%s)"$' % "|".join(
    ".+".join(map(re.escape, re.split(r"\{\w+\}", t))) for t in web_app.REFUSALS.values()), re.M)
_TEXTBOX_RE = re.compile(r'^\s*\[\d+\] textbox "[^"\n]*" value="([^\n]*)"$', re.M)
_COMBOBOX_RE = re.compile(r'^\s*\[\d+\] combobox "[^"\n]*" value="([^\n]*)" options=\[([^\n]*)\]$', re.M)


def error(observation: str) -> str:
  """The error an observation shows (what `WebEnv.step` sets as `step_error`): the `Error:` line
  of an invalid action, an HTTP error status, or a refusal notice of the shop (`REFUSALS`). The
  shop sends a refused form back empty, and the page keeps its notice while the agent fills the
  form in, so a refusal counts only while the page's fields are as the shop sent them (no text
  typed, every combobox on its first option): after an edit it is left over from the last
  request, not this step's error. (A refusal notice held back by an error page and shown later
  on a page the shop fills in itself, a search with its term, would read as no error.)"""
  if observation.startswith("Error: "):
    return "invalid action: " + observation.split("\n", 1)[0].removeprefix("Error: ")
  m = _STATUS_RE.search(observation)
  if m and int(m.group(1)) >= 400:
    return f"HTTP {m.group(1)}"
  m = _REFUSAL_RE.search(observation)
  if m is None:
    return ""
  edited = any(_TEXTBOX_RE.findall(observation)) or any(
      value != options.split(", ")[0] for value, options in _COMBOBOX_RE.findall(observation))
  return "" if edited else f"refused: {m.group(1)}"


class WebEnv(Perturbable, base.Env):
  domain = "web"

  def __init__(self, perturb: Any = None) -> None:
    super().__init__()
    self.set_perturb(perturb)
    self.server: web_app.ShopServer | None = None

  # -- http --------------------------------------------------------------------------------------
  def _request(self, method: str, url: str, form: dict[str, str] | None = None) -> None:
    assert self.server is not None
    for _ in range(5):
      conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
      body = urllib.parse.urlencode(form) if form is not None else None
      headers = {"Cookie": f"sid={self.sid}"} if self.sid else {}
      if body is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
      conn.request(method, url, body=body, headers=headers)
      resp = conn.getresponse()
      text = resp.read().decode()
      m = re.match(r"sid=([^;]+)", resp.getheader("Set-Cookie", "") or "")
      if m:
        self.sid = m.group(1)
      conn.close()
      if resp.status in (301, 302, 303):
        url, method, form = resp.getheader("Location", "/"), "GET", None
        continue
      self.status = resp.status
      self.url = url
      self._load(text)
      self.step_error = self._page_error()
      return
    raise RuntimeError("too many redirects")

  def _load(self, text: str) -> None:
    p = _TreeParser()
    p.feed(text)
    p.close()
    self.forms = p.forms
    self.title = p.title.strip()
    self.nodes = []
    for n in p.nodes:
      n["name"] = " ".join(n["name"].split())
      if n["role"] in ("textbox", "combobox"):
        n["name"] = p.labels.get(n["name"], n["name"])
      if n["role"] == "text" and not n["name"]:
        continue
      self.nodes.append(n)
    self.elements: dict[int, dict[str, Any]] = {}
    for n in self.nodes:
      if n["role"] in ("link", "button", "textbox", "combobox"):
        n["id"] = len(self.elements) + 1
        self.elements[n["id"]] = n

  def _page_error(self) -> str:
    """What the page just loaded reports: "HTTP <status>" for an error status, "refused: <notice>"
    when the shop marked its notice as an error (a refusal, `web_app.REFUSALS`), else ""."""
    if self.status >= 400:
      return f"HTTP {self.status}"
    for n in self.nodes:
      if n["role"] == "alert" and "error" in n["attrs"].get("class", "").split():
        return f"refused: {n['name']}"
    return ""

  def render(self) -> str:
    status = "" if self.status == 200 else f" [HTTP {self.status}]"
    lines = [f'Page "{self.title}" at {HOST}{self.url}{status}']
    for n in self.nodes:
      pad = "  " * n["depth"]
      role, name = n["role"], n["name"]
      if "id" in n:
        extra = ""
        if role == "textbox":
          extra = f' value="{"*" * len(n["value"]) if n.get("secret") else n["value"]}"'
        elif role == "combobox":
          extra = f' value="{n["value"]}" options=[{", ".join(n["options"])}]'
        lines.append(f'{pad}[{n["id"]}] {role} "{name}"{extra}')
      elif name:
        lines.append(f'{pad}{role} "{name}"')
      else:
        lines.append(f"{pad}{role}")
    return "\n".join(lines)

  # -- env api -----------------------------------------------------------------------------------
  def reset(self, seed: int) -> str:
    rng = self._begin(seed)
    world = generate_world(seed)
    self._set_world(world)
    self.server = web_app.ShopServer(world)
    self.sid = ""
    self.history: list[str] = []
    self._request("GET", "/")
    opts = self.begin_faults(seed)  # the shop misbehaves from the agent's first action on
    self.server.state.faults = self.faults
    self.server.state.per_page = opts.get("page_size", self.server.state.per_page)
    prods = world["products"]
    kind = rng.choice(["buy", "cheapest", "account", "buy"])
    user = rng.choice(sorted(world["users"]))
    target = rng.choice(prods)
    cat = rng.choice(sorted({p["category"] for p in prods}))
    g = self._set_goal(TASKS, {
        "kind": kind, "user": user, "password": world["users"][user]["password"], "product": target["name"],
        "category": cat, "qty": rng.choice([1, 1, 2, 3]), "shipping": rng.choice(["standard", "express"]),
        "address": world["users"][user]["address"]})
    return self._ready(g["text"], ACTION_SPACE, self.render())

  def episode_meta(self) -> dict[str, Any]:
    return {"task_kind": self.goal.get("kind"), "app": "lwm_jax.envs.web_app (http.server on loopback)",  # recorded label
            "normalised": ["host shown as shop.local (real port hidden)"]}

  def close(self) -> None:
    if self.server is not None:
      self.server.close()
      self.server = None

  def step(self, action: str) -> str:
    if self.server is None:
      raise RuntimeError("call reset(seed) before step()")
    self.steps += 1
    self.step_error = ""  # a request of the step sets it from the page it got (`_page_error`)
    try:
      name, kw = base.parse_call(action, SIGNATURES)
      getattr(self, "_do_" + name)(**kw)
    except (ValueError, TypeError) as e:
      self.step_error = f"invalid action: {e}"
      return f"Error: {e}\n" + self.render()
    return self.render()

  def state_digest(self) -> str | None:
    """The shop's state an agent can change: its orders, each product's stock, and each session's
    sign-in and cart (not the page shown, the browser's history or a pending notice)."""
    if self.server is None:
      return None
    st = self.server.state
    with st.lock:
      return base.canonical_digest({
          "orders": st.orders, "stock": [x["stock"] for x in st.products],
          "sessions": {sid: {"user": x["user"], "cart": x["cart"]} for sid, x in st.sessions.items()}})

  def _element(self, id: Any) -> dict[str, Any]:
    if not isinstance(id, int) or id not in self.elements:
      raise ValueError(f"no element with id {id!r} on this page")
    return self.elements[id]

  def _navigate(self, method: str, url: str, form: dict[str, str] | None = None) -> None:
    self.history.append(self.url)
    self._request(method, url, form)

  def _do_click(self, id: Any) -> None:
    n = self._element(id)
    if n["role"] == "link":
      self._navigate("GET", urllib.parse.urljoin(self.url, n["attrs"].get("href", "")))
    elif n["role"] == "button":
      self._submit_form(n["form"], n)
    else:
      raise ValueError(f"element [{id}] is a {n['role']}; use type() or select()")

  def _do_type(self, id: Any, text: Any) -> None:
    n = self._element(id)
    if n["role"] != "textbox":
      raise ValueError(f"element [{id}] is a {n['role']}, not a textbox")
    n["value"] = str(text)

  def _do_select(self, id: Any, option: Any) -> None:
    n = self._element(id)
    if n["role"] != "combobox":
      raise ValueError(f"element [{id}] is a {n['role']}, not a combobox")
    if str(option) not in n["options"]:
      raise ValueError(f"option {option!r} not in [{', '.join(n['options'])}]")
    n["value"] = str(option)

  def _do_submit(self, id: Any) -> None:
    n = self._element(id)
    if n.get("form", -1) < 0:
      raise ValueError(f"element [{id}] is not inside a form")
    self._submit_form(n["form"], None)

  def _submit_form(self, form_idx: int, button: dict[str, Any] | None) -> None:
    if form_idx < 0:
      raise ValueError("the button is not inside a form")
    f = self.forms[form_idx]
    data = dict(f["hidden"])
    for n in self.nodes:
      if n.get("form") == form_idx and n["role"] in ("textbox", "combobox"):
        data[n["attrs"].get("name", "")] = n["value"]
    url = urllib.parse.urljoin(self.url, f["action"] or self.url)
    if f["method"] == "GET":
      self._navigate("GET", url.split("?")[0] + "?" + urllib.parse.urlencode(data) if data else url)
    else:
      self._navigate("POST", url, data)

  def _do_goto(self, url: Any) -> None:
    if not isinstance(url, str):
      raise ValueError(f"url must be a string, got {url!r}")
    bad = sorted({c for c in url if ord(c) < 0x20 or ord(c) == 0x7f})
    if bad:
      raise ValueError(f"invalid URL: it contains control characters {', '.join(map(repr, bad))}")
    # Spaces and non-ASCII are sent percent-encoded, as a browser's address bar does.
    url = urllib.parse.quote(url, safe="".join(chr(c) for c in range(0x21, 0x7f)))
    u = urllib.parse.urlsplit(url)
    if u.netloc and u.netloc != "shop.local":
      raise ValueError(f"cannot reach {u.netloc}: only {HOST} is available")
    self._navigate("GET", urllib.parse.urlunsplit(("", "", u.path or "/", u.query, "")))

  def _do_back(self) -> None:
    if not self.history:
      raise ValueError("no previous page")
    url = self.history.pop()
    self._request("GET", url)


def find(obs: str, role: str, name: str = "") -> int | None:
  """Id of the first element of `role` whose name contains `name` in an observation."""
  for m in re.finditer(r'^\s*\[(\d+)\] (\w+) "([^"]*)"', obs, re.M):
    if m.group(2) == role and name.lower() in m.group(3).lower():
      return int(m.group(1))
  return None


class WebAgent(base.PlanAgent):
  """Navigates by reading the tree; mixes in detours (404s, bad ids, wrong password)."""

  def make_plan(self, env: base.Env, initial_state: str) -> list[Any]:
    r, g = self.rng, env.goal
    self.g = g
    plan: list[Any] = []
    if r.random() < 0.3:
      plan.append(r.choice(['goto("/cart")', "click(99)", 'type(1, "hello")', "back()",
                             'goto("https://example.org/")', 'select(2, "x")']))
    if g["kind"] == "buy":
      if r.random() < 0.5:
        plan += [("type", "textbox", "Search", g["product"].split()[0]), ("click", "button", "Search")]
      else:
        plan += [("click", "link", "Products"), ("find_product",)]
      plan += [("click", "link", g["product"]), ("select", "combobox", "Quantity", str(g["qty"])),
                ("click", "button", "Add to cart"), ("click", "link", "Cart"), ("click", "link", "Checkout"),
                ("type", "textbox", "Username", g["user"])]
      if r.random() < 0.3:
        plan += [("type", "textbox", "Password", web_app.PASSWORD_DECOY), ("click", "button", "Sign in"),
                  ("type", "textbox", "Username", g["user"])]
      plan += [("type", "textbox", "Password", g["password"]), ("click", "button", "Sign in")]
      if r.random() < 0.3:
        plan.append(("click", "button", "Place order"))  # no address yet: a form error
      plan += [("type", "textbox", "Delivery address", g["address"]),
                ("select", "combobox", "Shipping", g["shipping"]), ("click", "button", "Place order")]
    elif g["kind"] == "cheapest":
      plan += [("click", "link", "Products"), ("select", "combobox", "Category", g["category"]),
                ("click", "button", "Filter"), ("next_pages",), ("open_cheapest",)]
    else:
      plan += ['goto("/account")', ("type", "textbox", "Username", g["user"]),
                ("type", "textbox", "Password", g["password"]), ("click", "button", "Sign in")]
      if r.random() < 0.5:
        plan += [("click", "link", "Products"), ("click", "link", "Next page")]
      plan.append(("click", "link", "Log out"))
    if r.random() < 0.3:
      plan.append(r.choice([("click", "link", "Home"), "back()", ("click", "link", "Cart")]))
    self.prices: list[tuple[float, str]] = []
    return plan

  def resolve(self, step: Any, observation: str) -> str | None:
    op = step[0]
    if op == "find_product":  # page through the catalogue until the product shows up
      if find(observation, "link", self.g["product"]) is None:
        return self._page_on(step, observation)
      return None
    if op == "next_pages":  # note every price, page by page
      self.prices += re.findall(r'link "([^"]+)"\n\s*text "\$([\d.]+)', observation)
      return self._page_on(step, observation)
    if op == "open_cheapest":
      if not self.prices:
        return None
      name = min(self.prices, key=lambda x: (float(x[1]), x[0]))[0]
      i = find(observation, "link", name)
      return f"click({i})" if i is not None else f'goto("/products?category={self.g["category"]}")'
    i = find(observation, step[1], step[2])
    if i is None:
      return None  # the element is not on this page: skip the step, as a hurried agent would
    if op == "click":
      return f"click({i})"
    if op == "type":
      return f"type({i}, {step[3]!r})"
    if op == "select":
      return f"select({i}, {step[3]!r})"
    return None

  def _page_on(self, step: Any, observation: str) -> str | None:
    """Clicks "Next page" and keeps `step` for the next page; None on the last page."""
    nxt = find(observation, "link", "Next page")
    if nxt is None:
      return None
    self.plan.insert(0, step)
    return f"click({nxt})"
