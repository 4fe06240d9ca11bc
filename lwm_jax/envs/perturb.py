"""The perturbation catalogue: named simulation instructions with parameters.

A perturbation steers a world away from its normal behaviour: intermittent errors, pagination,
withheld fields, partial batch failures, rate limiting, stale reads. Each has a name, typed and
checked parameters, and a rendering into the system prompt's "Simulation instruction" section
(`lwm_jax.sim.perturb.apply(world, perts)` puts it there; `lwm_jax.data.prompts` lays the section
out). The real bundled environments implement the same perturbations (`real_support`: the MCP
tool server, the search engine, the web shop), so that genuine trajectories that follow an
instruction can be recorded (`launch/collect.py --perturb=SPEC`); `real_options(perts, domain,
seed)` translates them into the options of a real environment. See docs/perturbations.md.

This module is pure (no model, no sampling): the real environments import it, and
`lwm_jax.sim.perturb` re-exports it.

A spec is text: perturbations separated by `;`, each `name` or `name:key=value,key=value`, list
values joined by `+`:

    errors:rate=0.2,kind=timeout; page_size:size=5; withhold:fields=email+city

`parse(spec)` raises ValueError naming the perturbation and the parameter at fault.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Sequence

from lwm_jax import domains as domains_lib

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


def spec_of(perts: Sequence[Perturbation]) -> str:
  """The canonical spec text of `perts` (what `parse` reads back to the same list)."""
  return "; ".join(p.spec() for p in perts)


def as_list(perts: Sequence[Perturbation] | str | None) -> list[Perturbation]:
  if perts is None:
    return []
  return parse(perts) if isinstance(perts, str) else list(perts)


def real_support(domain: str) -> tuple[str, ...]:
  """The perturbations the real environment of `domain` implements (its record's
  `real_perturbations`; none for a domain that is not registered)."""
  return domains_lib.get_domain(domain).real_perturbations if domains_lib.is_domain(domain) else ()

# The fields a search result can go without (the search domain's `withhold_fields`).
SEARCH_FIELDS = ("title", "snippet", "score")


def real_options(perts: Sequence[Perturbation] | str, domain: str, seed: int = 0
                 ) -> dict[str, Any]:
  """The options that make the real environment of `domain` behave as instructed (for the MCP
  tool server: the `perturb` dict of `lwm_jax.envs.mcp.server.make_server`; the search engine and
  the web shop take the same keys). Raises NotImplementedError naming a
  perturbation the environment does not implement, ValueError for a field it cannot withhold."""
  perts = as_list(perts)
  supported = real_support(domain)
  for p in perts:
    if p.name not in supported:
      raise NotImplementedError(
          f"perturbation '{p.name}' is not implemented by the real '{domain}' environment "
          f"(it implements: {', '.join(supported) or 'none'})")
  opts: dict[str, Any] = {"seed": seed}
  for p in perts:
    if p.name == "errors":
      opts.update(error_rate=p.params["rate"], error_kind=p.params["kind"])
    elif p.name == "page_size":
      opts["page_size"] = p.params["size"]
    elif p.name == "withhold":
      fields = domains_lib.get_domain(domain).withhold_fields if domains_lib.is_domain(domain) else ()
      bad = [f for f in p.params["fields"] if fields and f not in fields]
      if bad:
        raise ValueError(f"perturbation 'withhold': the {domain} environment cannot withhold "
                         f"{', '.join(bad)} (its result fields: {', '.join(fields)})")
      opts["withhold"] = list(p.params["fields"])
    elif p.name == "rate_limit":
      opts.update(rate_limit=p.params["limit"], retry_after=p.params["retry_after"])
    elif p.name == "stale":
      opts["stale_refresh"] = p.params["refresh"]
    elif p.name == "partial":
      opts["partial_rate"] = p.params["rate"]
  return opts


def draw(seed: Any, call: int) -> float:
  """A uniform number in [0, 1) fixed by (seed, call number): the same in every process (the
  MCP tool server draws its failures the same way)."""
  h = hashlib.blake2b(f"{seed}/{call}".encode(), digest_size=8).digest()
  return int.from_bytes(h, "big") / 2.0 ** 64


class Faults:
  """The per-episode fault schedule of a real environment: counts calls and says which fail.

  `call()` returns None for a call served normally, else the kind of failure: "rate_limit" once
  the quota is spent, or the error kind drawn for this call. `partial(n)` says which of `n`
  items of one batch action fail (a separate stream, so batch sizes do not shift the call
  draws)."""

  def __init__(self, opts: dict[str, Any] | None):
    self.opts = dict(opts or {})
    self.seed = self.opts.get("seed", 0)
    self.calls = 0
    self.items = 0

  def __bool__(self) -> bool:
    return any(k != "seed" for k in self.opts)

  def call(self) -> str | None:
    self.calls += 1
    o = self.opts
    if "rate_limit" in o and self.calls > o["rate_limit"]:
      return "rate_limit"
    if o.get("error_rate", 0.0) > 0 and draw(self.seed, self.calls) < o["error_rate"]:
      return o.get("error_kind", "timeout")
    return None

  def partial(self, n: int) -> list[bool]:
    """For each of `n` items: True when it fails."""
    rate = self.opts.get("partial_rate", 0.0)
    out = []
    for _ in range(n):
      self.items += 1
      out.append(rate > 0 and draw(f"{self.seed}-partial", self.items) < rate)
    return out


RATE_LIMIT_TEXT = "Rate limit exceeded (429): {limit} calls allowed per session; retry after {after} s"


class Perturbable:
  """Mixin of the real environments that implement perturbations: `set_perturb(spec)` chooses
  those of the following episodes (checked against the environment at once); `faults` is the
  current episode's schedule, made by `begin_faults(seed)` in `reset`."""
  perturbs: list[Perturbation] = []
  faults: Faults = Faults(None)

  def set_perturb(self, perts: Sequence[Perturbation] | str | None) -> None:
    perts = as_list(perts)
    real_options(perts, self.domain)  # raises for one this environment does not implement
    self.perturbs = perts

  def begin_faults(self, seed: int) -> dict[str, Any]:
    """This episode's options (empty without perturbations) and a fresh fault schedule."""
    opts = real_options(self.perturbs, self.domain, seed) if self.perturbs else {}
    self.faults = Faults(opts)
    return opts

  def fault_text(self, kind: str) -> str:
    """The message of a failed call (the MCP tool server's wording)."""
    from lwm_jax.envs.mcp.server import ERROR_MESSAGES
    if kind == "rate_limit":
      return RATE_LIMIT_TEXT.format(limit=self.faults.opts["rate_limit"],
                                    after=self.faults.opts.get("retry_after", 30))
    return ERROR_MESSAGES[kind]


