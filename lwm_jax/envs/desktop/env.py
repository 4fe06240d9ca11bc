"""The `os` environment: a deterministic model of a desktop over a real sandbox directory.

A program that models a desktop session (not a real window system; `meta['model']` says so) over
the seed's generated home directory (`generate_world`: user, folders, files, settings): a
file manager that lists, opens, creates, renames and deletes real files under a throwaway
sandbox directory, a text editor that reads and saves those files, and a settings window. The
screen is rendered as a UI tree with numbered interactive elements. Actions: `click(id)`,
`double_click(id)`, `type(id, "text")`, `hotkey("ctrl+s")`, `open_app("Name")`.
"""
from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
from typing import Any

from lwm_jax.envs import base, ui
from lwm_jax.envs.ui import Widget

ACTION_SPACE = """\
One action per turn, Python call syntax:
  click(id)             click a button, list item or menu entry
  double_click(id)      open a file or folder in the file manager
  type(id, "text")      replace the text of a text field or the editor's text area
  hotkey("ctrl+s")      keyboard shortcut: ctrl+s save, ctrl+w close window, alt+tab next window
  open_app("Name")      start Files, Text Editor or Settings from the dock
Observation: the UI tree of the focused window plus the dock; interactive elements have [id]."""
APPS = ("Files", "Text Editor", "Settings")
TASKS = {"edit": "Open ~/{file} in the editor, add the line '{line}' and save it.",
         "mkdir": "Create a folder named {folder} in Documents.",
         "rename": "Rename ~/{file} to {newname}.",
         "delete": "Delete ~/{file}.",
         "theme": "Switch the desktop theme to {theme} and lower the volume."}
MAX_NAME_BYTES = 255  # the longest file name Linux file systems accept
# How the apps' failure messages begin (`DesktopEnv._fail`); the `error` reader knows them by it.
FAILURES = ("Nothing to save", "No application can open", "Invalid name", "A file named", "Cannot rename")

# -- the generated home directory ----------------------------------------------------------------------
_USERS = ["sam", "ana", "lee", "maria", "tomek", "ines", "kwame", "yuki", "oliver", "priya", "noor", "jonas",
          "elif", "marco", "hana", "dev"]
_CHORES = ["call plumber", "renew passport", "book dentist", "pay council tax", "return library books",
           "fix bike brake", "order printer ink", "water the ferns", "email landlord", "back up laptop"]
_PEOPLE = ["Ms Okafor", "Mr Brandt", "Dr Ruiz", "Aunt Polly", "Mrs Hale", "Professor Lind"]
_SONGS = ["morning_light", "slow_river", "city_rain", "blue_hour", "north_road", "paper_moon", "low_tide",
          "late_train", "wild_thyme", "glass_house"]
_WALLPAPERS = ["Hills", "Lake", "Dunes", "Nebula", "Plain blue", "Autumn"]
_EXTRA_FOLDERS = ["Recipes", "Taxes", "Band", "Garden", "Thesis", "Invoices", "Travel"]


def _text(kind: str, rng: random.Random, user: str) -> str:
  """Contents of one generated text file of `kind`."""
  if kind == "todo":
    return "".join(f"- {c}\n" for c in rng.sample(_CHORES, rng.randint(2, 5)))
  if kind == "report":
    q = rng.randint(1, 4)
    return (f"Q{q} report\nSales {rng.choice(['up', 'down'])} {rng.randint(1, 19)}%.\n"
            f"New customers: {rng.randint(5, 400)}.\nNext review in week {rng.randint(1, 52)}.\n")
  if kind == "letter":
    return (f"Dear {rng.choice(_PEOPLE)},\n\nThank you for your note of {rng.randint(1, 28)} May. "
            f"I will reply in full by {rng.choice(['Friday', 'Monday', 'the end of the month'])}.\n\n"
            f"Best wishes,\n{user.title()}\n")
  if kind == "notes":
    return "".join(f"{rng.choice(['Idea', 'Remember', 'Ask', 'Check'])}: {c}\n"
                   for c in rng.sample(_CHORES, rng.randint(1, 4)))
  if kind == "csv":
    months = rng.sample(["jan", "feb", "mar", "apr", "may", "jun"], rng.randint(2, 5))
    return "month,amount\n" + "".join(f"{m},{rng.randint(20, 2400)}\n" for m in months)
  if kind == "log":
    steps = rng.sample(["unpacking", "checking disk space", "copying files", "writing config",
                        "registering service", "cleaning up"], rng.randint(2, 5))
    return "".join(f"[{i:02d}] {s}\n" for i, s in enumerate(steps, 1)) + rng.choice(["done\n", "failed: code 2\n"])
  if kind == "m3u":
    return "".join(f"{t}.mp3\n" for t in rng.sample(_SONGS, rng.randint(2, 6)))
  raise ValueError(f"unknown file kind {kind!r}")


