"""GUI environments: web (real HTTP app), android and os (app models); collection and hygiene."""
import os
import re
import urllib.request

from lwm_jax.data import schema
from lwm_jax.envs import base, collect, recorder
from lwm_jax.envs.android import env as android
from lwm_jax.envs.desktop import env as desktop
from lwm_jax.envs.web import env as web
from lwm_jax.envs.web import app as web_app


def test_web_real_http_tree_forms_and_errors():
  env = web.WebEnv()
  try:
    init = env.reset(1)
    # Independent reference: fetch the same page with urllib and check the tree shows its links.
    html = urllib.request.urlopen(f"http://127.0.0.1:{env.server.port}/products").read().decode()
    names = re.findall(r'<a href="/product/\d+">([^<]+)</a>', html)
    obs = env.step(f"click({web.find(init, 'link', 'Products')})")
    assert obs.startswith('Page "Products - Shop" at http://shop.local/products')
    for n in names:
      assert f'link "{n}"' in obs
    assert str(env.server.port) not in obs
    # Login with a wrong password is a real form error; the right one signs in (session cookie).
    user, password = sorted(env.server.state.users.items())[0]  # an account of this seed's world
    obs = env.step('goto("/login")')
    u, pw = web.find(obs, "textbox", "Username"), web.find(obs, "textbox", "Password")
    env.step(f'type({u}, {user!r})')
    env.step(f'type({pw}, "nope")')
    obs = env.step(f"click({web.find(obs, 'button', 'Sign in')})")
    assert 'alert "Invalid username or password."' in obs
    env.step(f'type({web.find(obs, "textbox", "Username")}, {user!r})')
    obs = env.step(f'type({web.find(obs, "textbox", "Password")}, {password!r})')
    assert f'value="{"*" * len(password)}"' in obs
    obs = env.step(f"click({web.find(obs, 'button', 'Sign in')})")
    assert f'Signed in as {user}.' in obs and f'link "Account ({user})"' in obs
    assert env.step("click(999)").startswith("Error: no element with id 999")
    assert "[HTTP 404]" in env.step('goto("/nowhere")').splitlines()[0]
    assert env.step('goto("https://example.org/")').startswith("Error: cannot reach example.org")
  finally:
    env.close()


def test_android_logic_and_errors():
  env = android.AndroidEnv()
  env.reset(2)
  obs = env.step('open_app("Contacts")')
  n_before = len(env.contacts)
  obs = env.step(f"tap({android.ui.find(obs, 'Add contact')})")
  obs = env.step(f"tap({android.ui.find(obs, 'Save')})")
  assert 'text="Name is required"' in obs
  name_id = android.ui.find(obs, 'hint="Name"')
  obs = env.step(f'type({name_id}, "Zoe Quinn")')
  phone_id = android.ui.find(obs, 'hint="Phone"')
  obs = env.step(f'type({phone_id}, "+1 555 0100")')
  obs = env.step(f"tap({android.ui.find(obs, 'Save')})")
  assert len(env.contacts) == n_before + 1 and 'text="Zoe Quinn"' in obs
  assert env.step("tap(99)").startswith("Error: no element with id 99")
  assert env.step('open_app("Camera")').startswith("Error: no app named 'Camera'")
  assert "does not accept text" in env.step('type(1, "x")')
  assert env.describe().task and env.episode_meta()["model"].startswith("deterministic program")


def test_os_file_manager_acts_on_real_files_only_in_sandbox(tmp_path):
  os.makedirs(tmp_path / "sb")
  (tmp_path / "outside.txt").write_text("keep")
  env = desktop.DesktopEnv(root=str(tmp_path / "sb"))
  try:
    obs = env.reset(3)
    docs = desktop.ui.find(obs, '"Documents')
    obs = env.step(f"double_click({docs})")
    assert sorted(os.listdir(os.path.join(env.home, "Documents"))) == re.findall(r'listitem "([^"]+)"', obs)
    txt = next(r.split("/")[1] for r in env.world["files"] if r.startswith("Documents/") and r.endswith(".txt"))
    todo = desktop.ui.find(obs, f'"{txt}')
    obs = env.step(f"double_click({todo})")
    ta = desktop.ui.find(obs, "textarea")
    env.step(f'type({ta}, "- call plumber\\\\nDone.\\\\n")')
    obs = env.step('hotkey("ctrl+s")')
    assert f'statusbar "Saved {txt}"' in obs
    with open(os.path.join(env.home, "Documents", txt)) as f:
      assert f.read() == "- call plumber\nDone.\n"
    env.step('hotkey("ctrl+w")')
    obs = env.step("click(2)")  # New Folder
    assert os.path.isdir(os.path.join(env.home, "Documents", "New Folder"))
    assert env.step('hotkey("ctrl+q")').startswith("Error: unknown shortcut")
    home = env.home
  finally:
    env.close()
  assert not os.path.exists(home)
  assert sorted(os.listdir(tmp_path)) == ["outside.txt", "sb"] and os.listdir(tmp_path / "sb") == []
  assert (tmp_path / "outside.txt").read_text() == "keep"


def test_gui_determinism_and_unchanged_turns_dropped():
  for name in ("web", "android", "os"):
    a, b = recorder.record(name, 21, "g"), recorder.record(name, 21, "g")
    assert a.to_dict() == b.to_dict(), name
    assert "unchanged_turns_dropped" in a.meta

  class Idle(base.Agent):  # home() on the home screen changes nothing; the other two do
    def begin(self, env, initial_state):
      self.acts = ["home()", 'open_app("Notes")', "home()"]

    def act(self, observation):
      return self.acts.pop() if self.acts else None

  env = android.AndroidEnv()
  t = recorder.run_episode(env, Idle(None), 0, "x")
  assert t.meta["unchanged_turns_dropped"] == 1
  assert [x.action for x in t.turns] == ['open_app("Notes")', "home()"]


def test_collect_parallel_equals_serial_and_hygiene():
  par, stats = collect.collect("android", 6, seed=3, workers=2, progress=False)
  ser, _ = collect.collect("android", 6, seed=3, workers=1, progress=False)
  assert [t.to_dict() for t in par] == [t.to_dict() for t in ser]
  assert stats["kept"] + len(stats["dropped"]) == 6
  short = schema.Trajectory("x", "mcp", "t", "a", "s", [schema.Turn("a", "o")])
  assert collect.hygiene_problem(short) == "fewer than 2 turns"
  bad = schema.Trajectory("y", "mcp", "t", "a", "s", [schema.Turn('{"tool": "drop"}', "o")] * 2,
                          meta={"declared_tools": ["query"]})
  assert "undeclared tool 'drop'" in collect.hygiene_problem(bad)
