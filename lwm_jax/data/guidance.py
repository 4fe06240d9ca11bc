"""Detailed simulation guidance for the long system-prompt variants (v2-v11, SFT).

Per domain, guidance is a list of (heading, points) groups, most important first (the domain record's
`guidance`, in `lwm_jax/envs/<domain>/text.py`); `GENERAL` holds
groups that apply to every domain. A variant includes the first N groups of its domain (N grows
with the variant number) and, in the longest variants, the general groups too. The text is ours;
it describes how each of our environments behaves so that a world model can imitate it.
"""
from __future__ import annotations

from lwm_jax import domains

Group = tuple[str, list[str]]

GENERAL: list[Group] = [
    ("How to read the history", [
        "Every earlier observation is ground truth about the environment at that moment.",
        "The initial state describes the world before the first action; build on it.",
        "When two observations seem to disagree, the later one reflects a change of state: "
        "find the action that caused it.",
        "Demonstrations come from other episodes of the same environment: copy their formats, "
        "not their contents.",
    ]),
    ("How to write the observation", [
        "Write only what the environment would output after this action, in its own format.",
        "Keep every whitespace convention the environment has shown: indentation, blank lines, "
        "column alignment.",
        "Do not summarise, shorten with ellipses, or add notes about what you are doing.",
        "When a value cannot be known from the history, choose a plausible one and keep it fixed "
        "for the rest of the episode.",
    ]),
    ("Reasoning before the answer", [
        "Name the state the action touches and what the history says about it.",
        "Decide whether the action succeeds, fails, or partly succeeds, and why.",
        "Check the simulation instruction for anything it forces on this turn.",
        "Then write the observation in full.",
    ]),
]


def groups(domain: str, n_domain: int, general: bool) -> list[Group]:
  """The first `n_domain` guidance groups of `domain`, then the general ones when asked."""
  return list(domains.get_domain(domain).guidance)[:n_domain] + (GENERAL if general else [])


def render(gs: list[Group]) -> str:
  """Groups as text: a heading line, then one `- point` line each."""
  return "\n\n".join(f"{head}:\n" + "\n".join(f"- {p}" for p in points) for head, points in gs)