# folder -> candidate files (name, kind); a kind of "bin" is a binary file of that many bytes.
def _candidates(folder: str, rng: random.Random) -> list[tuple[str, str]]:
  n = rng.randint(100, 999)
  return {
      "Documents": [("report.txt", "report"), ("todo.txt", "todo"), ("letter.txt", "letter"),
                    ("budget.csv", "csv"), (f"minutes-{rng.randint(1, 12):02d}.txt", "notes"),
                    ("ideas.txt", "notes"), (f"invoice-{n}.txt", "letter"), ("reading-list.txt", "todo")],
      "Downloads": [("setup.log", "log"), (f"install-{rng.randint(1, 9)}.{rng.randint(0, 9)}.log", "log"),
                    ("notes.txt", "notes"), ("manual.txt", "notes"), (f"IMG_{n}.jpg", "bin")],
      "Pictures": [("cat.png", "bin"), ("beach.jpg", "bin"), (f"IMG_{n}.jpg", "bin"),
                   (f"screenshot-{rng.randint(1, 28):02d}.png", "bin"), ("captions.txt", "notes")],
      "Music": [("playlist.m3u", "m3u"), ("roadtrip.m3u", "m3u"), ("focus.m3u", "m3u"), ("lyrics.txt", "notes")],
      "Videos": [("holiday.mp4", "bin"), ("recital.mp4", "bin"), ("subtitles.txt", "notes")],
      "Recipes": [("lentil-soup.txt", "notes"), ("flatbread.txt", "notes"), ("shopping.txt", "todo")],
      "Taxes": [("income.csv", "csv"), ("receipts.csv", "csv"), ("to-file.txt", "todo")],
      "Band": [("setlist.txt", "todo"), ("gigs.csv", "csv"), ("demo.m3u", "m3u")],
      "Garden": [("planting.txt", "todo"), ("harvest.csv", "csv"), ("shed-plan.png", "bin")],
      "Thesis": [("chapter1.txt", "report"), ("references.txt", "notes"), ("results.csv", "csv")],
      "Invoices": [(f"invoice-{n}.txt", "letter"), (f"invoice-{n + 1}.txt", "letter"), ("paid.csv", "csv")],
      "Travel": [("itinerary.txt", "todo"), ("packing.txt", "todo"), ("costs.csv", "csv")],
  }[folder]


def generate_world(seed: int) -> dict[str, Any]:
  """The desktop of world `seed`: user name, home folders and files (text contents, or the size of
  binary files) and settings. JSON-serialisable; `reset` writes it into the sandbox."""
  rng = random.Random(f"os-world-{seed}")
  user = rng.choice(_USERS)
  folders = ["Documents"] + sorted(rng.sample(["Downloads", "Pictures", "Music", "Videos"], rng.randint(1, 4))
                                   + rng.sample(_EXTRA_FOLDERS, rng.randint(0, 2)))
  files: dict[str, Any] = {}
  for folder in folders:
    cands = _candidates(folder, rng)
    lo = 2 if folder == "Documents" else 1  # Documents always holds some text to work on
    for name, kind in rng.sample(cands, rng.randint(lo, min(5, len(cands)))):
      files[f"{folder}/{name}"] = rng.randint(2_000, 90_000) if kind == "bin" else _text(kind, rng, user)
  if not any(r.startswith("Documents/") and r.endswith(".txt") for r in files):
    files["Documents/todo.txt"] = _text("todo", rng, user)
  return {"user": user, "folders": folders, "files": dict(sorted(files.items())),
          "settings": {"theme": rng.choice(["Light", "Dark"]), "volume": rng.choice(range(10, 100, 10)),
                       "wallpaper": rng.choice(_WALLPAPERS)}}


