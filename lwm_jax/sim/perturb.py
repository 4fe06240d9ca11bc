"""The perturbation catalogue: named simulation instructions with parameters.

A perturbation steers a world away from its normal behaviour: intermittent errors, pagination,
withheld fields, partial batch failures, rate limiting, stale reads. Each has a name, typed and
checked parameters, and a rendering into the system prompt's "Simulation instruction" section
(`apply(world, perts)` puts it there; `lwm_jax.data.prompts` lays the section out). The real
bundled environments implement the same perturbations, so that genuine trajectories that follow
an instruction can be recorded; `real_options(perts, domain)` translates them into the options
of a real environment (today: the MCP tool server; the search engine, the web shop and
`launch/collect.py --perturb` read the same catalogue once they implement theirs).

A spec is text: perturbations separated by `;`, each `name` or `name:key=value,key=value`, list
values joined by `+`:

    errors:rate=0.2,kind=timeout; page_size:size=5; withhold:fields=email+city

`parse(spec)` raises ValueError naming the perturbation and the parameter at fault.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from lwm_jax.sim.env import World

ERROR_KINDS = {
    "timeout": "time out (the call returns a timeout error and has no effect)",
    "server_error": "fail with an internal server error (status 500)",
    "unavailable": "fail because the service is temporarily unavailable (status 503)",
}


@dataclasses.dataclass(frozen=True)
class Param:
  name: str
  kind: type  # float, int, str or list (of str)
  default: Any
  check: Callable[[Any], str | None] = lambda v: None  # an error message, or None when fine
  help: str = ""


def _in_unit(v: float) -> str | None:
  return None if 0.0 <= v <= 1.0 else f"must be in [0, 1], got {v}"


def _positive(v: int) -> str | None:
  return None if v >= 1 else f"must be >= 1, got {v}"


def _non_negative(v: int) -> str | None:
  return None if v >= 0 else f"must be >= 0, got {v}"


def _error_kind(v: str) -> str | None:
  return None if v in ERROR_KINDS else f"must be one of {', '.join(ERROR_KINDS)}, got '{v}'"


def _names(v: list) -> str | None:
  return None if v and all(x.strip() for x in v) else "must name at least one field"


@dataclasses.dataclass(frozen=True)
class Kind:
  """One entry of the catalogue: its parameters and how it reads as an instruction."""
  name: str
  params: tuple[Param, ...]
  render: Callable[[dict[str, Any]], str]
  help: str


def _pct(x: float) -> str:
  return f"{100 * x:.0f}%" if abs(100 * x - round(100 * x)) < 1e-9 else f"{100 * x:g}%"


CATALOGUE: dict[str, Kind] = {k.name: k for k in [
    Kind("errors", (Param("rate", float, 0.2, _in_unit, "share of calls that fail"),
                    Param("kind", str, "timeout", _error_kind, "how they fail")),
         lambda p: (f"Intermittent failures: about {_pct(p['rate'])} of the agent's calls "
                    f"{ERROR_KINDS[p['kind']]}, at unpredictable turns; the other calls behave "
                    "normally."),
         "calls fail at a given rate with a given kind of error"),
    Kind("page_size", (Param("size", int, 5, _positive, "items per page"),),
         lambda p: (f"Pagination: a result never lists more than {p['size']} items or rows; when "
                    "there are more, show the first ones and say that the result was cut."),
         "list results are cut to a page"),
    Kind("withhold", (Param("fields", list, ["email"], _names, "field names to leave out"),),
         lambda p: ("Withheld fields: results never contain the field"
                    f"{'s' if len(p['fields']) > 1 else ''} {', '.join(p['fields'])}; leave "
                    "them out entirely, as if the server did not have them."),
         "named fields are left out of results"),
    Kind("partial", (Param("rate", float, 0.3, _in_unit, "share of a batch's items that fail"),),
         lambda p: (f"Partial batch failures: when one action acts on several items, about "
                    f"{_pct(p['rate'])} of them fail with an error while the others succeed; "
                    "report which ones failed."),
         "batch operations half succeed"),
    Kind("rate_limit", (Param("limit", int, 5, _positive, "calls allowed per episode"),
                        Param("retry_after", int, 30, _non_negative, "seconds to wait")),
         lambda p: (f"Rate limiting: only the first {p['limit']} calls of the episode are served; "
                    "every later call is rejected with a rate-limit error (status 429) asking "
                    f"to retry after {p['retry_after']} seconds."),
         "calls beyond a quota are rejected"),
    Kind("stale", (Param("refresh", int, 0, _non_negative,
                         "reads catch up with writes every this many calls (0: never)"),),
         lambda p: ("Stale data: reads show the data as it was at the start of the episode"
                    + (f", catching up only every {p['refresh']} calls" if p["refresh"] else "")
                    + "; writes are acknowledged but later reads do not show them."),
         "reads lag behind writes"),
]}


@dataclasses.dataclass(frozen=True)
class Perturbation:
  name: str
  params: dict[str, Any]

  def instruction(self) -> str:
    return CATALOGUE[self.name].render(self.params)

  def spec(self) -> str:
    kind = CATALOGUE[self.name]
    parts = []
    for p in kind.params:
      v = self.params[p.name]
      parts.append(f"{p.name}={'+'.join(v) if p.kind is list else v}")
    return f"{self.name}:{','.join(parts)}"


def make(name: str, **params: Any) -> Perturbation:
  """A checked perturbation; parameters left out take their defaults."""
  if name not in CATALOGUE:
    raise ValueError(f"perturbation '{name}': unknown (known: {', '.join(CATALOGUE)})")
  kind = CATALOGUE[name]
  known = {p.name: p for p in kind.params}
  for k in params:
    if k not in known:
      raise ValueError(f"perturbation '{name}': unknown parameter '{k}' (known: "
                       f"{', '.join(known)})")
  out = {}
  for p in kind.params:
    v = params.get(p.name, p.default)
    if p.kind is float and isinstance(v, int) and not isinstance(v, bool):
      v = float(v)
    ok = isinstance(v, list) and all(isinstance(x, str) for x in v) if p.kind is list else (
        isinstance(v, p.kind) and not isinstance(v, bool))
    if not ok:
      raise ValueError(f"perturbation '{name}': {p.name} must be {p.kind.__name__}, got {v!r}")
    why = p.check(v)
    if why:
      raise ValueError(f"perturbation '{name}': {p.name} {why}")
    out[p.name] = list(v) if p.kind is list else v
  return Perturbation(name, out)


def _convert(name: str, p: Param, text: str) -> Any:
  text = text.strip()
  try:
    if p.kind is float:
      return float(text)
    if p.kind is int:
      return int(text)
  except ValueError:
    raise ValueError(f"perturbation '{name}': {p.name} must be {p.kind.__name__}, got "
                     f"'{text}'") from None
  if p.kind is list:
    return [x.strip() for x in text.split("+") if x.strip()]
  return text


def parse(spec: str) -> list[Perturbation]:
  """`name:key=value,...; name2...` -> perturbations (see the module docstring)."""
  if not isinstance(spec, str):
    raise ValueError(f"perturbation spec: expected text, got {type(spec).__name__}")
  out: list[Perturbation] = []
  for part in (s.strip() for s in spec.split(";")):
    if not part:
      continue
    name, _, args = part.partition(":")
    name = name.strip()
    if name not in CATALOGUE:
      raise ValueError(f"perturbation '{name}': unknown (known: {', '.join(CATALOGUE)})")
    known = {p.name: p for p in CATALOGUE[name].params}
    params: dict[str, Any] = {}
    for item in (a.strip() for a in args.split(",")):
      if not item:
        continue
      key, eq, value = item.partition("=")
      key = key.strip()
      if not eq:
        raise ValueError(f"perturbation '{name}': expected key=value, got '{item}'")
      if key not in known:
        raise ValueError(f"perturbation '{name}': unknown parameter '{key}' (known: "
                         f"{', '.join(known)})")
      if key in params:
        raise ValueError(f"perturbation '{name}': parameter '{key}' given twice")
      params[key] = _convert(name, known[key], value)
    out.append(make(name, **params))
  names = [p.name for p in out]
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise ValueError(f"perturbation '{dup[0]}': given twice in one spec")
  return out


def instruction(perts: Sequence[Perturbation]) -> str:
  """The simulation instruction text of these perturbations (empty when there are none)."""
  return "\n".join(f"- {p.instruction()}" if len(perts) > 1 else p.instruction() for p in perts)


def apply(world: World, perts: Sequence[Perturbation] | str) -> World:
  """The world with the perturbations' instruction added to its simulation instruction."""
  if isinstance(perts, str):
    perts = parse(perts)
  text = instruction(perts)
  if not text:
    return world
  old = world.simulation_instruction.strip()
  return world.replace(simulation_instruction=f"{old}\n{text}" if old else text)


