"""Environment facts of the GUI domains (android, os, web): a step's `step_error` comes from the
environment's own machinery (an action it could not parse or dispatch, a form's validation, an
app's failure message, the shop's HTTP status or refusal notice), `state_digest` moves exactly
when app data, files or the shop's state change (not on navigation or typing into a draft), and
each domain's `error` reader agrees with the recorded signal on every turn of real episodes."""
from __future__ import annotations

import collections

import pytest

from lwm_jax import domains
from lwm_jax.envs import base, recorder
from lwm_jax.envs.android import env as android
from lwm_jax.envs.desktop import env as desktop
from lwm_jax.envs.web import env as web

SEEDS = range(20)


@pytest.fixture(scope="module")
def web_env():
  env = web.WebEnv()  # one shop client for the module: each reset starts a fresh server
  yield env
  env.set_perturb(None)
  env.close()


def _step(env: base.Env, reader, action: str) -> tuple[str, str, bool]:
  """(observation, step_error, changed) of one step as the recorder sees it; the domain's reader
  must read the same error off the observation."""
  before = env.state_digest()
  env.step_error = "left over"  # step() itself must clear it
  obs = env.step(action)
  assert reader(obs) == env.step_error, (action, obs)
  return obs, env.step_error, env.state_digest() != before


def test_readers_are_registered():
  assert domains.get_domain("android").load("error") is android.error
  assert domains.get_domain("os").load("error") is desktop.error
  assert domains.get_domain("web").load("error") is web.error


def test_android_errors_and_changes():
  env = android.AndroidEnv()
  env.reset(2)
  s = lambda a: _step(env, android.error, a)
  find = android.ui.find
  field = lambda obs, hint: find(obs, f'hint="{hint}"')
  obs, err, changed = s('open_app("Contacts")')
  assert (err, changed) == ("", False)
  obs, err, changed = s(f"tap({find(obs, 'Add contact')})")
  assert (err, changed) == ("", False)  # navigation
  obs, err, changed = s(f"tap({find(obs, 'Save')})")
  assert (err, changed) == ("form: Name is required", False)
  # the message stays on screen while the form is filled in: no longer this step's error
  obs, err, changed = s(f'type({field(obs, "Name")}, "Zoe Quinn")')
  assert (err, changed) == ("", False) and 'text="Name is required"' in obs
  obs, err, changed = s(f'type({field(obs, "Phone")}, "call me")')
  assert (err, changed) == ("", False)
  obs, err, changed = s(f"tap({find(obs, 'Save')})")
  assert (err, changed) == ("form: Invalid phone number", False)
  obs, err, changed = s(f'type({field(obs, "Phone")}, "+1 555 0100")')
  assert (err, changed) == ("", False)
  n = len(env.contacts)
  obs, err, changed = s(f"tap({find(obs, 'Save')})")
  assert (err, changed) == ("", True) and len(env.contacts) == n + 1
  obs, err, changed = s("tap(99)")
  assert (err, changed) == ("invalid action: no element with id 99 on screen", False)
  obs, err, changed = s('open_app("Camera")')
  assert err == "invalid action: no app named 'Camera' is installed" and not changed
  obs, err, changed = s('open_app("Settings")')
  assert (err, changed) == ("", False)
  obs, err, changed = s(f"tap({find(obs, 'Brightness up')})")
  assert (err, changed) == ("", True)
  obs, err, changed = s("home()")
  assert (err, changed) == ("", False)  # the clock moves; the phone's data does not