_WINDOW_RE = re.compile(
    r'^(?:window "(.*)" app=.+ \(1 of \d+ windows\)|(desktop) \(no open windows\))$', re.M)


def screen(observation: str) -> str | None:
  """The window an observation shows on top (its title without the editor's unsaved mark `*`,
  or "desktop" with none open, as `DesktopEnv.draw` renders it; an error line may come first),
  or None when it shows none."""
  m = _WINDOW_RE.search(observation)
  if not m:
    return None
  return m.group(2) or m.group(1).removeprefix("*")


_FAILURE_RE = re.compile(r'^  statusbar "((?:%s)[^\n]*)"$' % "|".join(map(re.escape, FAILURES)), re.M)
_APP_RE = re.compile(r'^window ".*" app=(.+) \(1 of \d+ windows\)$', re.M)


def error(observation: str) -> str:
  """The error an observation shows (what `DesktopEnv.step` sets as `step_error`): the `Error:`
  line of an invalid action, or "<app>: <message>" when the window's status bar reports a
  failure (a status bar shows the message of the step that set it only)."""
  err = ui.action_error(observation)
  if err:
    return err
  m = _FAILURE_RE.search(observation)
  if m is None:
    return ""
  app = _APP_RE.search(observation)
  return f"{app.group(1) if app else '?'}: {m.group(1)}"


