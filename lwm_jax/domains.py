"""The domain registry: one record per domain, read by every part of the library that differs by domain.

A domain (terminal, mcp, a web shop, ...) is everything the library knows about one kind of world:
its real environment and scripted agent, its world generator, its task verifiers, the perturbations
its real environment implements, and its text (the world model's system prompt, the long guidance,
the agent's world description, the judge's guidance). Each built-in domain lives in its own folder,
`lwm_jax/envs/<folder>/`, whose `__init__.py` builds its `Domain` and registers it; a domain defined
elsewhere (a test's toy domain, a user's own) calls `register_domain` the same way.

The record names code by "module:attribute" strings, imported only when used (`load`), so reading a
domain's text needs none of its environment's dependencies and this module imports nothing of ours:
the data layer (schema, prompts) may read it. The built-in folders are imported by name the first
time the registry is read (`_BUILTIN`); that is the one place the library lists its domains.
"""
from __future__ import annotations

import dataclasses
import importlib
import threading
from typing import Any, Mapping, Sequence

# What an observation of the domain is made of; decides the RL guard's and rule reward's checks:
# json (tool results), tree (an accessibility tree or view hierarchy), output (a program's text
# output, deterministic where the state decides it), free (live results with no exact reference).
CONTENT_KINDS = ("json", "tree", "output", "free")
PROMPT_KEYS = ("role", "obs", "actions", "demo", "rules")

# The built-in domains, imported on first use, in the benchmark's column order.
_BUILTIN = ("lwm_jax.envs.mcp", "lwm_jax.envs.search", "lwm_jax.envs.terminal", "lwm_jax.envs.swe",
            "lwm_jax.envs.android", "lwm_jax.envs.web", "lwm_jax.envs.desktop")


@dataclasses.dataclass(frozen=True, eq=False)
class Domain:
  """Everything that differs by domain. Code is named by "module:attribute" strings (see `load`).

  name: the trajectories' `domain` field and the benchmark's task suffix ("agentworldbench/NAME").
  display: the short heading of report tables ("Term.").
  env, agent: the real environment class (`envs.base.Env`, built with keyword options) and the
    scripted agent class (`envs.base.Agent`, built from a `random.Random`).
  world: `generate_world(seed) -> (world, ...)`, the seeded world generator the env's reset uses
    ("" when the domain has none).
  verifier: `check(env, goal, turns) -> Verdict` on the environment's live state after an episode.
  transcript_verifier: the same verdict from the transcript and the regenerated world alone.
  prompt: the world model's system-prompt text: `role` (what is simulated), `obs` (what an
    observation is), `actions` (the default action space), `demo` (a default demonstration),
    `rules` (domain rules, most important first).
  guidance: the long prompts' guidance, a list of (heading, [points]) groups, most important first.
  agent_world: what an agent acts on ("a bash shell on a Linux machine"), for the agent's prompt.
  judge_guidance: the judge's paragraph about the domain's observations. Required: a domain the
    judge cannot be told about cannot be registered.
  content: one of CONTENT_KINDS.
  gui: observations are screens (accessibility trees) whose clocks the recorder and hygiene drop.
  tool_calls: actions are tool calls whose results hygiene checks for tool-call form.
  benchmark: one of the benchmark's domains (counted by `bench_domains`, e.g. for "partial").
  real_perturbations: the perturbation names the real environment implements (envs/perturb.py).
  corpus_perturbations: the perturbation specs a corpus draws from and fidelity measures.
  withhold_fields: the only fields the `withhold` perturbation may name (empty: any field).
  finish_actions: extra actions that end a simulated episode besides the common ones.
  corpus_check: `problem(trajectory) -> str | None`, why a collected episode must stay out of a
    corpus (beyond the common checks), or "" for none.
  screen: `screen(observation) -> str | None`, the screen or window an observation shows (its
    title as the environment renders it; None when the text shows none), for the fidelity
    report's screen identity (lwm_jax/eval/turn_kinds.py); "" for a domain without screens.
  error: `error(observation) -> str`, the error an observation shows the environment reporting
    ("" when it shows none): the rule the fidelity report reads predictions with. The truth it is
    compared with is the environment's own signal (`Env.step_error`, kept per turn by the
    recorder); the rule is checked against that signal on real observations.
  """
  name: str
  display: str
  env: str
  agent: str
  prompt: Mapping[str, Any]
  guidance: Sequence[tuple[str, list[str]]]
  agent_world: str
  judge_guidance: str
  content: str
  world: str = ""
  verifier: str = ""
  transcript_verifier: str = ""
  gui: bool = False
  tool_calls: bool = False
  benchmark: bool = True
  real_perturbations: tuple[str, ...] = ()
  corpus_perturbations: tuple[str, ...] = ()
  withhold_fields: tuple[str, ...] = ()
  finish_actions: tuple[str, ...] = ()
  corpus_check: str = ""
  screen: str = ""
  error: str = ""

  def __post_init__(self) -> None:
    where = f"domain '{self.name}'"
    if not self.name or not self.name.replace("_", "").isalnum():
      raise ValueError(f"domain name must be a non-empty identifier, got {self.name!r}")
    for field in ("display", "env", "agent", "agent_world", "judge_guidance"):
      if not isinstance(getattr(self, field), str) or not getattr(self, field).strip():
        raise ValueError(f"{where}: field '{field}' must be a non-empty string")
    for field in ("env", "agent", "world", "verifier", "transcript_verifier", "corpus_check",
                  "screen", "error"):
      ref = getattr(self, field)
      if ref and ref.count(":") != 1:
        raise ValueError(f"{where}: field '{field}' must be 'module:attribute', got {ref!r}")
    missing = [k for k in PROMPT_KEYS if k not in self.prompt]
    if missing:
      raise ValueError(f"{where}: prompt lacks {', '.join(missing)} (needs {', '.join(PROMPT_KEYS)})")
    if self.content not in CONTENT_KINDS:
      raise ValueError(f"{where}: content must be one of {', '.join(CONTENT_KINDS)}, "
                       f"got {self.content!r}")

  def load(self, field: str) -> Any:
    """The object a "module:attribute" field names (ValueError when the field is empty)."""
    ref = getattr(self, field)
    if not ref:
      raise ValueError(f"domain '{self.name}' has no {field}")
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