def test_os_errors_and_changes(tmp_path):
  env = desktop.DesktopEnv(root=str(tmp_path))
  try:
    obs = env.reset(3)
    s = lambda a: _step(env, desktop.error, a)
    find = desktop.ui.find
    el = lambda obs, text: find(obs, '"' + text)  # the element whose text starts with `text`
    obs, err, changed = s(f"double_click({el(obs, 'Documents')})")
    assert (err, changed) == ("", False)
    obs, err, changed = s(f"click({el(obs, 'todo.txt')})")
    assert (err, changed) == ("", False)  # selecting is not a change
    obs, err, changed = s(f"click({el(obs, 'Rename')})")
    obs, err, changed = s(f'type({find(obs, "textfield")}, "ideas.txt")')
    assert (err, changed) == ("", False)
    obs, err, changed = s(f"click({el(obs, 'OK')})")
    assert (err, changed) == ("Files: A file named ideas.txt already exists", False)
    obs, err, changed = s(f"click({el(obs, 'Rename')})")
    obs, err, changed = s(f'type({find(obs, "textfield")}, "")')
    obs, err, changed = s(f"click({el(obs, 'OK')})")
    assert (err, changed) == ("Files: Invalid name ''", False)
    obs, err, changed = s(f"click({el(obs, 'Rename')})")
    obs, err, changed = s(f'type({find(obs, "textfield")}, "done.txt")')
    obs, err, changed = s(f"click({el(obs, 'OK')})")
    assert (err, changed) == ("", True) and 'statusbar "Renamed to done.txt"' in obs
    obs, err, changed = s(f"double_click({el(obs, 'report.txt')})")
    assert (err, changed) == ("", False)  # opening a file
    obs, err, changed = s(f'type({find(obs, "textarea")}, "rewritten\\\\n")')
    assert (err, changed) == ("", False)  # unsaved text is not the file
    obs, err, changed = s('hotkey("ctrl+s")')
    assert (err, changed) == ("", True)
    obs, err, changed = s('hotkey("ctrl+w")')
    obs, err, changed = s(f"click({el(obs, 'Up')})")
    obs, err, changed = s(f"double_click({el(obs, 'Downloads')})")
    obs, err, changed = s(f"double_click({el(obs, 'IMG_833.jpg')})")
    assert (err, changed) == ("Files: No application can open IMG_833.jpg", False)
    obs, err, changed = s('open_app("Text Editor")')
    obs, err, changed = s('hotkey("ctrl+s")')
    assert (err, changed) == ("Text Editor: Nothing to save: no file is open", False)
    obs, err, changed = s('hotkey("ctrl+q")')
    assert (err, changed) == ("invalid action: unknown shortcut 'ctrl+q'", False)
    obs, err, changed = s('open_app("Settings")')
    obs, err, changed = s(f"click({el(obs, 'Volume +')})")
    assert (err, changed) == ("", True)
    obs, err, changed = s("click(77)")
    assert (err, changed) == ("invalid action: no element with id 77 on screen", False)
  finally:
    env.close()