class DesktopEnv(ui.UiEnv):
  domain = "os"
  style = "desktop"
  signatures = {"click": ("id",), "double_click": ("id",), "type": ("id", "text"), "hotkey": ("keys",),
                "open_app": ("name",)}

  def __init__(self, root: str | None = None) -> None:
    super().__init__()
    self.root_parent = root

  def reset(self, seed: int) -> str:
    rng = self._begin(seed)
    world = generate_world(seed)
    self._set_world(world)
    self.world = world
    self._make_dir("lwm_os_")
    self.home = os.path.join(self.sandbox, "home")
    self.home_shown = f"/home/{world['user']}"
    for folder in world["folders"]:
      os.makedirs(os.path.join(self.home, folder), exist_ok=True)
    for rel, body in world["files"].items():
      with open(os.path.join(self.home, rel), "wb") as f:  # a binary file: a header and its size in bytes
        f.write(body.encode() if isinstance(body, str) else (b"\x89BIN\r\n" + bytes(body - 6)))
    self.windows: list[dict[str, Any]] = [{"app": "Files", "cwd": self.home, "sel": None, "rename": None}]
    self.settings = dict(world["settings"])
    txts = sorted(r for r in world["files"] if r.endswith(".txt"))
    kind = rng.choice(["edit", "mkdir", "rename", "delete", "theme"])
    file = rng.choice(txts)
    taken = {os.path.basename(r) for r in world["files"] if r.startswith(os.path.dirname(file) + "/")}
    docs = {r.split("/")[1] for r in world["files"] if r.startswith("Documents/")}
    g = self._set_goal(TASKS, {
        "kind": kind, "file": file,
        "folder": rng.choice([d for d in ["Projects", "Archive", "Taxes", "Receipts", "Drafts", "Scans"] if d not in docs]),
        "line": rng.choice(["Checked.", "Done by Friday.", "See attached.", "Sent to accounts.", "Ask Sam."]),
        "newname": rng.choice([n for n in ["final.txt", "old.txt", "draft.txt", "backup.txt", "v2.txt"] if n not in taken])},
        theme="Light" if self.settings["theme"] == "Dark" else "Dark")
    return self._ready(g["text"], ACTION_SPACE, self.current())

  def episode_meta(self) -> dict[str, Any]:
    return {"task_kind": self.goal.get("kind"), "model": "deterministic program modelling a desktop "
            "(file manager over a real sandbox directory, editor, settings); not a real window system",
            "normalised": ["sandbox path shown as the world's /home/<user>"]}

  def close(self) -> None:
    self._remove_dir()

  def state_digest(self) -> str | None:
    """The sandbox's files (home and trash: each path with the hash of its bytes, or a folder) and
    the settings; not the windows open, the selection or an editor's unsaved text."""
    if not self.sandbox:
      return None
    tree: dict[str, str] = {}
    for root, dirs, files in os.walk(self.sandbox):
      rel = os.path.relpath(root, self.sandbox)
      for d in dirs:
        tree[os.path.join(rel, d)] = "folder"
      for f in files:
        with open(os.path.join(root, f), "rb") as fh:
          tree[os.path.join(rel, f)] = hashlib.sha256(fh.read()).hexdigest()
    return base.canonical_digest({"files": tree, "settings": self.settings})

  def shown(self, path: str) -> str:
    return self.home_shown + path[len(self.home):]

  # -- actions ------------------------------------------------------------------------------------
  def key(self, name: str, kw: dict[str, Any]) -> None:
    if name == "open_app":
      app = kw.get("name")
      if app not in APPS:
        raise ValueError(f"no application named {app!r}")
      self.windows.append({"app": app, "cwd": self.home, "sel": None, "rename": None, "path": None,
                           "text": "", "saved": "", "msg": ""})
    elif name == "hotkey":
      keys = str(kw.get("keys", "")).lower()
      win = self.windows[-1] if self.windows else None
      if keys == "ctrl+s" and win and win["app"] == "Text Editor":
        self._save(win)
      elif keys == "ctrl+w" and win:
        self.windows.pop()
      elif keys == "alt+tab" and len(self.windows) > 1:
        self.windows.insert(0, self.windows.pop())
      elif keys not in ("ctrl+s", "ctrl+w", "alt+tab"):
        raise ValueError(f"unknown shortcut {keys!r}")
    else:
      raise ValueError(f"unsupported action {name}")

  def _fail(self, win: dict[str, Any], msg: str) -> None:
    """Shows an app's failure message in its status bar and reports it as the step's error."""
    assert msg.startswith(FAILURES), msg
    win["msg"] = msg
    self.refuse(f"{win['app']}: {msg}")

  def _save(self, win: dict[str, Any]) -> None:
    if win["path"] is None:
      self._fail(win, "Nothing to save: no file is open")
      return
    with open(win["path"], "w") as f:
      f.write(win["text"])
    win["saved"] = win["text"]
    win["msg"] = f"Saved {os.path.basename(win['path'])}"

  def _open(self, win: dict[str, Any], name: str) -> None:
    path = os.path.join(win["cwd"], name)
    if os.path.isdir(path):
      win.update(cwd=path, sel=None, rename=None)
    elif name.endswith((".txt", ".csv", ".log", ".m3u")):
      text = open(path).read()
      self.windows.append({"app": "Text Editor", "path": path, "text": text, "saved": text, "msg": ""})
    else:
      self._fail(win, f"No application can open {name}")

  def _rename(self, win: dict[str, Any]) -> None:
    new = win["rename"].strip()
    old = os.path.join(win["cwd"], win["sel"])
    if not new or "/" in new or "\0" in new or new in (".", ".."):
      self._fail(win, f"Invalid name {new!r}")
    elif len(os.fsencode(new)) > MAX_NAME_BYTES:
      self._fail(win, f"Invalid name: {len(os.fsencode(new))} bytes long (at most {MAX_NAME_BYTES})")
    elif os.path.exists(os.path.join(win["cwd"], new)):
      self._fail(win, f"A file named {new} already exists")
    else:
      try:
        os.rename(old, os.path.join(win["cwd"], new))
        win["sel"], win["msg"] = new, f"Renamed to {new}"
      except OSError as e:  # what a file manager shows when the file system says no
        self._fail(win, f"Cannot rename {win['sel']}: {e.strerror}")
    win["rename"] = None

  def _delete(self, win: dict[str, Any]) -> None:
    trash = os.path.join(self.sandbox, "trash")
    os.makedirs(trash, exist_ok=True)
    shutil.move(os.path.join(win["cwd"], win["sel"]), os.path.join(trash, win["sel"]))
    win["msg"], win["sel"] = f"Moved {win['sel']} to Trash", None

  def _mkdir(self, win: dict[str, Any]) -> None:
    name, k = "New Folder", 2
    while os.path.exists(os.path.join(win["cwd"], name)):
      name, k = f"New Folder {k}", k + 1
    os.mkdir(os.path.join(win["cwd"], name))
    win.update(sel=name, rename=name, msg="")

  # -- drawing ------------------------------------------------------------------------------------
  def draw(self) -> tuple[str, list[Widget]]:
    w: list[Widget] = []
    if not self.windows:
      header = "desktop (no open windows)"
    else:
      win = self.windows[-1]
      getattr(self, "_draw_" + win["app"].replace(" ", "_").lower())(w, win)
      header = f'window "{w[0].text}" app={win["app"]} (1 of {len(self.windows)} windows)'
      w = w[1:]
    w.append(Widget("dock", "", 0))
    for app in APPS:
      w.append(Widget("button", app, 1, on_tap=lambda a=app: self.key("open_app", {"name": a})))
    return header, w

  def _draw_files(self, w: list[Widget], win: dict[str, Any]) -> None:
    w.append(Widget("title", f"Files - {self.shown(win['cwd'])}"))
    w.append(Widget("toolbar", "", 0))
    w.append(Widget("button", "Up", 1, on_tap=lambda: win.update(
        cwd=os.path.dirname(win["cwd"]) if win["cwd"] != self.home else win["cwd"], sel=None)))
    w.append(Widget("button", "New Folder", 1, on_tap=lambda: self._mkdir(win)))
    if win["sel"]:
      w.append(Widget("button", "Rename", 1, on_tap=lambda: win.update(rename=win["sel"])))
      w.append(Widget("button", "Delete", 1, on_tap=lambda: self._delete(win)))
    names = sorted(os.listdir(win["cwd"]), key=lambda n: (not os.path.isdir(os.path.join(win["cwd"], n)), n))
    w.append(Widget("list", "", 0, attrs={"items": len(names)}))
    for n in names:
      full = os.path.join(win["cwd"], n)
      attrs = ({"type": "folder", "items": len(os.listdir(full))} if os.path.isdir(full)
               else {"size": f"{os.path.getsize(full)}B"})
      if n == win["sel"]:
        attrs["selected"] = "yes"
      w.append(Widget("listitem", n, 1, on_tap=lambda n=n: win.update(sel=n, rename=None),
                      on_double=lambda n=n: self._open(win, n), attrs=attrs))
    if win["rename"] is not None:
      w.append(Widget("textfield", win["rename"], 0, on_type=lambda t: win.update(rename=t), attrs={"label": "Name"}))
      w.append(Widget("button", "OK", 0, on_tap=lambda: self._rename(win)))
    if win.get("msg"):
      w.append(Widget("statusbar", win.pop("msg"), 0))

  def _draw_text_editor(self, w: list[Widget], win: dict[str, Any]) -> None:
    name = os.path.basename(win["path"]) if win["path"] else "Untitled"
    dirty = "*" if win["text"] != win["saved"] else ""
    w.append(Widget("title", f"{dirty}{name} - Text Editor"))
    w.append(Widget("button", "Save", 0, on_tap=lambda: self._save(win)))
    w.append(Widget("button", "Close", 0, on_tap=lambda: self.windows.remove(win)))
    w.append(Widget("textarea", win["text"].replace("\n", "\\n"), 0,
                    on_type=lambda t: win.update(text=t.replace("\\n", "\n"))))
    if win.get("msg"):
      w.append(Widget("statusbar", win.pop("msg"), 0))

  def _draw_settings(self, w: list[Widget], win: dict[str, Any]) -> None:
    s = self.settings
    w.append(Widget("title", "Settings"))
    w.append(Widget("group", "Appearance", 0))
    w.append(Widget("label", f"Wallpaper: {s['wallpaper']}", 1))
    for theme in ("Light", "Dark"):
      w.append(Widget("radio", theme, 1, on_tap=lambda t=theme: s.update(theme=t),
                      attrs={"checked": "yes" if s["theme"] == theme else "no"}))
    w.append(Widget("group", "Sound", 0))
    w.append(Widget("slider", "Volume", 1, attrs={"value": s["volume"]}))
    w.append(Widget("button", "Volume -", 1, on_tap=lambda: s.update(volume=max(0, s["volume"] - 10))))
    w.append(Widget("button", "Volume +", 1, on_tap=lambda: s.update(volume=min(100, s["volume"] + 10))))
    w.append(Widget("button", "Close", 0, on_tap=lambda: self.windows.remove(win)))


