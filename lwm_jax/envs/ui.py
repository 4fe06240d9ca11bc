"""A tiny widget toolkit for the modelled GUI domains (android, os).

An app draws its current screen as a list of `Widget`s (class, text, state, depth, handlers).
`UiEnv` numbers the widgets that accept input, dispatches actions (`tap`/`click`, `type`, ...)
to their handlers, and renders the screen as text (an Android view hierarchy or a desktop UI
tree). Handlers mutate real program state; a widget without a handler does nothing, as on a real
screen, and an action on an id that does not exist shows an error line above the screen.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from lwm_jax.envs import base


@dataclasses.dataclass
class Widget:
  cls: str
  text: str = ""
  depth: int = 0
  on_tap: Callable[[], None] | None = None
  on_type: Callable[[str], None] | None = None
  on_double: Callable[[], None] | None = None
  attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
  id: int = 0

  @property
  def interactive(self) -> bool:
    return self.on_tap is not None or self.on_type is not None or self.on_double is not None


class UiEnv(base.Env):
  """Base for GUI envs. Subclasses implement `draw() -> (header, widgets)` and `key(name)`."""
  signatures: dict[str, tuple[str, ...]] = {}
  style = "android"

  def draw(self) -> tuple[str, list[Widget]]:
    raise NotImplementedError

  def current(self) -> str:
    header, widgets = self.draw()
    self.widgets = {}
    k = 0
    for w in widgets:
      if w.interactive:
        k += 1
        w.id = k
        self.widgets[k] = w
    self._all = widgets
    return self.render(header, widgets)

  def render(self, header: str, widgets: list[Widget]) -> str:
    lines = [header]
    for w in widgets:
      pad = "  " * (w.depth + 1)
      if self.style == "android":
        parts = [f'<node class="{w.cls}"']
        if w.id:
          parts.append(f'id="{w.id}"')
        if w.text:
          parts.append(f'text="{w.text}"')
        for k, v in w.attrs.items():
          parts.append(f'{k}="{str(v).lower() if isinstance(v, bool) else v}"')
        if w.on_tap:
          parts.append('clickable="true"')
        if w.on_type:
          parts.append('editable="true"')
        lines.append(pad + " ".join(parts) + " />")
      else:
        ident = f"[{w.id}] " if w.id else ""
        extra = "".join(f" {k}={v}" for k, v in w.attrs.items())
        lines.append(f'{pad}{ident}{w.cls} "{w.text}"{extra}' if w.text else f"{pad}{ident}{w.cls}{extra}")
    return "\n".join(lines)

  def widget(self, id: Any) -> Widget:
    if not isinstance(id, int) or id not in self.widgets:
      raise ValueError(f"no element with id {id!r} on screen")
    return self.widgets[id]

  def dispatch(self, name: str, kw: dict[str, Any]) -> None:
    """Default verbs; subclasses add their own by overriding and calling super()."""
    if name in ("tap", "click"):
      w = self.widget(kw.get("id"))
      if w.on_tap:
        w.on_tap()
    elif name == "double_click":
      w = self.widget(kw.get("id"))
      (w.on_double or w.on_tap or (lambda: None))()
    elif name == "type":
      w = self.widget(kw.get("id"))
      if w.on_type is None:
        raise ValueError(f"element {kw.get('id')} ({w.cls}) does not accept text")
      w.on_type(str(kw.get("text", "")))
    else:
      self.key(name, kw)

  def key(self, name: str, kw: dict[str, Any]) -> None:
    raise ValueError(f"unsupported action {name}")

  def step(self, action: str) -> str:
    """Runs one action. `step_error` is "invalid action: <reason>" when it could not be parsed or
    dispatched (the screen then shows the reason on an `Error:` line), else what a handler
    reported through `refuse` during the step, else ""."""
    self.steps += 1
    self.step_error = ""
    if not hasattr(self, "widgets"):
      self.current()
    try:
      name, kw = base.parse_call(action, self.signatures)
      self.dispatch(name, kw)
    except (ValueError, TypeError) as e:
      self.step_error = f"invalid action: {e}"
      return f"Error: {e}\n" + self.current()
    return self.current()

  def refuse(self, reason: str) -> None:
    """Called by a handler whose app turned the action down (a validation message, a failed
    file operation): the step's `step_error`."""
    self.step_error = reason


def action_error(observation: str) -> str:
  """`invalid action: <reason>` when an observation opens with the `Error:` line that
  `UiEnv.step` writes for an action it could not parse or dispatch, else ""."""
  if not observation.startswith("Error: "):
    return ""
  return "invalid action: " + observation.split("\n", 1)[0].removeprefix("Error: ")


def find(obs: str, text: str, cls: str = "") -> int | None:
  """Id of the first widget in a rendered screen whose text contains `text` (and class, if given)."""
  import re
  for line in obs.splitlines():
    m = re.search(r'id="(\d+)"', line) or re.search(r"\[(\d+)\]", line)
    if m and text.lower() in line.lower() and cls in line:
      return int(m.group(1))
  return None
