"""System prompts and chat rendering for Language World Models.

A system prompt has five parts: task description, action space, initial state, demonstrations and
simulation instruction. `system_prompt(traj, variant)` fills them into one of twelve templates
(v0 terse ... v11 very detailed) that differ in layout (plain, markdown, XML tags, numbered, prose)
and in how much guidance they give. Stages pick templates as the recipe does (docs/recipe.md): RL v0, CPT v1, SFT a
seeded choice of v2-v11 per sample (`variant_for`). v1 asks for the bare observation (CPT data is
non-thinking); every other variant asks for `<think>` then `<predicted_observation>` (the reply
format and its thinking target live in `lwm_jax.data.reply`).

The long forms of v2-v11 (`system_prompt(..., long=True, demos=[...])`, used by SFT when they fit
the token budget) add detailed simulation guidance (`guidance.py`; more groups in higher variants)
and worked examples from other training trajectories of the same domain (`demos.py`; up to
`max_demos(variant)`). v0 and v1 have no long form.

A trajectory imported with its own system prompt (`meta["system_str"]`) keeps it verbatim.
Chat rendering uses AgentWorldBench's formatting: user = `format_action`, assistant =
`format_observation`.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Sequence

from lwm_jax import domains
from lwm_jax.data import guidance
from lwm_jax.data.bench_records import format_action, format_observation
from lwm_jax.data.reply import OBS_CLOSE, OBS_OPEN, THINK_CLOSE, THINK_OPEN, thinking_target
from lwm_jax.data.schema import Trajectory

NUM_VARIANTS = 12

GENERAL_RULES = [
    "Predict only the next observation; never take the agent's next action.",
    "Stay consistent with every earlier observation and with the initial state.",
    "Follow the simulation instruction when there is one, even if it makes the agent fail.",
    "Be realistic: copy the real environment's formats, wording and typical values.",
    "Be complete but do not pad: no commentary, apologies or explanations in the observation.",
    "When the action is invalid, return the error the real environment would give.",
    "Do not praise the agent or comment on its progress.",
    "Invent missing details only where the environment would show them, and keep them fixed.",
    "Keep the observation's length in line with what the real environment prints.",
    "Deterministic parts (file contents, computed values) must be exactly right.",
]

CHECKLIST = [
    "Which state does the action read or change?",
    "What did earlier turns already establish about that state?",
    "Does the simulation instruction apply to this turn?",
    "What exact format would the real environment use for this result?",
    "Is every number, name and identifier consistent with the history?",
]

# Template per variant: (layout, domain rules, general rules, checklist, think format, extras)
_SPEC = {
    0: ("plain", 0, 0, False, True, False),
    1: ("plain", 2, 2, False, False, False),
    2: ("markdown", 3, 3, False, True, False),
    3: ("xml", 3, 4, False, True, False),
    4: ("numbered", 4, 4, False, True, False),
    5: ("prose", 4, 5, False, True, False),
    6: ("markdown", 5, 6, True, True, False),
    7: ("xml", 6, 7, True, True, False),
    8: ("numbered", 6, 8, True, True, True),
    9: ("prose", 7, 8, True, True, True),
    10: ("markdown", 8, 10, True, True, True),
    11: ("xml", 8, 10, True, True, True),
}

# Long forms per variant: (domain guidance groups, general guidance, most worked examples)
_LONG = {
    2: (1, False, 1), 3: (1, False, 1), 4: (2, False, 1), 5: (2, False, 2), 6: (3, False, 2),
    7: (3, True, 2), 8: (4, True, 3), 9: (4, True, 3), 10: (4, True, 4), 11: (4, True, 4),
}

_EXTRA = (
    "How to handle hard cases:\n"
    "- If the action is ambiguous, simulate what the real environment would do with it literally.\n"
    "- If the history contradicts itself, follow the most recent observation.\n"
    "- If the environment would hang or time out, show that outcome as it would appear.\n"
    "- If you do not know a real-world fact, prefer a plausible, non-committal result over a "
    "fabricated precise one.\n"
    "- Partial failures are allowed: a batch may half succeed when that is realistic.")


def _parts(traj: Trajectory) -> dict[str, str]:
  info = domains.get_domain(traj.domain).prompt
  return {
      "task": traj.task.strip() or "(no task description given)",
      "actions": traj.action_space.strip() or info["actions"],
      "state": traj.initial_state.strip() or "(the environment's default starting state)",
      "demos": traj.demonstrations.strip() or info["demo"],
  }


def instruction_body(traj: Trajectory, variant: int) -> str:
  """The simulation-instruction section's text as template `variant` writes it (also when the
  trajectory has none)."""
  return traj.simulation_instruction.strip() or (
      "None. Behave exactly like the real environment." if variant else "None.")


def instruction_think(traj: Trajectory, variant: int) -> str:
  """The reasoning of the `instruction` thinking target: the simulation-instruction section said
  again word for word, as template `variant` shows it ("None. ..." when there is none), right
  before the observation it governs. In the system prompt it sits hundreds of tokens and more
  before the observation; a model that first copies it into its reasoning decides the
  observation on text a few dozen tokens back, and every sample, instructed or not, trains the
  same copy. At the demo size the model did not learn to say the instruction back
  (docs/perturbations.md, "Thinking that restates the instruction")."""
  return f"Simulation instruction: {instruction_body(traj, variant)}"


def _output_format(think: bool) -> str:
  if think:
    return (f"First reason briefly inside {THINK_OPEN}...{THINK_CLOSE}, then give the observation "
            f"inside {OBS_OPEN}...{OBS_CLOSE}.")
  return "Reply with the observation text only, exactly as the environment would show it."


# Every section title a template may carry, in the order `_sections` emits them (the fidelity
# report's header-leak rule reads them: lwm_jax/eval/turn_kinds.py).
SECTION_TITLES = ("Role", "Task", "Action space", "Initial state", "Demonstrations",
                  "Simulation instruction", "Rules", "Before answering", "Hard cases",
                  "Simulation guidance", "Examples from other episodes", "Output format")


def _sections(traj: Trajectory, variant: int, long: bool = False,
              demos: Sequence[str] = ()) -> list[tuple[str, str]]:
  _, n_dom, n_gen, checklist, think, extra = _SPEC[variant]
  info, p = domains.get_domain(traj.domain).prompt, _parts(traj)
  instruction = instruction_body(traj, variant)
  intro = (f"You simulate {info['role']}. An agent works on the task below; after each of its "
           f"actions you return the observation: {info['obs']}.")
  secs = [("Role", intro), ("Task", p["task"]), ("Action space", p["actions"]),
          ("Initial state", p["state"]), ("Demonstrations", p["demos"]),
          ("Simulation instruction", instruction)]
  rules = info["rules"][:n_dom] + GENERAL_RULES[:n_gen]
  if rules:
    secs.append(("Rules", "\n".join(f"- {r}" for r in rules)))
  if checklist:
    secs.append(("Before answering", "\n".join(f"- {c}" for c in CHECKLIST)))
  if extra:
    secs.append(("Hard cases", _EXTRA))
  if long and variant in _LONG:
    n_dom, general, _ = _LONG[variant]
    secs.append(("Simulation guidance", guidance.render(guidance.groups(traj.domain, n_dom,
                                                                        general))))
  if demos:
    secs.append(("Examples from other episodes", "\n\n".join(
        f"Example {i}:\n{d}" for i, d in enumerate(demos, 1))))
  secs.append(("Output format", _output_format(think)))
  return secs


def _plain(secs: list[tuple[str, str]]) -> str:
  return "\n".join(f"{t}: {b}" if "\n" not in b else f"{t}:\n{b}" for t, b in secs)


def _markdown(secs: list[tuple[str, str]]) -> str:
  return "\n\n".join(f"## {t}\n{b}" for t, b in secs)


def _xml(secs: list[tuple[str, str]]) -> str:
  tag = lambda t: t.lower().replace(" ", "_")
  return "\n".join(f"<{tag(t)}>\n{b}\n</{tag(t)}>" for t, b in secs)


def _numbered(secs: list[tuple[str, str]]) -> str:
  return "\n\n".join(f"{i}. {t.upper()}\n{b}" for i, (t, b) in enumerate(secs, 1))


def _prose(secs: list[tuple[str, str]]) -> str:
  lead = {"Task": "The agent's task is:", "Action space": "The agent can act as follows:",
          "Initial state": "When the episode starts, the environment is in this state:",
          "Demonstrations": "Here is how actions and observations look:",
          "Simulation instruction": "Special instruction for this simulation:",
          "Rules": "Keep to these rules:", "Before answering": "Before each answer, ask yourself:",
          "Hard cases": "", "Simulation guidance": "How this environment behaves, in detail:",
          "Examples from other episodes":
              "Worked examples from other episodes of this environment (formats, not facts):",
          "Output format": "Format:"}
  out = []
  for t, b in secs:
    head = lead.get(t, "")
    out.append(f"{head}\n{b}" if head else b)
  return "\n\n".join(out)


_LAYOUTS: dict[str, Callable[[list[tuple[str, str]]], str]] = {
    "plain": _plain, "markdown": _markdown, "xml": _xml, "numbered": _numbered, "prose": _prose}


def system_prompt(traj: Trajectory, variant: int, long: bool = False,
                  demos: Sequence[str] = ()) -> str:
  """The five-part system prompt of `traj` in template `variant` (0-11); `long` adds the
  variant's simulation guidance and `demos` its worked examples (at most `max_demos(variant)`)."""
  if not 0 <= variant < NUM_VARIANTS:
    raise ValueError(f"prompt variant must be in 0..{NUM_VARIANTS - 1}, got {variant}")
  if len(demos) > max_demos(variant):
    raise ValueError(f"prompt variant {variant} takes at most {max_demos(variant)} worked "
                     f"examples, got {len(demos)}")
  override = traj.meta.get("system_str")
  if isinstance(override, str) and override:
    return override
  return _LAYOUTS[_SPEC[variant][0]](_sections(traj, variant, long, demos))


