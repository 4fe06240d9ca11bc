"""The android domain's task verifiers (the record's `verifier` and `transcript_verifier`).

`check(env, goal, turns)` judges a finished episode on the real environment's state;
`check_transcript(env, goal, turns)` judges it from the transcript alone, with `env` only reset to
the episode's world. What each checks is listed in `lwm_jax/envs/verify.py` and
`lwm_jax/envs/verify_transcript.py`, which dispatch to these through the domain registry.
"""
from __future__ import annotations

import re
from typing import Any

from lwm_jax.envs import verify as V
from lwm_jax.envs.verify import Turns, Verdict, _v
from lwm_jax.envs.verify_transcript import _last


def check(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  start = env.initial_world
  k = g["kind"]
  if k == "add_contact":
    named = [c for c in env.contacts if c["name"] == g["name"]]
    ok = any(c["phone"] == g["phone"] for c in named)
    return _v(ok, 0.5 if named else 0, f"contact {g['name']} {'saved' if named else 'missing'}"
                                       + (f" with phone {named[0]['phone']!r}" if named else ""))
  if k == "alarm":
    t = f"{g['hour']:02d}:{g['minute']:02d}"
    labelled = [a for a in env.alarms if a["label"] == g["label"]]
    ok = any(a["time"] == t and a["on"] for a in labelled)
    return _v(ok, 0.5 if labelled else 0, f"alarm '{g['label']}' at {t}: "
              + (", ".join(f"{a['time']} {'on' if a['on'] else 'off'}" for a in labelled) or "missing"))
  if k == "settings":
    key = g["toggle"]
    flipped = env.settings[key] != start["settings"][key]
    brighter = env.settings["brightness"] > start["settings"]["brightness"]
    return _v(flipped and brighter, (flipped + brighter) / 2,
              f"{key} {'flipped' if flipped else 'unchanged'}; brightness "
              f"{start['settings']['brightness']} -> {env.settings['brightness']}")
  if k == "note":
    ok = any(n["title"] == g["note"] for n in env.notes)
    return _v(ok, 0, f"note '{g['note']}' {'saved' if ok else 'missing'}")
  if k == "delete_contact":
    names = {c["name"] for c in env.contacts}
    others = [c["name"] for c in start["contacts"] if c["name"] != g["victim"]]
    kept = sum(n in names for n in others)
    gone = g["victim"] not in names
    return _v(gone and kept == len(others), 0.5 * gone + 0.5 * kept / max(len(others), 1),
              f"{g['victim']} {'deleted' if gone else 'still there'}; {kept} of {len(others)} others kept")
  raise ValueError(f"android: unknown goal kind {k!r}")


# -- os -------------------------------------------------------------------------------------------


def _screen(o: str) -> str:
  m = re.search(r'screen="([^"]+)"', o.split("\n", 1)[0] if not o.startswith("Error") else o)
  return m.group(1) if m else ""


def check_transcript(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  start = env.initial_world
  k = g["kind"]
  last = lambda screen: _last(turns, lambda a, o: _screen(o) == screen)
  if k in ("add_contact", "delete_contact"):
    hit = last("Contacts")
    names = set(re.findall(r'text="([^"]*)" clickable', hit[1])) if hit else set()
    if k == "delete_contact":
      others = [c["name"] for c in start["contacts"] if c["name"] != g["victim"]]
      kept = sum(n in names for n in others)
      gone = hit is not None and g["victim"] not in names
      return V._v(gone and kept == len(others), 0.5 * gone + 0.5 * kept / max(len(others), 1),
                  f"last contact list: {g['victim']} {'absent' if gone else 'present or never shown'}, "
                  f"{kept} of {len(others)} others shown")
    i = turns.index(hit) if hit else -1
    form = _last(turns[:i], lambda a, o: _screen(o) == "Contacts:edit") if hit else None
    filled = form is not None and f'text="{g["name"]}" hint="Name"' in form[1] \
        and f'text="{g["phone"]}" hint="Phone"' in form[1]
    listed = g["name"] in names
    return V._v(listed and filled, 0.5 * listed, f"{g['name']} {'listed' if listed else 'not listed'}; "
                                                 f"saved form {'matches' if filled else 'does not match'}")
  if k == "alarm":
    hit = last("Clock")
    t = f"{g['hour']:02d}:{g['minute']:02d}"
    m = hit and re.search(rf'text="{t} {re.escape(g["label"])}" />\n[^\n]*checked="(true|false)"', hit[1])
    return V._v(bool(m) and m.group(1) == "true", 0.5 * bool(m),
                f"alarm {t} {g['label']} {'shown ' + ('on' if m.group(1) == 'true' else 'off') if m else 'not shown'}")
  if k == "settings":
    hit = last("Settings")
    if hit is None:
      return V._v(False, 0, "the settings screen was never shown")
    m = re.search(rf'text="{re.escape(g["toggle"])}" checked="(true|false)"', hit[1])
    b = re.search(r'text="Brightness" progress="(\d+)"', hit[1])
    flipped = bool(m) and (m.group(1) == "true") != start["settings"][g["toggle"]]
    brighter = bool(b) and int(b.group(1)) > start["settings"]["brightness"]
    return V._v(flipped and brighter, (flipped + brighter) / 2,
                f"last settings screen: {g['toggle']} {'flipped' if flipped else 'not flipped'}, "
                f"brightness {'raised' if brighter else 'not raised'}")
  if k == "note":
    hit = last("Notes")
    ok = bool(hit) and f'text="{g["note"]}"' in hit[1]
    return V._v(ok, 0, f"note {g['note']!r} {'listed' if ok else 'not listed'} on the last notes screen")
  raise ValueError(f"android: unknown goal kind {k!r}")


# -- os -------------------------------------------------------------------------------------------
