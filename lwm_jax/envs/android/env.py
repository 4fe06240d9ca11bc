"""The `android` environment: a deterministic model of phone apps shown as a view hierarchy.

This is a program that models Android apps (launcher, Contacts, Clock alarms, Settings, Notes),
not the apps themselves (`meta['model']` says so). Each seed's phone (owner, contacts, alarms,
notes, settings) comes from `generate_world(seed)` and shows on the home screen's widgets. Its logic really executes: contacts are saved
and validated, alarms toggle, settings change; the screen is rendered as an Android-style view
hierarchy with numbered interactive nodes. Actions: `tap(id)`, `type(id, "text")`, `back()`,
`home()`, `open_app("Name")`.
"""
from __future__ import annotations

import copy
import random
import re
from typing import Any

from lwm_jax.envs import base, ui
from lwm_jax.envs.ui import Widget

ACTION_SPACE = """\
One action per turn, Python call syntax:
  tap(id)              tap a clickable node
  type(id, "text")     replace the text of an editable node
  back()               system back button
  home()               go to the home screen
  open_app("Name")     launch an installed app from the launcher
Observation: the view hierarchy of the screen; nodes that accept input have an id."""
APPS = {"Contacts": "com.android.contacts", "Clock": "com.android.deskclock",
        "Settings": "com.android.settings", "Notes": "com.example.notes"}
TASKS = {"add_contact": "Add a contact {name} with phone {phone}.",
         "alarm": "Create an alarm at {hour:02d}:{minute:02d} labelled '{label}'.",
         "settings": "Turn {switch} {toggle} and raise the brightness.",
         "note": "Write a note titled '{note}'.",
         "delete_contact": "Delete the contact {victim}."}
_FIRST = ["Ada", "Bruno", "Cleo", "Dev", "Eva", "Femi", "Gus", "Hana", "Ivo", "Juno", "Kai", "Lena", "Mo",
          "Nia", "Otto", "Pia", "Raj", "Sofia", "Tomas", "Wen"]
_LAST = ["Park", "Diaz", "Grant", "Patel", "Lind", "Ade", "Hale", "Sato", "Brun", "West", "Okoro", "Novak",
         "Reyes", "Fischer", "Moreau", "Quinn", "Ito", "Kaur", "Berg", "Costa"]
_PHONES = ["+1 555 {:04d}", "+44 7700 9{:05d}", "+49 151 2{:06d}", "+33 6 12 {:06d}", "+81 90 1{:06d}"]
_ALARM_LABELS = ["Work", "Gym", "Meds", "Wake up", "Run", "School run", "Standup", "Call mom", "Yoga",
                 "Feed the cat", "Bins out", "Train"]
_NOTES = [("Groceries", "milk, eggs, rice"), ("Ideas", "garden bench"), ("Trip", "book train"),
          ("Gift list", "scarf for Mo, book for Pia"), ("Car", "service due in March"),
          ("Recipes", "lentil soup, flatbread"), ("Passwords hint", "ask Lena"), ("Books", "finish chapter 4"),
          ("Plumber", "Tuesday 10:00, bring invoice"), ("Budget", "rent 900, food 300"),
          ("Packing", "charger, passport, socks"), ("Garden", "sow beans in April")]
_NEW_NOTES = ["Pay rent", "Water plants", "Return books", "Renew passport", "Call the bank", "Buy stamps",
              "Fix bike light", "Plan weekend"]
_EXTRA_SWITCHES = ["Location", "Do not disturb", "Auto-rotate", "Battery saver", "NFC", "Airplane mode"]
WALLPAPERS = ["Dunes", "Forest", "Ocean", "Aurora", "City lights", "Plain grey"]


