"""Generated worlds of the web, android, os and mcp environments: seeded, deterministic, varied
and internally consistent (each checked against the world itself)."""
import os
import re
import sqlite3

import pytest

from lwm_jax.envs import base, ui
from lwm_jax.envs.android import env as android
from lwm_jax.envs.desktop import env as desktop
from lwm_jax.envs.mcp import env as mcp_env
from lwm_jax.envs.web import env as web
from lwm_jax.envs.web import app as web_app


# -- mcp ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 17, 123, 299])
def test_mcp_world_foreign_keys_resolve_and_rows_in_range(tmp_path, seed):
  world = mcp_env.generate_world(seed)
  path = str(tmp_path / "w.db")
  counts = mcp_env.write_database(path, world)
  assert 300 <= sum(counts.values()) <= 500, counts
  con = sqlite3.connect(path)
  try:
    # SQLite's own check of every declared foreign key: nothing dangles.
    assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    assert {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in counts} == counts
    # Each order's total is the sum of its items; every order has items; refunds are for refunded orders.
    bad = con.execute("SELECT o.id FROM orders o LEFT JOIN order_items i ON i.order_id = o.id GROUP BY o.id "
                      "HAVING COUNT(i.order_id) = 0 OR ABS(o.total - SUM(i.quantity * i.unit_price)) > 0.01")
    assert bad.fetchall() == []
    refunded = {r[0] for r in con.execute("SELECT id FROM orders WHERE status = 'refunded'")}
    assert {r[0] for r in con.execute("SELECT order_id FROM refunds")} == refunded
    # Item prices are the product's listed price.
    assert con.execute("SELECT COUNT(*) FROM order_items i JOIN products p ON p.id = i.product_id "
                       "WHERE i.unit_price != p.price").fetchone()[0] == 0
  finally:
    con.close()


def test_mcp_worlds_differ_per_seed_and_repeat_per_seed():
  a, b = mcp_env.generate_world(4), mcp_env.generate_world(5)
  assert a == mcp_env.generate_world(4)
  assert base.world_id("mcp", a) != base.world_id("mcp", b)
  assert a["tables"]["customers"] != b["tables"]["customers"]
  ids = {base.world_id("mcp", mcp_env.generate_world(s)) for s in range(40)}
  assert len(ids) == 40


def test_mcp_reset_builds_the_generated_world():
  env = base.make_env("mcp")
  try:
    first = env.reset(11)
    wid = env.world_id
    con = sqlite3.connect(env.db_path)
    rows = [list(r) for r in con.execute("SELECT * FROM products ORDER BY id")]
    con.close()
    world = mcp_env.generate_world(11)
    assert rows == world["tables"]["products"]
    assert wid == base.world_id("mcp", world) and world["business"] in first
    other = env.reset(12)
    assert env.world_id != wid and other != first
    assert env.reset(11) == first and env.world_id == wid
  finally:
    env.close()


# -- web ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 3, 42, 250])
def test_web_world_is_consistent(seed):
  w = web_app.generate_world(seed)
  ids = [x["id"] for x in w["products"]]
  assert ids == list(range(1, len(ids) + 1))
  assert len({x["name"] for x in w["products"]}) == len(ids)
  assert {x["category"] for x in w["products"]} == set(w["categories"])  # no empty department
  for x in w["products"]:
    assert x["price"] > 0 and x["stock"] >= 0
    assert all(1 <= r["stars"] <= 5 and r["text"] for r in x["reviews"])
  for o in w["orders"]:
    assert o["user"] in w["users"] and o["address"] == w["users"][o["user"]]["address"]
    assert all(1 <= pid <= len(ids) and q > 0 for pid, q in o["items"])
  assert web_app.PASSWORD_DECOY not in {a["password"] for a in w["users"].values()}


def test_web_reset_serves_the_world_and_draws_the_task_from_it():
  env = web.WebEnv()
  try:
    seed = next(s for s in range(50) if web_app.generate_world(s)["orders"])
    first = env.reset(seed)
    w = web_app.generate_world(seed)
    assert env.world_id == base.world_id("web", w) and f"Welcome to {w['shop']}." in first
    g = env.goal
    assert g["user"] in w["users"] and g["password"] == w["users"][g["user"]]["password"]
    assert g["product"] in {x["name"] for x in w["products"]} and g["category"] in w["categories"]
    # A product page shows its reviews and their mean rating (computed here by hand).
    x = next(p for p in w["products"] if len(p["reviews"]) >= 2)
    obs = env.step(f'goto("/product/{x["id"]}")')
    mean = sum(r["stars"] for r in x["reviews"]) / len(x["reviews"])
    assert f'text "Rated {mean:.1f} of 5 ({len(x["reviews"])} reviews)"' in obs
    # A customer's past orders from the world are on their account page, products by name.
    o = w["orders"][0]
    env.step('goto("/login?next=/account")')
    obs = env.step(f'type(5, {o["user"]!r})')
    env.step(f'type(6, {w["users"][o["user"]]["password"]!r})')
    obs = env.step("click(7)")
    names = ", ".join(f'{w["products"][pid - 1]["name"]} x {q}' for pid, q in o["items"])
    assert f'Order #{o["id"]}: {sum(q for _, q in o["items"])} item(s) ({names}), {o["shipping"]}' in obs
    # Same seed, same world and screen; another seed, another shop.
    assert env.reset(seed + 1) != first and env.world_id != base.world_id("web", w)
    assert env.reset(seed) == first and env.world_id == base.world_id("web", w)
  finally:
    env.close()


