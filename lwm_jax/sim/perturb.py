"""The perturbation catalogue applied to simulated worlds.

The catalogue itself (specs, parsing, checks, instruction text, the options of the real
environments) is pure and lives in `lwm_jax.envs.perturb`, which the real environments import;
this module re-exports it and adds `apply`, which writes a perturbation's instruction into a
`World`'s simulation instruction. See docs/perturbations.md.
"""
from __future__ import annotations

from typing import Sequence

from lwm_jax.envs.perturb import (  # noqa: F401  (re-exported)
    CATALOGUE, ERROR_KINDS, SEARCH_FIELDS, Faults, Kind, Param, Perturbation, as_list,
    draw, instruction, make, parse, real_options, real_support, spec_of)
from lwm_jax.sim.env import World


def apply(world: World, perts: Sequence[Perturbation] | str) -> World:
  """The world with the perturbations' instruction added to its simulation instruction."""
  text = instruction(as_list(perts))
  if not text:
    return world
  old = world.simulation_instruction.strip()
  return world.replace(simulation_instruction=f"{old}\n{text}" if old else text)