def corpus_menu() -> dict[str, tuple[str, ...]]:
  """The perturbations a corpus draws from, per domain with a real counterpart (tools/make_corpus.py
  --perturb_share) and which the fidelity evaluation measures (lwm_jax/eval/fidelity.py): each
  registered domain's `corpus_perturbations`, for the domains that have some."""
  return {d.name: d.corpus_perturbations for d in domains_lib.domains() if d.corpus_perturbations}


def parse_menu(text: str, domains: Sequence[str], flag: str = "--specs") -> dict[str, list[str]]:
  """Per domain, a list of canonical specs: each domain's `corpus_menu()` entry for "", else the given
  `domain=SPEC|SPEC` entries separated by `&&` (a spec itself uses `;` and `,`); a domain left out
  gets none. Each spec is checked against the domain's real environment. Errors name `flag`."""
  menus = corpus_menu()
  out = {d: list(menus[d]) for d in domains}
  if not text:
    return out
  out = {d: [] for d in domains}
  for part in text.split("&&"):
    d, eq, rest = part.partition("=")
    d = d.strip()
    if not eq or d not in out:
      raise ValueError(f"{flag}: expected DOMAIN=SPEC|SPEC with DOMAIN in {', '.join(domains)}, "
                       f"got '{part}'")
    for spec in rest.split("|"):
      perts = parse(spec)
      real_options(perts, d)
      out[d].append(spec_of(perts))
  return out


def corpus_choice(domain: str, index: int, share: float, seed: int = 0,
                  menu: Sequence[str] | None = None) -> str:
  """The perturbation spec of episode `index` of a corpus run ("" for none): about `share` of
  the episodes of a domain in `corpus_menu()` (or of `menu` when given), each with a menu entry, both
  fixed by (domain, seed, index) so a re-run makes the same choices."""
  if not 0.0 <= share <= 1.0:
    raise ValueError(f"perturb_share must be in [0, 1], got {share}")
  menu = corpus_menu().get(domain, ()) if menu is None else tuple(menu)
  if not menu or share <= 0.0 or draw(f"corpus/{domain}/{seed}", index) >= share:
    return ""
  return menu[int(draw(f"corpus/{domain}/{seed}/kind", index) * len(menu))]
