"""Training configs: one file per stage (`cpt.py`, `sft.py`, `rl.py`) over shared sections and
named presets (`common.py`). A config file returns an `ml_collections.ConfigDict` from
`get_config(preset)`.

On the command line a config is `FILE:PRESET` with dotted overrides:

  python launch/train.py --config=configs/cpt.py:tiny --config.train.num_steps=3 --workdir=DIR

In Python it is an ordinary import: `from configs import cpt; c = cpt.get_config("tiny")`.
This package imports only `lwm_jax` (the library) and `ml_collections` (and absl inside
`flags_parser`, which only launchers call).
"""
from __future__ import annotations

import difflib
import importlib.util
import os
from typing import Sequence

import ml_collections

HERE = os.path.dirname(os.path.abspath(__file__))


class ConfigError(ValueError):
  """A config file, preset or override that does not exist; the message names it."""


def close_matches(name: str, candidates: Sequence[str]) -> str:
  """' (close matches: a, b)' or ' (known: ...)' when nothing is close, for error messages."""
  near = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
  if near:
    return f" (close matches: {', '.join(near)})"
  return f" (known: {', '.join(sorted(candidates))})" if candidates else ""


def split_spec(spec: str) -> tuple[str, str | None]:
  """'configs/cpt.py:tiny' -> ('configs/cpt.py', 'tiny'); 'configs/cpt.py' -> (path, None)."""
  path, sep, arg = spec.rpartition(":")
  if not sep or "/" in arg or arg.endswith(".py"):
    return spec, None
  return path, arg


def load(spec: str) -> ml_collections.ConfigDict:
  """The config of `FILE[:PRESET]` (a path to a .py file, relative to the working directory as on
  the command line) or `STAGE[:PRESET]` (a module of this package, e.g. 'cpt:tiny')."""
  path, arg = split_spec(spec)
  if not path.endswith(".py") and os.sep not in path:
    path = os.path.join(HERE, f"{path}.py")
  if not os.path.isfile(path):
    folder = os.path.dirname(path) or "."
    files = [os.path.join(os.path.dirname(path), f) for f in sorted(os.listdir(folder))
             if f.endswith(".py") and not f.startswith("_")] if os.path.isdir(folder) else []
    raise ConfigError(f"--config={spec}: no config file {path}{close_matches(path, files)}")
  module = _load_file(path)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"--config={spec}: {path} has no get_config(arg) function")
  try:
    return module.get_config(arg) if arg is not None else module.get_config()
  except ConfigError as e:
    raise ConfigError(f"--config={spec}: {e}") from e


def _load_file(path: str):
  name = f"_config_{os.path.splitext(os.path.basename(path))[0]}"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def check_field(config: ml_collections.ConfigDict, dotted: str) -> None:
  """Raises ConfigError naming `dotted` (e.g. 'train.num_stpes') when the config has no such
  field, with the close matches among its siblings."""
  node, walked = config, "config"
  for name in dotted.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      known = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      raise ConfigError(f"--config.{dotted}: {walked} has no field '{name}'"
                        f"{close_matches(name, known)}")
    node, walked = node[name], f"{walked}.{name}"


def flags_parser(default: str | None, help_text: str):
  """absl's `flags_parser` for a launcher whose settings are a config of this package
  (`app.run(main, flags_parser=configs.flags_parser(FILE, HELP))`): checks the command line
  (`check_command_line`), then defines `--config` (`default`: the file, with its variant, used
  without --config; None: --config is required) and parses. Defining the flag after the check
  matters: without --config, config_flags applies overrides to the default as it defines the flag,
  so a typo would be a traceback. A bad file, variant, field or value is one line on stderr and
  exit status 2."""

  def parse(argv: Sequence[str]) -> list[str]:
    import sys  # pylint: disable=import-outside-toplevel
    from absl import flags  # pylint: disable=import-outside-toplevel
    from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
    try:
      check_command_line(argv, default=default)
      if "config" not in flags.FLAGS:
        config_flags.DEFINE_config_file("config", default, help_text, lock_config=True)
        if default is None:
          flags.mark_flag_as_required("config")
      return flags.FLAGS(argv)
    except (ValueError, flags.Error) as e:
      message = str(e).strip()
      print(f"error: {message.splitlines()[0] if message else repr(e)}", file=sys.stderr)
      sys.exit(2)

  return parse


def check_command_line(argv: Sequence[str],
                       default: str | None = None) -> ml_collections.ConfigDict | None:
  """Checks `--config=FILE:PRESET` and every `--config.FIELD[=VALUE]` of a command line before
  absl parses it, so a typo is one line naming the field instead of a traceback. Returns the
  config (without the overrides), or None when the command line has no --config and no
  `default` (the launcher's config spec when --config is not given) stands in for it."""
  spec, overrides = default, []
  args = list(argv[1:])
  for i, a in enumerate(args):
    if a == "--config" and i + 1 < len(args):
      spec = args[i + 1]
    elif a.startswith("--config="):
      spec = a[len("--config="):]
    elif a.startswith(("--config.", "--noconfig.")):
      overrides.append(a.split("=", 1)[0].split("config.", 1)[1])
  if spec is None:
    return None
  config = load(spec)
  for dotted in overrides:
    check_field(config, dotted)
  return config

