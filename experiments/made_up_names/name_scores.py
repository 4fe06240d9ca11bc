"""Names in the listing turns of the listing probe's played episodes (`listing_probe.py`): per
model and naming, the precision and recall of the file and directory names a simulated `ls`
wrote against the names the real `ls` wrote (distinct words ending each entry; `total`, the
permission columns, dates and the prompt line left out), and the share of written names that
occur anywhere in the episode's initial state (copied, right or wrong, rather than invented).

  python experiments/made_up_names/name_scores.py experiments/made_up_names/listing_probe_*.json
"""
import json
import os
import re
import sys

from lwm_jax.data import schema
from lwm_jax.envs.terminal.verify import shell_output
from listing_probe import HELD_OUT, is_listing

_NAME = re.compile(r"^[\w.-]+$")


def names(listing: str) -> set[str]:
  """The entry names of an `ls` output: the last field of `ls -l` rows, every field otherwise."""
  out = set()
  for line in shell_output(listing):
    if line.startswith("total ") or line.endswith(":"):
      continue
    fields = line.split()
    if line[:1] in "-d" and len(fields) >= 9:
      fields = fields[-1:]
    out |= {f for f in fields if _NAME.match(f) and f not in (".", "..")}
  return out


def main(paths: list[str]) -> None:
  initial = {k: {t.id: t.initial_state for t in schema.read_jsonl(p)} for k, p in HELD_OUT.items()}
  for path in paths:
    played = json.load(open(path))
    row = []
    for naming, eps in played.items():
      tp = fp = fn = copied = 0
      for p in eps:
        known = set(re.split(r"[\s/]+", initial[naming][p["trajectory"]]))
        for action, pred, real in zip(p["actions"], p["predicted"], p["real"]):
          if not is_listing(action):
            continue
          got, want = names(pred), names(real)
          tp, fp, fn = tp + len(got & want), fp + len(got - want), fn + len(want - got)
          copied += len(got & known)
      prec, rec = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
      row.append(f"{naming}: precision {prec:.2f}, recall {rec:.2f}, "
                 f"in the initial state {copied / max(tp + fp, 1):.2f}")
    print(os.path.basename(path), "|", " | ".join(row))


if __name__ == "__main__":
  main(sys.argv[1:])
