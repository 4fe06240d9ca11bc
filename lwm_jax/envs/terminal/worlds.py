"""Generated home directories for the `terminal` environment.

`generate_world(seed)` decides everything about a world: the directory and file names (where the
logs, CSV files, code and notes live and what they are called), the log format, the CSV columns
and their order, the people, regions, products and functions that appear, and every value. The
layout records where each kind of file is so that tasks and the scripted agent name real paths.

`names="made_up"` draws every directory and file name from made-up words instead of the usual
pools (`data/`, `notes/`, `backlog.txt`, ...; a handful of choices each): a world model can guess
the usual names from its prior, but only reads the made-up ones off the episode's file listing
(docs/reproduce.md, "Made-up names"). The rest of the world (contents, layout roles, tasks) is
drawn as usual.
"""
from __future__ import annotations

import random
from typing import Any

from lwm_jax.data.drills import made_up_word
from lwm_jax.envs import worlds_text as wt

NAMES = ("usual", "made_up")

_LEVELS = ["INFO"] * 6 + ["WARN"] * 2 + ["ERROR"] * 2 + ["DEBUG"]
_MSGS = ("request served", "cache miss", "db timeout", "user login", "disk usage high",
         "retrying upstream", "config reloaded", "connection reset", "job finished", "token refreshed",
         "queue drained", "slow query", "upload complete", "session expired", "health check ok",
         "rate limit hit", "export started", "webhook delivered", "lock released", "payment declined")
_SERVICES = ("api", "gateway", "billing", "auth", "indexer", "scheduler", "app", "worker", "web")
_FUNCS = ("parse_line", "load_config", "normalize", "retry_call", "format_row", "merge_maps",
          "slugify", "checksum", "read_rows", "write_report", "group_by", "flatten", "parse_date",
          "to_cents", "send_alert", "open_db", "dedupe", "split_path", "render_table", "validate")
_MODULES = ("utils", "helpers", "io_tools", "parsing", "report", "config", "storage", "alerts")
_NOTES = ("rotate logs", "fix flaky test", "update deps", "write report", "archive sales",
          "ping {p}", "review {p}'s patch", "renew certificate", "clean tmp files", "plan sprint",
          "check disk quota", "migrate cron jobs", "email {p} the numbers")


def _log(r: random.Random, users: list[str], fmt: str) -> str:
  day, hour = r.randint(1, 31), r.randint(0, 12)
  minute = r.randint(0, 59)
  lines = []
  for _ in range(r.randint(14, 40)):
    minute += r.randint(1, 9)
    hour, minute = hour + minute // 60, minute % 60
    ts = f"2024-05-{day:02d}T{hour % 24:02d}:{minute:02d}:{r.randint(0, 59):02d}Z"
    level, user, msg = r.choice(_LEVELS), r.choice(users), r.choice(_MSGS)
    if fmt == "bracket":
      lines.append(f"{ts} {level} [{user}] {msg}")
    else:
      lines.append(f"{ts.replace('T', ' ').rstrip('Z')} {level} user={user} {msg}")
  return "\n".join(lines) + "\n"


