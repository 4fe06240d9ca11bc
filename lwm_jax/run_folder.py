"""Output folders of the launchers: made fresh, and never a folder the program did not make.

A launcher validates all of its flags first, then calls `prepare(path)`. A folder that does not
exist, or is empty, is (re)made and marked with `MARKER`. A folder that holds the marker was made
by one of our launchers and is replaced as before. Any other folder with files in it (a user's
data, another tool's output, a run made before the marker existed) is refused with an error that
names it, unless the user passed `--overwrite`; a symbolic link or a file at the path is always
refused. Nothing is deleted before this check.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

MARKER = ".lwm_jax_run"


def check(path: str, flag: str, overwrite: bool = False) -> str:
  """The absolute path if `prepare(path)` may use it; ValueError (naming `flag`) otherwise."""
  path = os.path.abspath(path)
  if os.path.islink(path):
    raise ValueError(f"{flag}={path} is a symbolic link; give the folder itself")
  if os.path.lexists(path) and not os.path.isdir(path):
    raise ValueError(f"{flag}={path} is a file, not a folder")
  if os.path.isdir(path):
    names = sorted(os.listdir(path))
    if names and MARKER not in names and not overwrite:
      shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
      raise ValueError(f"{flag}={path} is a folder this program did not make and it is not empty "
                       f"({len(names)} entries: {shown}); nothing was changed. Choose a new "
                       "folder, or pass --overwrite to replace it")
  parent = os.path.dirname(path)
  probe = parent
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.access(probe, os.W_OK | os.X_OK):
    raise ValueError(f"{flag}={path}: {probe} is not writable")
  return path


def prepare(path: str, flag: str, overwrite: bool = False, keep: bool = False) -> str:
  """Makes `path` an empty marked folder (or, with `keep`, keeps a marked one's files); returns it.

  Raises ValueError as `check` does, before anything is deleted."""
  path = check(path, flag, overwrite)
  if os.path.isdir(path) and os.listdir(path) and not keep:
    shutil.rmtree(path)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, MARKER), "w") as f:
    json.dump({"made_by": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f)
  return path