_DOMAINS: dict[str, Domain] = {}
_LOCK = threading.RLock()
_loaded = False
_loading = False  # the built-in folders are being imported (by the thread holding _LOCK)
_builtin_names: list[str] = []  # the built-in domains' names in _BUILTIN's order


def _load_builtin() -> None:
  """Imports the built-in domain folders once. Other threads wait on the lock until the loading
  thread is done (they must never see a half-filled registry); the loading thread itself may call
  back in while a folder registers its record (the lock is re-entrant), and then returns at once."""
  global _loaded, _loading
  if _loaded:
    return
  with _LOCK:
    if _loaded or _loading:
      return
    _loading = True
    try:
      for module in _BUILTIN:
        _builtin_names.append(importlib.import_module(module).DOMAIN.name)
      _loaded = True
    except BaseException:  # a broken built-in leaves no half-filled registry behind
      _builtin_names.clear()
      raise
    finally:
      _loading = False


def register_domain(domain: Domain, replace: bool = False) -> Domain:
  """Adds `domain` to the registry and returns it. A second domain of the same name is an error
  unless `replace` (a test swapping a record in); re-registering the same record is a no-op."""
  if not isinstance(domain, Domain):
    raise TypeError(f"register_domain expects a Domain, got {type(domain).__name__}")
  with _LOCK:
    old = _DOMAINS.get(domain.name)
    if old is not None and old is not domain and not replace:
      raise ValueError(f"domain '{domain.name}' is already registered (by {old.env})")
    _DOMAINS[domain.name] = domain
  return domain


def unregister_domain(name: str) -> None:
  """Removes a registered domain (tests that register a toy domain clean up with this)."""
  with _LOCK:
    _DOMAINS.pop(name, None)


def domains() -> tuple[Domain, ...]:
  """Every registered domain: the built-in ones in the benchmark's order, then the others in the
  order they were registered."""
  _load_builtin()
  first = [_DOMAINS[n] for n in _builtin_names if n in _DOMAINS]
  return tuple(first + [d for n, d in _DOMAINS.items() if n not in _builtin_names])


def names() -> tuple[str, ...]:
  return tuple(d.name for d in domains())


def is_domain(name: str) -> bool:
  _load_builtin()
  return name in _DOMAINS


def get_domain(name: str) -> Domain:
  """The record of domain `name`; ValueError naming the registered ones when there is none."""
  _load_builtin()
  d = _DOMAINS.get(name)
  if d is None:
    raise ValueError(f"unknown domain '{name}' (expected one of {', '.join(names())})")
  return d


def bench_domains() -> tuple[str, ...]:
  """The benchmark's domains (`benchmark=True`), in order; their number is what a complete
  evaluation covers."""
  return tuple(d.name for d in domains() if d.benchmark)
