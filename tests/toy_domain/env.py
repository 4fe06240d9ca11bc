"""The toy notebook: a real (in-memory) environment, its scripted agent, world generator and verifier."""
from __future__ import annotations

import random
import re
from typing import Any

from lwm_jax.envs import base, verify

WORDS = ("apple", "river", "stone", "cloud", "maple", "ember", "frost", "lumen")
ACTION_SPACE = "One call per turn: keys(), get(key), set(key, text)."
SIGNATURES = {"keys": (), "get": ("key",), "set": ("key", "text")}


def generate_world(seed: int) -> dict[str, Any]:
  """The notes of world `seed`: three to five keys with one word each."""
  r = random.Random(seed)
  keys = sorted(r.sample("abcdefgh", r.randint(3, 5)))
  return {"notes": {k: r.choice(WORDS) for k in keys}}


class NotebookEnv(base.Env):
  domain = "toy"

  def __init__(self) -> None:
    super().__init__()
    self.notes: dict[str, str] = {}

  def reset(self, seed: int) -> str:
    r = self._begin(seed)
    world = generate_world(seed)
    self._set_world(world)
    self.notes = dict(world["notes"])
    key = r.choice(sorted(self.notes))
    self._set_goal({"set": "Change the note '{key}' to '{text}'."},
                   {"kind": "set", "key": key, "text": r.choice(WORDS) + "!"})
    return self._ready(self.goal["text"], ACTION_SPACE, f"{len(self.notes)} notes")

  def step(self, action: str) -> str:
    self.steps += 1
    try:
      name, kw = base.parse_call(action, SIGNATURES)
    except ValueError as e:
      return f"error: {e}"
    if name == "keys":
      return "\n".join(sorted(self.notes))
    if name == "get":
      k = kw["key"]
      return f"{k} = {self.notes[k]}" if k in self.notes else f"error: no note '{k}'"
    self.notes[kw["key"]] = kw["text"]
    return f"saved {kw['key']}"


class NotebookAgent(base.PlanAgent):
  """Lists the keys, reads a note or two, sets the goal's note and reads it back."""

  def make_plan(self, env: base.Env, initial_state: str) -> list[Any]:
    g = env.goal
    return ["keys()", lambda obs: f"get({self.rng.choice(obs.split())!r})",
            f"set({g['key']!r}, {g['text']!r})", f"get({g['key']!r})"]


def check(env: base.Env, goal: dict[str, Any], turns: Any) -> verify.Verdict:
  """Success when a get() of the goal's key showed the goal's text."""
  want = f"{goal['key']} = {goal['text']}"
  seen = any(re.fullmatch(r"get\(.*\)", a) and o == want for a, o in verify._turns(turns))
  return verify.Verdict(seen, float(seen), f"{want!r} {'shown' if seen else 'never shown'}")