def test_web_errors_and_changes(web_env):
  env = web_env
  env.set_perturb(None)
  obs = env.reset(1)
  s = lambda a: _step(env, web.error, a)
  obs, err, changed = s(f"click({web.find(obs, 'link', 'Products')})")
  assert (err, changed) == ("", False)
  obs, err, changed = s('goto("/product/4")')  # Daily Planner, 3 in stock
  obs, err, changed = s(f'select({web.find(obs, "combobox", "Quantity")}, "5")')
  assert (err, changed) == ("", False)
  obs, err, changed = s(f"click({web.find(obs, 'button', 'Add to cart')})")
  assert (err, changed) == ("refused: Only 3 of Daily Planner in stock.", False)
  obs, err, changed = s(f'select({web.find(obs, "combobox", "Quantity")}, "2")')
  assert (err, changed) == ("", False) and 'alert "Only 3 of Daily Planner in stock."' in obs
  obs, err, changed = s(f"click({web.find(obs, 'button', 'Add to cart')})")
  assert (err, changed) == ("", True) and obs.startswith('Page "Cart - Shop"')
  obs, err, changed = s(f"click({web.find(obs, 'link', 'Checkout')})")
  assert (err, changed) == ("", False)  # a sign-in gate is the site's way, not a refusal
  obs, err, changed = s(f'type({web.find(obs, "textbox", "Username")}, "gus")')
  obs, err, changed = s(f'type({web.find(obs, "textbox", "Password")}, "letmein")')
  obs, err, changed = s(f"click({web.find(obs, 'button', 'Sign in')})")
  assert (err, changed) == ("refused: Invalid username or password.", False)
  obs, err, changed = s(f'type({web.find(obs, "textbox", "Username")}, "gus")')
  assert (err, changed) == ("", False)  # the notice stays up while the form is filled in again
  obs, err, changed = s(f'type({web.find(obs, "textbox", "Password")}, "quartz73")')
  obs, err, changed = s(f"click({web.find(obs, 'button', 'Sign in')})")
  assert (err, changed) == ("", True) and obs.startswith('Page "Checkout - Shop"')
  obs, err, changed = s(f"click({web.find(obs, 'button', 'Place order')})")
  assert (err, changed) == ("refused: Please enter a full delivery address.", False)
  obs, err, changed = s(f'type({web.find(obs, "textbox", "Delivery address")}, "33 Orchard Close, Hull")')
  obs, err, changed = s(f"click({web.find(obs, 'button', 'Place order')})")
  assert (err, changed) == ("", True) and obs.startswith('Page "Account - Shop"')
  obs, err, changed = s('goto("/nowhere")')
  assert (err, changed) == ("HTTP 404", False)
  obs, err, changed = s("back()")
  assert (err, changed) == ("", False)
  obs, err, changed = s("click(999)")
  assert (err, changed) == ("invalid action: no element with id 999 on this page", False)
  obs, err, changed = s('goto("/checkout")')
  assert (err, changed) == ("refused: Your cart is empty.", False)
  env.set_perturb("errors:rate=1.0,kind=timeout")
  env.reset(1)
  obs, err, changed = s('goto("/products")')
  assert (err, changed) == ("HTTP 504", False)
  env.set_perturb(None)


def _recorded(name: str, env: base.Env | None = None, perturbs: tuple[str | None, ...] = (None,)):
  """The error kinds of every recorded turn over SEEDS (under each perturbation), checking that
  the reader agrees with the signal on each, and that typing or an invalid action changes no
  state."""
  reader = domains.get_domain(name).load("error")
  kinds: collections.Counter = collections.Counter()
  changed = 0
  for spec in perturbs:
    if hasattr(env, "set_perturb"):
      env.set_perturb(spec)
    for seed in SEEDS:
      t = recorder.record(name, seed, f"{name}-{seed}", env=env)
      for i, x in enumerate(t.turns):
        err = x.env["error"]
        assert reader(x.observation) == err, (name, spec, seed, i, x.action, x.observation)
        kinds[err.split(":")[0] if err else ""] += 1
        changed += x.env["changed"]
        if x.action.startswith("type(") or err.startswith("invalid action"):
          assert not x.env["changed"], (name, seed, i, x.action)
  assert changed and kinds[""], (name, kinds)
  return kinds


def test_readers_agree_with_recorded_android_and_os_episodes(tmp_path):
  kinds = _recorded("android")
  assert kinds["invalid action"] and kinds["form"], kinds
  env = desktop.DesktopEnv(root=str(tmp_path))
  try:
    kinds = _recorded("os", env)
  finally:
    env.close()
  assert kinds["invalid action"], kinds


def test_reader_agrees_with_recorded_web_episodes(web_env):
  kinds = _recorded("web", web_env, (None, "errors:rate=0.3,kind=timeout",
                                     "errors:rate=0.1,kind=unavailable; partial:rate=0.4",
                                     "rate_limit:limit=5"))
  web_env.set_perturb(None)
  for kind in ("invalid action", "refused", "HTTP 504", "HTTP 503", "HTTP 409", "HTTP 429"):
    assert kinds[kind], (kind, kinds)
