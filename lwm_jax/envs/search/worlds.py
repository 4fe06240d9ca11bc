"""Generated document collections for the `search` environment.

A world is a seeded subset of the standard-library modules whose documentation is indexed, plus
the internal wiki of a fictional company: people, projects, releases and incident reports. Every
wiki page names the pages it refers to by their doc id in square brackets (`[people/ada-okafor]`),
every such reference names a page of the same world, and dates agree with each other: a project
starts before its releases, releases of a project come in order, a release that requires another
project's release comes after it, and an incident follows the release it concerns.
"""
from __future__ import annotations

import datetime
import random
import re
from typing import Any

from lwm_jax.envs import worlds_text as wt

ROLES = ("backend engineer", "frontend engineer", "site reliability engineer", "data scientist",
         "product manager", "designer", "security engineer", "engineering manager")
_ADJ = ("faster", "batched", "incremental", "parallel", "resumable", "encrypted", "streaming",
        "cached", "configurable", "audited", "compressed", "scheduled")
_NOUN = ("exports", "retries", "uploads", "indexing", "checkpoints", "webhooks", "reports",
         "sync", "backups", "notifications", "imports", "dashboards")
_CAUSES = ("a full disk on the primary node", "an expired TLS certificate", "a missing database index",
           "a retry storm after a network blip", "a misconfigured feature flag", "a memory leak in the worker",
           "clock skew between hosts", "a schema migration that locked a table")
REF = re.compile(r"\[((?:people|projects|releases|incidents)/[a-z0-9.-]+)\]")


def _day(d: datetime.date) -> str:
  return d.isoformat()


def _pid(name: str) -> str:
  return "people/" + name.replace(" ", "-")


def _title(name: str) -> str:
  return name.title()


def wiki(r: random.Random) -> tuple[str, list[tuple[str, str, str]]]:
  """(organisation, [(doc_id, title, body)]) of one fictional company wiki."""
  org = r.choice(wt.ORGS)
  names = wt.people(r, r.randint(6, 10))
  person = {n: (r.choice(ROLES), r.choice(wt.TEAMS), r.randint(2014, 2022)) for n in names}
  docs: list[tuple[str, str, str]] = []
  features = [f"{a} {n}" for a in _ADJ for n in _NOUN]
  r.shuffle(features)
  projects = r.sample(wt.CODENAMES, r.randint(3, 5))
  releases: list[dict[str, Any]] = []
  proj_info = {}
  for code in projects:
    start = datetime.date(2021, 1, 1) + datetime.timedelta(days=r.randint(0, 900))
    members = r.sample(names, r.randint(2, 4))
    topic = r.choice(wt.TOPICS)
    proj_info[code] = {"start": start, "lead": members[0], "members": members, "topic": topic}
    day, major, minor = start, 1, 0
    for _ in range(r.randint(2, 4)):
      day = day + datetime.timedelta(days=r.randint(20, 160))
      rel = {"project": code, "version": f"{major}.{minor}", "date": day, "manager": r.choice(members),
             "features": [features.pop() for _ in range(r.randint(1, 2))], "requires": None}
      # A dependency on an earlier release of another project, when one exists.
      earlier = [x for x in releases if x["project"] != code and x["date"] <= day]
      if earlier and r.random() < 0.5:
        rel["requires"] = r.choice(earlier)
      releases.append(rel)
      major, minor = (major + 1, 0) if r.random() < 0.3 else (major, minor + 1)
  rid = lambda x: f"releases/{x['project']}-{x['version']}"
  for code, p in proj_info.items():
    mine = [x for x in releases if x["project"] == code]
    body = (f"Project {code.title()} ({org})\n\nGoal: improve {p['topic']}.\nStarted: {_day(p['start'])}\n"
            f"Lead: {_title(p['lead'])} [{_pid(p['lead'])}]\nMembers: "
            + ", ".join(f"{_title(m)} [{_pid(m)}]" for m in p["members"])
            + "\n\nReleases:\n" + "".join(f"  {x['version']} ({_day(x['date'])}) [{rid(x)}]\n" for x in mine))
    docs.append((f"projects/{code}", f"{code.title()}: the {p['topic']} project of {org}", body))
  for x in releases:
    p = proj_info[x["project"]]
    body = (f"{x['project'].title()} {x['version']}, released {_day(x['date'])}\n\n"
            f"Project: [projects/{x['project']}]\nRelease manager: {_title(x['manager'])} [{_pid(x['manager'])}]\n\n"
            "Highlights:\n" + "".join(f"  - {f} for {p['topic']}\n" for f in x["features"]))
    if x["requires"]:
      q = x["requires"]
      body += f"\nRequires {q['project'].title()} {q['version']} or later [{rid(q)}].\n"
    docs.append((rid(x), f"{x['project'].title()} {x['version']} release notes", body))
  for k in range(r.randint(1, 3)):
    x = r.choice(releases)
    when = x["date"] + datetime.timedelta(days=r.randint(1, 30))
    responder = r.choice(proj_info[x["project"]]["members"])
    inc = f"incidents/inc-{when.year}-{r.randint(100, 999)}-{k}"
    body = (f"Incident report, {_day(when)}\n\nAffected release: [{rid(x)}]\nResponder: "
            f"{_title(responder)} [{_pid(responder)}]\nCause: {r.choice(_CAUSES)}.\n"
            f"Duration: {r.randint(5, 240)} minutes.\n")
    docs.append((inc, f"Incident on {_day(when)}: {x['project'].title()} {x['version']}", body))
  for n in names:
    role, team, since = person[n]
    led = [c for c, p in proj_info.items() if p["lead"] == n]
    on = [c for c, p in proj_info.items() if n in p["members"]]
    since = min([since] + [proj_info[c]["start"].year for c in on])  # joined before their projects
    body = (f"{_title(n)}\n\n{role.capitalize()} on the {team} team of {org} since {since}.\n"
            + ("Leads: " + ", ".join(f"[projects/{c}]" for c in led) + "\n" if led else "")
            + ("Works on: " + ", ".join(f"[projects/{c}]" for c in on) + "\n" if on else ""))
    docs.append((_pid(n), f"{_title(n)}: {role}, {team}", body))
  return org, sorted(docs)


