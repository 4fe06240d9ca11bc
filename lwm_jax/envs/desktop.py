"""The `os` environment: a deterministic model of a desktop over a real sandbox directory.

A program that models a desktop session (not a real window system; `meta['model']` says so): a
file manager that lists, opens, creates, renames and deletes real files under a throwaway
sandbox directory, a text editor that reads and saves those files, and a settings window. The
screen is rendered as a UI tree with numbered interactive elements. Actions: `click(id)`,
`double_click(id)`, `type(id, "text")`, `hotkey("ctrl+s")`, `open_app("Name")`.
"""
from __future__ import annotations

import os
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
HOME_SHOWN = "/home/user"
APPS = ("Files", "Text Editor", "Settings")
TASKS = {"edit": "Open ~/{file} in the editor, add the line '{line}' and save it.",
         "mkdir": "Create a folder named {folder} in Documents.",
         "rename": "Rename ~/{file} to {newname}.",
         "delete": "Delete ~/{file}.",
         "theme": "Switch the desktop theme to {theme} and lower the volume."}
MAX_NAME_BYTES = 255  # the longest file name Linux file systems accept


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
    self._make_dir("lwm_os_")
    self.home = os.path.join(self.sandbox, "home")
    files = {"Documents/report.txt": "Quarterly report\nSales up 4%.\n",
             "Documents/todo.txt": "- call plumber\n- renew passport\n",
             "Pictures/cat.png": "PNG", "Music/playlist.m3u": "song1.mp3\nsong2.mp3\n"}
    for extra in rng.sample(["Documents/letter.txt", "Documents/budget.csv", "Downloads/setup.log",
                             "Downloads/notes.txt", "Pictures/beach.jpg"], rng.randint(1, 4)):
      files[extra] = f"{os.path.basename(extra)} contents {rng.randint(1, 99)}\n"
    for rel, text in files.items():
      full = os.path.join(self.home, rel)
      os.makedirs(os.path.dirname(full), exist_ok=True)
      with open(full, "w") as f:
        f.write(text)
    os.makedirs(os.path.join(self.home, "Downloads"), exist_ok=True)
    self.windows: list[dict[str, Any]] = [{"app": "Files", "cwd": self.home, "sel": None, "rename": None}]
    self.settings = {"theme": rng.choice(["Light", "Dark"]), "volume": rng.choice([20, 40, 60]),
                     "wallpaper": "Hills"}
    txts = sorted(r for r in files if r.endswith(".txt"))
    kind = rng.choice(["edit", "mkdir", "rename", "delete", "theme"])
    g = self._set_goal(TASKS, {
        "kind": kind, "file": rng.choice(txts), "folder": rng.choice(["Projects", "Archive", "Taxes"]),
        "line": rng.choice(["Checked.", "Done by Friday.", "See attached."]),
        "newname": rng.choice(["final.txt", "old.txt", "draft.txt"])},
        theme="Light" if self.settings["theme"] == "Dark" else "Dark")
    return self._ready(g["text"], ACTION_SPACE, self.current())

  def episode_meta(self) -> dict[str, Any]:
    return {"task_kind": self.goal.get("kind"), "model": "deterministic program modelling a desktop "
            "(file manager over a real sandbox directory, editor, settings); not a real window system",
            "normalised": ["sandbox path shown as /home/user"]}

  def close(self) -> None:
    self._remove_dir()

  def shown(self, path: str) -> str:
    return HOME_SHOWN + path[len(self.home):]

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

  def _save(self, win: dict[str, Any]) -> None:
    if win["path"] is None:
      win["msg"] = "Nothing to save: no file is open"
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
      win["msg"] = f"No application can open {name}"

  def _rename(self, win: dict[str, Any]) -> None:
    new = win["rename"].strip()
    old = os.path.join(win["cwd"], win["sel"])
    if not new or "/" in new or "\0" in new or new in (".", ".."):
      win["msg"] = f"Invalid name {new!r}"
    elif len(os.fsencode(new)) > MAX_NAME_BYTES:
      win["msg"] = f"Invalid name: {len(os.fsencode(new))} bytes long (at most {MAX_NAME_BYTES})"
    elif os.path.exists(os.path.join(win["cwd"], new)):
      win["msg"] = f"A file named {new} already exists"
    else:
      try:
        os.rename(old, os.path.join(win["cwd"], new))
        win["sel"], win["msg"] = new, f"Renamed to {new}"
      except OSError as e:  # what a file manager shows when the file system says no
        win["msg"] = f"Cannot rename {win['sel']}: {e.strerror}"
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
      kind = "folder" if os.path.isdir(full) else f"file {os.path.getsize(full)} B"
      attrs = {"type": kind.split()[0]} if os.path.isdir(full) else {"size": f"{os.path.getsize(full)}B"}
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
      s += [("double_click", r.choice(["Pictures", "Music", "Downloads"])), ("click", "Up")]
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
