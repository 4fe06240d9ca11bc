"""Perturbed vs plain fine-tuning at equal compute, then instruction fidelity of the start and both
runs (docs/perturbations.md), run by `launch/perturb_experiment.py` (the logic:
lwm_jax/recipe/perturb_experiment.py):

  python launch/perturb_experiment.py --config=configs/perturb_experiment.py
  python launch/perturb_experiment.py --config=configs/perturb_experiment.py \
      --config.start=data/world_model --config.workdir=runs/perturb_vs_plain --config.paired=True

One variant, `default` (the experiment has no budgets); every setting is a field below and
`--config.FIELD=VALUE` overrides it. The values are checked when the run starts
(`lwm_jax.recipe.perturb_experiment.resolve`), each error naming its field.
"""
from __future__ import annotations

import os

import ml_collections

from configs import ConfigError, close_matches
from lwm_jax.envs import perturb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("default",)


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """The experiment's settings (the only variant is `default`)."""
  variant = variant or "default"
  if variant not in VARIANTS:
    raise ConfigError(f"no variant '{variant}'{close_matches(variant, list(VARIANTS))}; "
                      f"variants: {', '.join(VARIANTS)}")
  return ml_collections.ConfigDict(dict(
      # --- the models and folders ---
      # Hugging Face folder (with its tokenizer.model) that both SFT runs start from; it is also
      # measured itself, as the `start` row.
      start=os.path.join(ROOT, "data", "world_model"),
      # Model preset of configs/common.py that matches `start`.
      preset="demo",
      # The run folder: corpus copies, the two runs, the fidelity reports and the results.
      workdir=os.path.join(ROOT, "runs", "perturb_vs_plain"),
      # The bundled corpus: its MANIFEST.json gives the seed and size of the regenerated copies,
      # and its test-split seeds give the held-out fidelity episodes.
      corpus=os.path.join(ROOT, "data", "corpus"),
      # Keep what an earlier run left in `workdir` (corpus copies, trained runs, fidelity
      # reports) instead of redoing it.
      reuse=False,
      # --- the two corpus copies ---
      # Comma list of the domains that have real perturbations (by default all of them:
      # lwm_jax.envs.perturb.corpus_menu()).
      domains=",".join(perturb.corpus_menu()),
      # Share of the perturbed copy's episodes played under a perturbation (the plain copy: 0).
      perturb_share=0.5,
      # Trajectories per domain in each copy. 0: as many as the bundled corpus; more: its
      # episodes followed by those of new seeds, split by world as the corpus is, so that the
      # held-out worlds stay out of training.
      per_domain=0,
      # Perturbations of the perturbed copy and of the fidelity runs in place of each domain's
      # fixed menu: DOMAIN=SPEC|SPEC entries joined by && ("": corpus_menu()).
      menu="",
      # Also train the perturbed run on the plain twin (same seed and world, no instruction, from
      # the plain copy) of each of its perturbed training episodes, so that only the instruction
      # separates them; the mixed split goes to WORKDIR/corpus_paired.
      paired=False,
      # --- the two SFT runs (identical apart from their data) ---
      # Targets with or without the <think> block: on, off, or auto (the way `start` was
      # trained, read from its provenance.json).
      thinking="auto",
      # What the <think> blocks of both runs hold: "" the SFT config's own (an empty block), or
      # "instruction": the sample's simulation instruction said again as its template shows it
      # (lwm_jax.data.prompts.instruction_think; thinking mode only). The trained runs are then
      # measured free-running only, since the teacher-forced part renders an empty block they
      # never saw.
      thinking_target="",
      # Render samples in the long form of their prompt variant when it fits (guidance and
      # worked examples after the instruction section).
      long_prompts=True,
      # Steps, rows per step and tokens per row of each SFT run.
      sft_steps=120,
      sft_batch=8,
      sft_seq_len=1024,
      # --- the fidelity measurement (lwm_jax/eval/fidelity.py) ---
      # Held-out episodes per domain and perturbation, and turns per episode at most.
      episodes=4,
      max_turns=6,
      # New tokens per simulated observation at most.
      max_tokens=192,
      # Sampling temperature (0: greedy). An instruction that asks for a rate ("20% of the calls
      # fail") can only show at that rate when the model samples.
      temperature=1.0,
      # Episodes stepped together per engine call.
      batch=16,
  ))