def generate_world(seed: int, modules: tuple[str, ...]) -> dict[str, Any]:
  """World `seed` (pure): the standard-library modules it indexes (a seeded subset of `modules`),
  the wiki's organisation and the wiki's documents as [doc_id, title, body]."""
  r = random.Random(f"search-world-{seed}")
  subset = sorted(r.sample(list(modules), r.randint(12, 30)))
  org, docs = wiki(r)
  return {"modules": subset, "org": org, "wiki": [list(d) for d in docs]}


def check_consistent(world: dict[str, Any]) -> list[str]:
  """Problems with a world's wiki (empty when consistent): every reference resolves, releases
  follow their project's start and each other, requirements and incidents come after."""
  docs = {d[0]: d[2] for d in world["wiki"]}
  problems = [f"{i}: unknown reference [{ref}]" for i, body in docs.items()
              for ref in REF.findall(body) if ref not in docs]
  date = lambda i: re.search(r"\d{4}-\d\d-\d\d", docs[i]).group(0)
  for i, body in docs.items():
    if i.startswith("projects/"):
      rels = [m.group(2) for m in re.finditer(r"  (\S+) \((\d{4}-\d\d-\d\d)\) \[", body)]
      start = re.search(r"Started: (\S+)", body).group(1)
      if rels != sorted(rels) or (rels and rels[0] <= start):
        problems.append(f"{i}: release dates out of order")
    if i.startswith("releases/"):
      req = re.search(r"Requires .* \[(\S+)\]", body)
      if req and date(req.group(1)) > date(i):
        problems.append(f"{i}: requires a later release")
    if i.startswith("incidents/"):
      rel = re.search(r"Affected release: \[(\S+)\]", body).group(1)
      if date(rel) > date(i):
        problems.append(f"{i}: incident before its release")
  return problems