def max_demos(variant: int) -> int:
  """How many worked examples the long form of `variant` carries (0 for v0 and v1)."""
  return _LONG[variant][2] if variant in _LONG else 0


def variant_for(stage: str, key: str, seed: int) -> int:
  """Template of a sample: rl -> 0, cpt -> 1, sft -> one of 2..11 fixed by (key, seed)."""
  if stage in ("rl", "rl-prompts", "eval"):
    return 0
  if stage == "cpt":
    return 1
  if stage == "sft":
    h = hashlib.blake2b(f"{seed}\x1fprompt\x1f{key}".encode("utf-8"), digest_size=8).digest()
    return 2 + int.from_bytes(h, "big") % (NUM_VARIANTS - 2)
  raise ValueError(f"unknown stage '{stage}' (expected rl, cpt or sft)")


def render_messages(traj: Trajectory, target_turn: int | None, variant: int,
                    thinking: bool = False, think: str = "", long: bool = False,
                    demos: Sequence[str] = ()) -> list[dict[str, str]]:
  """Chat messages: system, then user (action) / assistant (observation) pairs.

  With `target_turn` (0-based) the history stops at that turn's action and the last assistant
  message is its observation: plain `format_observation` or, with `thinking`, the thinking
  target. Without it, every turn is rendered and `thinking` is ignored.
  """
  n = len(traj.turns)
  if target_turn is not None and not 0 <= target_turn < n:
    raise ValueError(f"trajectory {traj.id}: target turn {target_turn} out of range 0..{n - 1}")
  msgs = [{"role": "system", "content": system_prompt(traj, variant, long, demos)}]
  last = n - 1 if target_turn is None else target_turn
  for i, t in enumerate(traj.turns[:last + 1]):
    msgs.append({"role": "user", "content": format_action(i + 1, t.action)})
    if i == target_turn and thinking:
      msgs.append({"role": "assistant", "content": thinking_target(t.observation, think)})
    else:
      msgs.append({"role": "assistant", "content": format_observation(t.observation)})
  return msgs


def prompt_messages(traj: Trajectory, target_turn: int, variant: int) -> list[dict[str, str]]:
  """`render_messages` without the final assistant message: the input for sampling, RL, eval."""
  return render_messages(traj, target_turn, variant)[:-1]
