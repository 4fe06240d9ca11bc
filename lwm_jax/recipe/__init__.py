"""lwm_jax.recipe: experiments run end to end over a config of `configs`: `reproduce` (the recipe:
tokenizer, CPT, SFT, optional GSPO, free-running evaluation, report and ship; configs/reproduce.py),
`agent_experiment` (agents trained inside the world model, scored in the real environment;
configs/agent_experiment.py), `rl_experiment` (GSPO against a keep-doing-SFT control;
configs/rl_experiment.py) and `perturb_experiment` (fine-tuning on perturbed trajectories against
plain; configs/perturb_experiment.py). It sits above train, eval and rl, and reads the stage presets of
`configs`; nothing below it imports it."""

from __future__ import annotations

import logging
from typing import Any, Callable

from absl import logging as absl_logging

from configs import close_matches


def unknown_field(config: Any, known: Any, source: str) -> str | None:
  """The error line for the first field of `config` that `known` (a fresh config of the same
  file, `source`) lacks, with close matches; None when every field is known."""
  for k in config:
    if k not in known:
      return f"--config.{k}: {source} has no field '{k}'{close_matches(k, list(known))}"
  return None


def settings(config: Any, resolve: Callable[[Any], Any]) -> Any:
  """The start of every run here: logging quiet but for the run's own lines, then `resolve(config)`
  (the module's check of every field), a bad value ending the program with one line naming it."""
  logging.getLogger().setLevel(logging.WARNING)
  absl_logging.set_verbosity(absl_logging.WARNING)
  try:
    return resolve(config)
  except ValueError as e:
    raise SystemExit(str(e)) from None
