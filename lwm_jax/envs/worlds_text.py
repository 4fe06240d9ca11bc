"""Word pools shared by the generated worlds of the text environments (terminal, swe, search).

Every pool is a plain tuple; generators draw from them with the episode's seeded generator, so a
world is a pure function of its seed. Names are ordinary, realistic and invented for this project.
"""
from __future__ import annotations

import random

FIRST_NAMES = (
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "karim",
    "lena", "mateo", "nadia", "oscar", "priya", "quinn", "rosa", "sanjay", "tara", "umar", "vera",
    "wen", "xavier", "yusuf", "zoe", "amara", "bruno", "chen", "dmitri", "elif", "farah", "goran",
    "hana", "ines", "jonas", "kofi", "lucia", "milan", "noor", "olga", "pablo", "rhea", "soren",
    "tomas", "ulla", "vikram", "wanda", "yara", "zain")
LAST_NAMES = (
    "okafor", "lindqvist", "moreau", "tanaka", "silva", "novak", "haddad", "kowalski", "mensah",
    "fischer", "ramirez", "petrov", "osei", "brennan", "castillo", "dubois", "eriksen", "farouk",
    "gallo", "hoang", "ibarra", "jensen", "kaur", "laine", "mwangi", "nakamura", "oliveira",
    "park", "quint", "rossi", "sato", "thorne", "uddin", "varga", "weiss", "yilmaz", "zhou")
TEAMS = ("ops", "web", "data", "infra", "billing", "search", "mobile", "platform", "security", "qa")
REGIONS = ("north", "south", "east", "west", "central", "coastal", "alpine", "metro", "valley")
PRODUCTS = ("widget", "gadget", "sprocket", "gizmo", "bracket", "valve", "hinge", "spindle",
            "gasket", "lever", "pulley", "flange", "rotor", "socket", "clamp")
CODENAMES = (
    "halcyon", "juniper", "kestrel", "lumen", "meridian", "nimbus", "orchid", "pioneer", "quartz",
    "rivulet", "saffron", "tundra", "umbra", "vesper", "willow", "zephyr", "aurora", "basalt",
    "cinder", "drift", "ember", "fjord", "granite", "harbor", "iris", "jasper", "lantern", "mosaic")
ORGS = ("Northwind Labs", "Bluefield Systems", "Copperline", "Driftwood Analytics", "Evergreen Works",
        "Foxglove Software", "Graniteview", "Harborlight", "Ironbark Data", "Juniper Row")
TOPICS = (
    "billing pipeline", "search ranking", "image resizing", "payment retries", "audit logging",
    "config rollout", "mobile sync", "report export", "cache warming", "rate limiting",
    "schema migration", "alert routing", "session storage", "feature flags", "invoice parsing",
    "metrics ingestion", "email delivery", "access control", "backup rotation", "data retention")


def person(rng: random.Random) -> str:
  """A 'first last' name drawn from the pools."""
  return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def people(rng: random.Random, n: int) -> list[str]:
  """`n` distinct 'first last' names (distinct first names too, so handles stay unique)."""
  firsts = rng.sample(FIRST_NAMES, n)
  return [f"{f} {rng.choice(LAST_NAMES)}" for f in firsts]
