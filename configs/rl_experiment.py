"""GSPO with real rollouts against a "keep doing SFT" control, on one CPU (experiments/gspo_vs_sft):
the settings of `launch/rl_experiment.py` (the logic: lwm_jax/recipe/rl_experiment.py).

  python launch/rl_experiment.py --config=configs/rl_experiment.py --config.rl_steps=96
  python launch/rl_experiment.py --config=configs/rl_experiment.py \
      --config.start=data/world_model --config.workdir=runs/gspo_from_wm

One variant (`default`, also what `get_config()` gives): the experiment's own settings. Every
setting is a field below and `--config.FIELD=VALUE` overrides it; the values are checked before
the run folder is touched (`lwm_jax.recipe.rl_experiment.resolve`), each error naming its field.
"""
from __future__ import annotations

import os

import ml_collections

from configs import ConfigError, close_matches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS: dict[str, dict] = {"default": {}}

# The fields results.json records under settings.flags (in this order): what a reader needs to
# rerun it, beside the resolved configs of the GSPO run and of the control.
RECORDED = ("workdir", "corpus", "fractions", "vocab", "cpt_steps", "sft_steps", "rl_steps",
            "max_new_tokens", "eval_prompts", "curve_prompts", "rl_lr", "start", "reuse_start")


def _common() -> dict:
  return dict(
      # The run folder: replaced when this program made it (kept with reuse_start), else refused
      # unless overwrite.
      workdir=os.path.join(ROOT, "runs", "gspo_vs_sft"),
      # Replace `workdir` even when this program did not make it.
      overwrite=False,
      # The corpus folder (its train, validation and test splits): the bundled one.
      corpus=os.path.join(ROOT, "data", "corpus"),
      # CPT / SFT / RL pool fractions of the training split (without `start`).
      fractions="cpt=0.45,sft=0.35,rl=0.2",
      # SentencePiece vocabulary size of the tokenizer trained for the start.
      vocab=2048,
      # CPT and SFT steps of the start (without `start`).
      cpt_steps=80,
      sft_steps=40,
      # GSPO optimizer steps (4 per rollout).
      rl_steps=48,
      # Reply tokens per rollout and per evaluation.
      max_new_tokens=160,
      # Test-split prompts of the final evaluation.
      eval_prompts=48,
      # Held-out prompts of GSPO's periodic evaluation.
      curve_prompts=16,
      # GSPO learning rate.
      rl_lr=3e-4,
      # Keep an SFT start already in `workdir` instead of training it again.
      reuse_start=False,
      # An SFT model's Hugging Face folder (with tokenizer.model) to start from; the RL pool is
      # then the validation split. "": train the start (CPT and SFT on the corpus's pools).
      start="",
  )


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """The settings of `variant` (default: the only one)."""
  variant = variant or "default"
  if variant not in VARIANTS:
    raise ConfigError(f"no variant '{variant}'{close_matches(variant, list(VARIANTS))}; "
                      f"variants: {', '.join(VARIANTS)}")
  values = _common()
  values.update(VARIANTS[variant])
  return ml_collections.ConfigDict(values)