def generate_world(seed: int) -> dict[str, Any]:
  """The phone of world `seed`: owner, contacts (some favourites), alarms, notes, settings and
  battery level. JSON-serialisable; everything an episode's screens show comes from here."""
  rng = random.Random(f"android-world-{seed}")
  people = sorted(rng.sample([f"{f} {l}" for f in _FIRST for l in _LAST], rng.randint(3, 11)))
  contacts = [{"name": n, "phone": rng.choice(_PHONES).format(rng.randint(0, 9999)),
               "favourite": rng.random() < 0.25} for n in people]
  alarms = sorted(({"time": f"{rng.randint(4, 11):02d}:{rng.choice([0, 10, 15, 30, 45, 50]):02d}",
                    "label": label, "on": rng.random() < 0.6}
                   for label in rng.sample(_ALARM_LABELS, rng.randint(1, 4))), key=lambda a: (a["time"], a["label"]))
  notes = [{"title": t, "body": b} for t, b in rng.sample(_NOTES, rng.randint(0, 4))]
  switches = {"Wi-Fi": rng.random() < 0.7, "Bluetooth": rng.random() < 0.4, "Dark theme": rng.random() < 0.3}
  for key in rng.sample(_EXTRA_SWITCHES, rng.randint(0, 3)):
    switches[key] = rng.random() < 0.4
  return {"owner": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", "battery": rng.randint(8, 100),
          "wallpaper": rng.choice(WALLPAPERS), "contacts": contacts, "alarms": alarms, "notes": notes,
          "settings": {**switches, "brightness": rng.choice([20, 30, 40, 50, 60, 70, 80])}}


# -- form validation: the message a form's Save shows for its fields, "" when they are valid ---------
def contact_problem(d: dict[str, str]) -> str:
  if not d["Name"].strip():
    return "Name is required"
  if not re.fullmatch(r"\+?[\d ]{7,}", d["Phone"]):
    return "Invalid phone number"
  return ""


def alarm_problem(d: dict[str, str]) -> str:
  if not (d["Hour"].isdigit() and int(d["Hour"]) < 24 and d["Minute"].isdigit() and int(d["Minute"]) < 60):
    return "Enter an hour 0-23 and a minute 0-59"
  return ""


def note_problem(d: dict[str, str]) -> str:
  return "" if d["Title"].strip() else "A note needs a title"


FORMS = {"Contacts:edit": contact_problem, "Clock:edit": alarm_problem, "Notes:edit": note_problem}

_SCREEN_RE = re.compile(r'<hierarchy package="[^"]*" screen="([^"]*)"')
_ERROR_NODE_RE = re.compile(r'<node class="android.widget.TextView" text="([^"]*)" resource-id="error" />')
_FIELD_RE = re.compile(r'<node class="android.widget.EditText" id="\d+" (?:text="([^"]*)" )?hint="([^"]*)"')


def screen(observation: str) -> str | None:
  """The screen a view hierarchy shows (its `screen` attribute as `AndroidEnv` renders it), or
  None when the text holds no hierarchy header."""
  m = _SCREEN_RE.search(observation)
  return m.group(1) if m else None


def error(observation: str) -> str:
  """The error an observation shows (what `AndroidEnv.step` sets as `step_error`): the `Error:`
  line of an invalid action, or a form's validation message. A form keeps its message on screen
  while the fields are edited, so the message counts only while the fields shown still fail with
  it (the form's own check run on them): once an edit has fixed what it names it is left over
  from an earlier Save, not this step's error. (An edit that leaves the same problem, such as
  typing a name under "Invalid phone number", still reads as the error: one screen cannot tell.)"""
  err = ui.action_error(observation)
  if err:
    return err
  m = _ERROR_NODE_RE.search(observation)
  check = FORMS.get(screen(observation) or "")
  if m is None or check is None:
    return ""
  fields = {hint: text for text, hint in _FIELD_RE.findall(observation)}
  try:
    still = check(fields) == m.group(1)
  except (KeyError, ValueError):  # fields it cannot read back: take the message as shown
    still = True
  return f"form: {m.group(1)}" if still else ""