def generate_world(seed: int, names: str = "usual") -> dict[str, Any]:
  """The home directory of world `seed`: {"files": {path: text}, "layout": {...}} (pure). `names`
  is one of NAMES: "made_up" draws the directory and file names from made-up words."""
  if names not in NAMES:
    raise ValueError(f"terminal world names: expected one of {', '.join(NAMES)}, got {names!r}")
  r = random.Random(f"terminal-world-{seed}")
  made, used = random.Random(f"terminal-names-{seed}"), set()

  def name(usual: str) -> str:
    """`usual` (already drawn from `r`, so the contents draw as in the usual world of the same
    seed) or, for made-up names, a made-up word no other name of this world uses."""
    if names == "usual":
      return usual
    word = made_up_word(made)
    while word in used:
      word = made_up_word(made)
    used.add(word)
    return word

  pick = lambda options: name(r.choice(options))  # noqa: E731
  files: dict[str, str] = {}
  users = [p.split()[0] for p in wt.people(r, r.randint(4, 9))]
  # Logs.
  service = r.choice(_SERVICES)
  log_dir = pick(["logs", "log", "var/log", f"logs/{service}"])
  log = f"{log_dir}/{pick([service, 'app', service + '-server'])}.log"
  fmt = r.choice(["bracket", "keyvalue"])
  files[log] = _log(r, users, fmt)
  if r.random() < 0.6:
    other = r.choice([s for s in _SERVICES if s != service])
    files[f"{log_dir}/{other}.log"] = "\n".join(
        f"job {r.randint(100, 999)} {r.choice(['ok', 'ok', 'failed', 'retried'])}"
        for _ in range(r.randint(4, 12))) + "\n"
  # CSV files: a sales table with drawn columns and order, a users table, maybe an inventory.
  data_dir = pick(["data", "reports", "datasets", "csv", "exports"])
  sales = f"{data_dir}/{pick(['sales', 'orders', 'revenue', 'sales_2024-05', 'transactions'])}.csv"
  regions = r.sample(wt.REGIONS, r.randint(3, 5))
  products = r.sample(wt.PRODUCTS, r.randint(3, 6))
  amount_col = r.choice(["amount", "total", "revenue", "value"])
  cols = ["date", "region", "product", amount_col] + r.sample(["units", "channel", "rep"], r.randint(0, 2))
  head = cols[:1] + r.sample(cols[1:], len(cols) - 1)
  rows = [",".join(head)]
  for i in range(r.randint(8, 24)):
    rec = {"date": f"2024-05-{1 + i:02d}", "region": r.choice(regions), "product": r.choice(products),
           amount_col: str(r.randint(5, 900)), "units": str(r.randint(1, 40)),
           "channel": r.choice(["web", "store", "phone"]), "rep": r.choice(users)}
    rows.append(",".join(rec[c] for c in head))
  files[sales] = "\n".join(rows) + "\n"
  users_csv = f"{data_dir}/{pick(['users', 'team', 'staff', 'accounts'])}.csv"
  ucols = ["name", "team", "active"] + (["email"] if r.random() < 0.5 else [])
  urows = [",".join(ucols)] + [",".join({"name": u, "team": r.choice(wt.TEAMS), "active": r.choice(["yes", "no"]),
                                         "email": f"{u}@example.com"}[c] for c in ucols)
                               for u in r.sample(users, r.randint(3, len(users)))]
  files[users_csv] = "\n".join(urows) + "\n"
  if r.random() < 0.4:
    files[f"{data_dir}/inventory.csv"] = "product,stock\n" + "".join(
        f"{p},{r.randint(0, 300)}\n" for p in products)
  # Code: two or three modules of functions and a main script that uses one of them.
  src_dir = pick(["src", "lib", "app", "tools", "code"])
  mods = [name(m) for m in r.sample(_MODULES, r.randint(1, 2))]
  funcs = r.sample(_FUNCS, 2 * len(mods) + 2)
  defined: dict[str, str] = {}
  for k, mod in enumerate(mods):
    mine = funcs[2 * k: 2 * k + 2]
    body = "".join(f'def {f}(value):\n  """{f.replace("_", " ").capitalize()}."""\n  return value\n\n\n'
                   for f in mine)
    files[f"{src_dir}/{mod}.py"] = body.rstrip("\n") + "\n"
    defined.update({f: f"{src_dir}/{mod}.py" for f in mine})
  main = f"{src_dir}/{pick(['main', 'run', 'cli', 'app'])}.py"
  f_use, f_run, f_entry = funcs[0], funcs[-2], funcs[-1]
  files[main] = (f"from {mods[0]} import {f_use}\n\n\ndef {f_run}(rows):\n  return [{f_use}(r) for r in rows]\n"
                 f"\n\ndef {f_entry}():\n  print('start')\n\n\nif __name__ == '__main__':\n  {f_entry}()\n")
  defined.update({f_run: main, f_entry: main})
  # Notes: a to-do list, meeting notes, maybe ideas; some already in markdown.
  notes_dir = pick(["notes", "docs", "memos", "journal"])
  todo = f"{notes_dir}/{pick(['todo', 'tasks', 'backlog'])}.txt"
  files[todo] = "".join(f"- {x.format(p=r.choice(users))}\n" for x in r.sample(_NOTES, r.randint(2, 5)))
  for k in range(r.randint(1, 3)):
    files[f"{notes_dir}/{name(f'meeting-{r.randint(1, 12):02d}-{1 + k:02d}')}.txt"] = (
        f"Meeting {k + 1}\nattendees: " + ", ".join(r.sample(users, 3)) + "\n")
  if r.random() < 0.4:
    files[f"{notes_dir}/{name('ideas')}.md"] = "# ideas\n\n" + "".join(f"* {t}\n" for t in r.sample(wt.TOPICS, 2))
  if r.random() < 0.5:
    script = f"{name('scripts')}/{pick(['backup', 'deploy', 'cleanup', 'sync'])}.sh"
    files[script] = (f"#!/bin/sh\n# run nightly by {r.choice(users)}\nset -e\n"
                     f"tar czf /tmp/{data_dir}.tgz {data_dir}\necho done\n")
  files["README.md"] = (f"# {r.choice(wt.CODENAMES)} {r.choice(['project', 'sandbox', 'workspace'])}\n\n"
                        f"Logs in {log_dir}/, data in {data_dir}/, code in {src_dir}/, notes in {notes_dir}/.\n")
  layout = {"log": log, "log_format": fmt, "data": data_dir, "sales": sales, "sales_columns": head,
            "amount": amount_col, "regions": sorted({row.split(",")[head.index("region")] for row in rows[1:]}),
            "users_csv": users_csv, "src": src_dir, "functions": defined, "notes": notes_dir, "todo": todo,
            "backup": pick(["backup", "bak", "archive", f"{data_dir}_backup"])}
  return {"files": dict(sorted(files.items())), "layout": layout}


def check_consistent(world: dict[str, Any]) -> list[str]:
  """Problems with a world (empty when consistent): every path the layout names exists, every
  function it lists is defined in its file, the regions are the CSV's own."""
  files, lay = world["files"], world["layout"]
  problems = [f"missing {k}: {lay[k]}" for k in ("log", "sales", "users_csv", "todo") if lay[k] not in files]
  for func, path in lay["functions"].items():
    if f"def {func}(" not in files.get(path, ""):
      problems.append(f"{func} not defined in {path}")
  lines = files.get(lay["sales"], "").splitlines()
  if lines and lines[0].split(",") != lay["sales_columns"]:
    problems.append("sales header differs from the layout")
  col = lay["sales_columns"].index("region")
  if sorted({l.split(",")[col] for l in lines[1:]}) != lay["regions"]:
    problems.append("regions differ from the sales file")
  if not any(p.startswith(lay["notes"] + "/") and p.endswith(".txt") for p in files):
    problems.append("no .txt note to rename")
  return problems