# -- android -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 8, 99, 277])
def test_android_world_is_consistent_and_shown_on_the_home_screen(seed):
  w = android.generate_world(seed)
  names = [c["name"] for c in w["contacts"]]
  assert names == sorted(names) and len(set(names)) == len(names)
  assert all(re.fullmatch(r"\+?[\d ]{7,}", c["phone"]) for c in w["contacts"])  # what the app's own form accepts
  assert [a["time"] for a in w["alarms"]] == sorted(a["time"] for a in w["alarms"])
  assert all(0 <= int(a["time"][:2]) < 24 and 0 <= int(a["time"][3:]) < 60 for a in w["alarms"])
  assert {"Wi-Fi", "Bluetooth", "Dark theme"} <= set(w["settings"]) and 0 < w["settings"]["brightness"] < 100
  env = android.AndroidEnv()
  home = env.reset(seed)
  assert env.world_id == base.world_id("android", w)
  assert f"{w['owner']}'s phone  Battery {w['battery']}%" in home
  favs = [c["name"] for c in w["contacts"] if c["favourite"]]
  assert (f'text="Favourites: {", ".join(favs)}"' in home) == bool(favs)
  g = env.goal  # the task is drawn against this phone
  assert g["victim"] in names and g["name"] not in names
  assert g["label"] not in {a["label"] for a in w["alarms"]} and g["toggle"] in w["settings"]
  obs = env.step('open_app("Contacts")')
  assert re.findall(r'id="\d+" text="([^"]+)" clickable', obs)[:len(names)] == names
  obs = env.step('open_app("Settings")')
  for key, on in w["settings"].items():
    if key != "brightness":
      assert f'text="{key}" checked="{str(on).lower()}"' in obs


def test_android_worlds_differ_per_seed_and_repeat_per_seed():
  env = android.AndroidEnv()
  a = env.reset(30)
  wid = env.world_id
  env.step('open_app("Notes")')
  assert env.reset(31) != a and env.world_id != wid
  assert env.reset(30) == a and env.world_id == wid
  assert android.generate_world(30) == android.generate_world(30)
  # The episode edits its own copy: deleting a contact leaves the generated world as it was.
  env.contacts.pop()
  assert len(android.generate_world(30)["contacts"]) == len(env.contacts) + 1


# -- os (desktop) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 5, 64, 298])
def test_os_world_is_written_to_the_sandbox_and_tasks_use_it(tmp_path, seed):
  w = desktop.generate_world(seed)
  assert all(r.split("/")[0] in w["folders"] for r in w["files"])
  assert all(any(r.startswith(f + "/") for r in w["files"]) for f in w["folders"])  # no empty folder
  env = desktop.DesktopEnv(root=str(tmp_path))
  try:
    home = env.reset(seed)
    assert env.world_id == base.world_id("os", w) and f'"Files - /home/{w["user"]}"' in home
    assert re.findall(r'listitem "([^"]+)" type=folder', home) == sorted(w["folders"])
    for rel, body in w["files"].items():  # every listed file exists with its contents (or size)
      with open(os.path.join(env.home, rel), "rb") as f:
        data = f.read()
      assert data == body.encode() if isinstance(body, str) else len(data) == body
    g = env.goal
    folder, name = g["file"].split("/")
    assert g["file"] in w["files"] and name.endswith(".txt")
    assert g["newname"] not in os.listdir(os.path.join(env.home, folder))
    assert g["folder"] not in os.listdir(os.path.join(env.home, "Documents"))
    # The editor shows the file's generated text.
    obs = env.step(f'double_click({ui.find(home, chr(34) + folder)})')
    obs = env.step(f'double_click({ui.find(obs, chr(34) + name)})')
    assert f'textarea "{w["files"][g["file"]]}"'.replace("\n", "\\n") in obs
  finally:
    env.close()


def test_os_worlds_differ_per_seed_and_repeat_per_seed(tmp_path):
  env = desktop.DesktopEnv(root=str(tmp_path))
  try:
    a = env.reset(40)
    wid = env.world_id
    env.step("click(2)")  # an episode's change does not leak into the next episode of the same seed
    assert env.reset(41) != a and env.world_id != wid
    assert env.reset(40) == a and env.world_id == wid
  finally:
    env.close()
  assert desktop.generate_world(40) == desktop.generate_world(40)
  assert desktop.generate_world(40)["files"] != desktop.generate_world(41)["files"]