class AndroidEnv(ui.UiEnv):
  domain = "android"
  style = "android"
  signatures = {"tap": ("id",), "type": ("id", "text"), "back": (), "home": (), "open_app": ("name",)}

  def reset(self, seed: int) -> str:
    rng = self._begin(seed, close=False)
    world = generate_world(seed)
    self._set_world(world)
    self.initial_world = world  # the phone as generated, never mutated (read by `verify`)
    self.world = copy.deepcopy(world)  # the episode mutates its own copy
    self.stack: list[tuple[str, dict[str, Any]]] = [("home", {})]
    self.contacts, self.alarms = self.world["contacts"], self.world["alarms"]
    self.notes, self.settings = self.world["notes"], self.world["settings"]
    kind = rng.choice(["add_contact", "alarm", "settings", "note", "delete_contact"])
    known = {c["name"] for c in self.contacts}
    name = rng.choice([f"{f} {l}" for f in _FIRST for l in _LAST if f"{f} {l}" not in known])
    labels = {a["label"] for a in self.alarms}
    titles = {n["title"] for n in self.notes}
    goal = {"kind": kind, "name": name, "phone": rng.choice(_PHONES).format(rng.randint(0, 9999)),
            "hour": rng.randint(5, 11), "minute": rng.choice([0, 10, 30, 45]),
            "label": rng.choice([x for x in _ALARM_LABELS if x not in labels]),
            "victim": rng.choice(self.contacts)["name"],
            "toggle": rng.choice([k for k in self.settings if k != "brightness"]),
            "note": rng.choice([x for x in _NEW_NOTES if x not in titles])}
    g = self._set_goal(TASKS, goal, switch="off" if self.settings[goal["toggle"]] else "on")
    self.error = ""
    return self._ready(g["text"], ACTION_SPACE, self.current())

  def state_digest(self) -> str:
    """The phone's app data: contacts, alarms, notes and settings (not the screen shown, a form's
    unsaved fields or the clock)."""
    return base.canonical_digest({k: self.world[k] for k in ("contacts", "alarms", "notes", "settings")})

  def screen_state(self, observation: str) -> str:
    return re.sub(r"\b\d\d:\d\d(\s+Wi-Fi)", r"\1", re.sub(r' time="[^"]*"', "", observation))

  def episode_meta(self) -> dict[str, Any]:
    return {"task_kind": self.goal.get("kind"),
            "model": "deterministic program modelling Android apps as a view hierarchy; not the real apps"}

  # -- navigation ----------------------------------------------------------------------------------
  def push(self, view: str, **params: Any) -> None:
    self.stack.append((view, params))

  def pop(self) -> None:
    if len(self.stack) > 1:
      self.stack.pop()

  def key(self, name: str, kw: dict[str, Any]) -> None:
    if name == "back":
      self.pop()
    elif name == "home":
      self.stack = [("home", {})]
    elif name == "open_app":
      app = kw.get("name")
      if app not in APPS:
        raise ValueError(f"no app named {app!r} is installed")
      self.stack = [("home", {}), (app, {})]
    else:
      raise ValueError(f"unsupported action {name}")

  # -- screens -------------------------------------------------------------------------------------
  def draw(self) -> tuple[str, list[Widget]]:
    view, p = self.stack[-1]
    now = base.FIXED_EPOCH + self.steps * base.STEP_SECONDS
    clock = f"{(now // 3600) % 24:02d}:{(now // 60) % 60:02d}"
    app = view.split(":")[0]
    pkg = APPS.get(app, "com.android.launcher")
    header = f'<hierarchy package="{pkg}" screen="{view}" time="{clock}">'
    status = Widget("android.widget.TextView", f"{clock}  Wi-Fi {'on' if self.settings['Wi-Fi'] else 'off'}",
                    attrs={"resource-id": "status_bar"})
    w: list[Widget] = [status]
    getattr(self, "_draw_" + view.replace(":", "_").lower())(w, p)
    return header, w

  def _draw_home(self, w: list[Widget], p: dict[str, Any]) -> None:
    w.append(Widget("android.widget.TextView", "Home", attrs={"wallpaper": self.world["wallpaper"]}))
    w.append(Widget("android.widget.TextView", f"{self.world['owner']}'s phone  Battery {self.world['battery']}%", 1,
                    attrs={"resource-id": "owner_info"}))
    on = [a for a in self.alarms if a["on"]]
    now = base.FIXED_EPOCH + self.steps * base.STEP_SECONDS
    later = [a for a in on if a["time"] > f"{(now // 3600) % 24:02d}:{(now // 60) % 60:02d}"]
    nxt = (later or on or [None])[0]  # the next one today, else the first tomorrow
    w.append(Widget("android.widget.TextView", f"Next alarm {nxt['time']} {nxt['label']}" if nxt else "No alarms on",
                    1, attrs={"resource-id": "alarm_widget"}))
    favs = [c["name"] for c in self.contacts if c.get("favourite")]
    if favs:
      w.append(Widget("android.widget.TextView", "Favourites: " + ", ".join(favs), 1,
                      attrs={"resource-id": "favourites_widget"}))
    if self.notes:
      w.append(Widget("android.widget.TextView", f"Pinned note: {self.notes[0]['title']}", 1,
                      attrs={"resource-id": "notes_widget"}))
    for app in APPS:
      w.append(Widget("android.widget.ImageView", app, 1, on_tap=lambda a=app: self.push(a),
                      attrs={"content-desc": f"{app} app"}))

  def _draw_contacts(self, w: list[Widget], p: dict[str, Any]) -> None:
    w.append(Widget("android.widget.TextView", "Contacts"))
    if not self.contacts:
      w.append(Widget("android.widget.TextView", "No contacts", 1))
    for c in self.contacts:
      w.append(Widget("android.widget.TextView", c["name"], 1, on_tap=lambda c=c: self.push("Contacts:detail", c=c)))
    w.append(Widget("android.widget.ImageButton", "Add contact", on_tap=lambda: self.push("Contacts:edit", draft={"Name": "", "Phone": ""})))

  def _draw_contacts_detail(self, w: list[Widget], p: dict[str, Any]) -> None:
    c = p["c"]
    w += [Widget("android.widget.TextView", c["name"]), Widget("android.widget.TextView", c["phone"], 1)]
    if p.get("confirm"):
      w += [Widget("android.app.AlertDialog", f"Delete {c['name']}?", 1),
            Widget("android.widget.Button", "Cancel", 2, on_tap=lambda: p.pop("confirm")),
            Widget("android.widget.Button", "Delete", 2, on_tap=lambda: self._delete_contact(c))]
    else:
      w.append(Widget("android.widget.Button", "Delete", 1, on_tap=lambda: p.__setitem__("confirm", True)))

  def _delete_contact(self, c: dict[str, str]) -> None:
    self.contacts.remove(c)
    self.pop()

  def _invalid(self, p: dict[str, Any], problem: str) -> bool:
    """Shows a form's validation message (it stays until the next Save) and reports it as the
    step's error; False when there is none."""
    if problem:
      p["error"] = problem
      self.refuse(f"form: {problem}")
    return bool(problem)

  def _form(self, w: list[Widget], draft: dict[str, str], save: Any, p: dict[str, Any]) -> None:
    for field in draft:
      w.append(Widget("android.widget.EditText", draft[field], 1, on_type=lambda t, f=field: draft.__setitem__(f, t),
                      attrs={"hint": field}))
    if p.get("error"):
      w.append(Widget("android.widget.TextView", p["error"], 1, attrs={"resource-id": "error"}))
    w.append(Widget("android.widget.Button", "Save", 1, on_tap=save))

  def _draw_contacts_edit(self, w: list[Widget], p: dict[str, Any]) -> None:
    w.append(Widget("android.widget.TextView", "New contact"))
    d = p["draft"]

    def save() -> None:
      if not self._invalid(p, contact_problem(d)):
        self.contacts.append({"name": d["Name"].strip(), "phone": d["Phone"], "favourite": False})
        self.contacts.sort(key=lambda c: c["name"])
        self.pop()
    self._form(w, d, save, p)

  def _draw_clock(self, w: list[Widget], p: dict[str, Any]) -> None:
    w.append(Widget("android.widget.TextView", "Alarms"))
    for a in self.alarms:
      w.append(Widget("android.widget.TextView", f"{a['time']} {a['label']}", 1))
      w.append(Widget("android.widget.Switch", "", 2, on_tap=lambda a=a: a.__setitem__("on", not a["on"]),
                      attrs={"checked": a["on"], "content-desc": f"alarm {a['time']}"}))
    w.append(Widget("android.widget.ImageButton", "Add alarm",
                    on_tap=lambda: self.push("Clock:edit", draft={"Hour": "", "Minute": "", "Label": ""})))

  def _draw_clock_edit(self, w: list[Widget], p: dict[str, Any]) -> None:
    w.append(Widget("android.widget.TextView", "New alarm"))
    d = p["draft"]

    def save() -> None:
      if self._invalid(p, alarm_problem(d)):
        return
      self.alarms.append({"time": f"{int(d['Hour']):02d}:{int(d['Minute']):02d}", "label": d["Label"] or "Alarm", "on": True})
      self.alarms.sort(key=lambda a: a["time"])
      self.pop()
    self._form(w, d, save, p)

  def _draw_settings(self, w: list[Widget], p: dict[str, Any]) -> None:
    w.append(Widget("android.widget.TextView", "Settings"))
    for key in [k for k in self.settings if k != "brightness"]:
      w.append(Widget("android.widget.Switch", key, 1, on_tap=lambda k=key: self.settings.__setitem__(k, not self.settings[k]),
                      attrs={"checked": self.settings[key]}))
    b = self.settings["brightness"]
    w.append(Widget("android.widget.SeekBar", "Brightness", 1, attrs={"progress": b}))
    w.append(Widget("android.widget.Button", "Brightness down", 2,
                    on_tap=lambda: self.settings.__setitem__("brightness", max(0, b - 10))))
    w.append(Widget("android.widget.Button", "Brightness up", 2,
                    on_tap=lambda: self.settings.__setitem__("brightness", min(100, b + 10))))

  def _draw_notes(self, w: list[Widget], p: dict[str, Any]) -> None:
    w.append(Widget("android.widget.TextView", "Notes"))
    for n in self.notes:
      w.append(Widget("android.widget.TextView", n["title"], 1, on_tap=lambda n=n: self.push("Notes:view", n=n)))
    w.append(Widget("android.widget.ImageButton", "New note", on_tap=lambda: self.push("Notes:edit", draft={"Title": "", "Body": ""})))

  def _draw_notes_view(self, w: list[Widget], p: dict[str, Any]) -> None:
    w += [Widget("android.widget.TextView", p["n"]["title"]), Widget("android.widget.TextView", p["n"]["body"], 1),
          Widget("android.widget.Button", "Delete note", 1, on_tap=lambda: (self.notes.remove(p["n"]), self.pop()))]

  def _draw_notes_edit(self, w: list[Widget], p: dict[str, Any]) -> None:
    w.append(Widget("android.widget.TextView", "Edit note"))
    d = p["draft"]

    def save() -> None:
      if self._invalid(p, note_problem(d)):
        return
      self.notes.append({"title": d["Title"], "body": d["Body"]})
      self.pop()
    self._form(w, d, save, p)