class DesktopAgent(base.PlanAgent):
  """Browses to the file, works on it through the apps, with slips (wrong items, bad keys)."""

  def make_plan(self, env: base.Env, initial_state: str) -> list[Any]:
    r, g = self.rng, env.goal
    folder, fname = g["file"].split("/")
    s: list[Any] = []
    if r.random() < 0.25:
      s += [("double_click", r.choice(env.world["folders"])), ("click", "Up")]
    if r.random() < 0.15:
      s.append(r.choice(['hotkey("ctrl+q")', "click(50)", 'open_app("Terminal")', 'type(1, "x")']))
    k = g["kind"]
    if k == "edit":
      s += [("double_click", folder), ("double_click", fname)]
      s += [("type_append", "textarea", g["line"])]
      s.append('hotkey("ctrl+s")' if r.random() < 0.5 else ("click", "Save"))
      if r.random() < 0.5:
        s.append('hotkey("ctrl+w")')
    elif k == "mkdir":
      s += [("double_click", "Documents"), ("click", "New Folder"), ("type", "textfield", g["folder"]), ("click", "OK")]
    elif k == "rename":
      s += [("double_click", folder), ("click", fname), ("click", "Rename"), ("type", "textfield", g["newname"]),
            ("click", "OK")]
    elif k == "delete":
      s += [("double_click", folder)]
      if r.random() < 0.3:
        s.append(("double_click", fname))  # opens it first by mistake
        s.append(("click", "Close"))
      s += [("click", fname), ("click", "Delete")]
    else:
      s += ['open_app("Settings")' if r.random() < 0.5 else ("click", "Settings"),
            ("click", "Light" if env.settings["theme"] == "Dark" else "Dark"), ("click", "Volume -")]
      if r.random() < 0.5:
        s.append(("click", "Volume -"))
    if r.random() < 0.3:
      s.append(r.choice(['hotkey("alt+tab")', ("click", "Up"), 'hotkey("ctrl+w")']))
    return s

  def resolve(self, step: Any, observation: str) -> str | None:
    op, text = step[0], step[1]
    i = ui.find(observation, f'"{text}' if op in ("click", "double_click") else text)
    if i is None:
      return None
    if op == "type_append":
      line = next((l for l in observation.splitlines() if f"[{i}] textarea" in l), "")
      cur = line.split('"', 1)[1].rsplit('"', 1)[0] if '"' in line else ""
      return f"type({i}, {cur + step[2] + chr(92) + 'n'!r})"
    if op == "type":
      return f"type({i}, {step[2]!r})"
    return f"{op}({i})"
