"""The os domain's task verifiers (the record's `verifier` and `transcript_verifier`).

`check(env, goal, turns)` judges a finished episode on the real environment's state;
`check_transcript(env, goal, turns)` judges it from the transcript alone, with `env` only reset to
the episode's world. What each checks is listed in `lwm_jax/envs/verify.py` and
`lwm_jax/envs/verify_transcript.py`, which dispatch to these through the domain registry.
"""
from __future__ import annotations

import os
import re
from typing import Any

from lwm_jax.envs import verify as V
from lwm_jax.envs.verify import Turns, Verdict, _read, _v
from lwm_jax.envs.verify_transcript import _last


def check(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  home, world = env.home, env.world
  k = g["kind"]
  if k == "edit":
    text = _read(home, g["file"])
    if text is None:
      return _v(False, 0, f"~/{g['file']} is gone")
    lines = text.splitlines()
    if g["line"] not in lines:
      return _v(False, 0, f"~/{g['file']} does not contain the line {g['line']!r}")
    lines.remove(g["line"])
    kept = lines == world["files"][g["file"]].splitlines()
    return _v(kept, 0.5, f"line added; the rest of the file {'kept' if kept else 'changed'}")
  if k == "mkdir":
    ok = os.path.isdir(os.path.join(home, "Documents", g["folder"]))
    return _v(ok, 0, f"folder Documents/{g['folder']} {'exists' if ok else 'missing'}")
  if k == "rename":
    new = os.path.join(home, os.path.dirname(g["file"]), g["newname"])
    old_gone = not os.path.exists(os.path.join(home, g["file"]))
    same = _read(home, os.path.join(os.path.dirname(g["file"]), g["newname"])) == world["files"][g["file"]]
    return _v(old_gone and same, 0.5 * same,
              f"~/{g['file']} {'gone' if old_gone else 'still there'}; {g['newname']} "
              f"{'holds its text' if same else 'missing or different'}")
  if k == "delete":
    gone = not os.path.exists(os.path.join(home, g["file"]))
    others = [p for p in world["files"] if p != g["file"]]
    kept = sum(os.path.exists(os.path.join(home, p)) for p in others)
    return _v(gone and kept == len(others), 0.5 * gone + 0.5 * kept / max(len(others), 1),
              f"~/{g['file']} {'deleted' if gone else 'still there'}; {kept} of {len(others)} other files kept")
  if k == "theme":
    want = "Light" if world["settings"]["theme"] == "Dark" else "Dark"
    themed = env.settings["theme"] == want
    quieter = env.settings["volume"] < world["settings"]["volume"]
    return _v(themed and quieter, (themed + quieter) / 2,
              f"theme {env.settings['theme']} (asked {want}); volume {world['settings']['volume']} -> "
              f"{env.settings['volume']}")
  raise ValueError(f"os: unknown goal kind {k!r}")


# -- mcp ------------------------------------------------------------------------------------------


def check_transcript(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  world, shown_home = env.world, env.home_shown
  k = g["kind"]

  def listing(folder: str) -> set[str] | None:
    head = f'window "Files - {shown_home}/{folder}" app=Files'
    hit = _last(turns, lambda a, o: o.split("\n", 1)[0].startswith(head)
                or o.startswith("Error") and head in o)
    return set(re.findall(r'listitem "([^"]*)"', hit[1])) if hit else None

  if k == "edit":
    name = os.path.basename(g["file"])
    saved = [o for _, o in turns if f'statusbar "Saved {name}"' in o]
    ok = any(g["line"] in re.findall(r'textarea "(.*)"', o)[0].split("\\n")
             for o in saved if re.findall(r'textarea "(.*)"', o))
    return V._v(ok, 0.5 * bool(saved), f"{len(saved)} saves of {name}; the line "
                                       f"{'is' if ok else 'is not'} in the saved text")
  if k == "mkdir":
    items = listing("Documents")
    ok = items is not None and g["folder"] in items
    return V._v(ok, 0, f"last listing of Documents {'shows' if ok else 'lacks'} {g['folder']}")
  if k == "theme":
    want = "Light" if world["settings"]["theme"] == "Dark" else "Dark"
    hit = _last(turns, lambda a, o: o.split("\n", 1)[0].startswith('window "Settings"'))
    if hit is None:
      return V._v(False, 0, "the settings window was never shown")
    themed = f'radio "{want}" checked=yes' in hit[1]
    v = re.search(r'slider "Volume" value=(\d+)', hit[1])
    quieter = bool(v) and int(v.group(1)) < world["settings"]["volume"]
    return V._v(themed and quieter, (themed + quieter) / 2,
                f"last settings window: theme {want} {'on' if themed else 'off'}, volume "
                f"{'lowered' if quieter else 'not lowered'}")
  folder, fname = g["file"].split("/")
  items = listing(folder)
  if items is None:
    return V._v(False, 0, f"{folder} was never listed")
  if k == "rename":
    ok = g["newname"] in items and fname not in items
    return V._v(ok, 0.5 * (g["newname"] in items), f"last listing of {folder}: {sorted(items)}")
  if k == "delete":
    others = [p.split("/")[1] for p in world["files"] if p.startswith(folder + "/") and p != g["file"]]
    ok = fname not in items and all(n in items for n in others)
    return V._v(ok, 0.5 * (fname not in items), f"last listing of {folder}: {sorted(items)}")
  raise ValueError(f"os: unknown goal kind {k!r}")


# -- mcp ------------------------------------------------------------------------------------------