class AndroidAgent(base.PlanAgent):
  """Opens the right app (by launcher or open_app), fills forms, with slips and detours."""

  def make_plan(self, env: base.Env, initial_state: str) -> list[Any]:
    r, g = self.rng, env.goal
    app = {"add_contact": "Contacts", "delete_contact": "Contacts", "alarm": "Clock",
           "settings": "Settings", "note": "Notes"}[g["kind"]]
    s: list[Any] = []
    if r.random() < 0.3:
      other = r.choice([a for a in APPS if a != app])
      s += [("tap", other), "back()"]
    if r.random() < 0.15:
      s.append('open_app("Camera")')
    s.append(("tap", app) if r.random() < 0.6 else f'open_app("{app}")')
    k = g["kind"]
    if k == "add_contact":
      s.append(("tap", "Add contact"))
      if r.random() < 0.3:
        s.append(("tap", "Save"))  # empty form: validation error
      s += [("type", 'hint="Name"', g["name"]), ("type", 'hint="Phone"', g["phone"] if r.random() > 0.2 else "call me")]
      s += [("tap", "Save"), ("type", 'hint="Phone"', g["phone"]), ("tap", "Save")]
    elif k == "delete_contact":
      s += [("tap", g["victim"]), ("tap", "Delete")]
      if r.random() < 0.3:
        s += [("tap", "Cancel"), ("tap", "Delete")]
      s.append(("tap", "Delete"))
    elif k == "alarm":
      if r.random() < 0.4:
        s.append(("tap", "content-desc=\"alarm"))
      s += [("tap", "Add alarm"), ("type", 'hint="Hour"', str(g["hour"] + (20 if r.random() < 0.2 else 0))),
            ("type", 'hint="Minute"', str(g["minute"])), ("type", 'hint="Label"', g["label"]), ("tap", "Save"),
            ("type", 'hint="Hour"', str(g["hour"])), ("tap", "Save")]
    elif k == "settings":
      s += [("tap", g["toggle"]), ("tap", "Brightness up")]
      if r.random() < 0.5:
        s.append(("tap", "Brightness up"))
    else:
      s += [("tap", "New note"), ("type", 'hint="Body"', "remember this")]
      if r.random() < 0.3:
        s.append(("tap", "Save"))
      s += [("type", 'hint="Title"', g["note"]), ("tap", "Save")]
    if r.random() < 0.2:
      s.insert(r.randrange(1, len(s)), r.choice(["tap(77)", 'type(1, "x")', "tap(0)"]))
    if r.random() < 0.4:
      s.append(r.choice(["home()", "back()"]))
    return s

  def resolve(self, step: Any, observation: str) -> str | None:
    i = ui.find(observation, step[1])
    if i is None:
      return None
    return f"tap({i})" if step[0] == "tap" else f"type({i}, {step[2]!r})"