# Which perturbations each real environment implements, and the options it takes for them.
REAL_SUPPORT = {"mcp": ("errors", "page_size", "withhold", "rate_limit", "stale")}


def real_options(perts: Sequence[Perturbation] | str, domain: str, seed: int = 0
                 ) -> dict[str, Any]:
  """The options that make the real environment of `domain` behave as instructed (for the MCP
  tool server: the `perturb` dict of `lwm_jax.envs.mcp_server.make_server`). Raises
  NotImplementedError naming a perturbation the environment does not implement yet."""
  if isinstance(perts, str):
    perts = parse(perts)
  supported = REAL_SUPPORT.get(domain, ())
  for p in perts:
    if p.name not in supported:
      raise NotImplementedError(
          f"perturbation '{p.name}' is not implemented by the real '{domain}' environment "
          f"(it implements: {', '.join(supported) or 'none yet'})")
  opts: dict[str, Any] = {"seed": seed}
  for p in perts:
    if p.name == "errors":
      opts.update(error_rate=p.params["rate"], error_kind=p.params["kind"])
    elif p.name == "page_size":
      opts["page_size"] = p.params["size"]
    elif p.name == "withhold":
      opts["withhold"] = list(p.params["fields"])
    elif p.name == "rate_limit":
      opts.update(rate_limit=p.params["limit"], retry_after=p.params["retry_after"])
    elif p.name == "stale":
      opts["stale_refresh"] = p.params["refresh"]
  return opts
