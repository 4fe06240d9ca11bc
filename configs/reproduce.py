"""The recipe end to end at CPU scale (`make reproduce`, docs/reproduce.md), one preset per budget,
run by `launch/reproduce.py` (the logic: lwm_jax/recipe/reproduce.py):

  python launch/reproduce.py --config=configs/reproduce.py:tiny --config.workdir=runs/reproduce_tiny
  python launch/reproduce.py --config=configs/reproduce.py:full --config.cpt_steps=2000
  python launch/reproduce.py --config=configs/reproduce.py:tiny --plan_only   # plan.json only

Variants (budgets): tiny (an end-to-end smoke run in minutes), full (the 60-minute reproduction),
ablation (the masking and thinking ablations at equal compute, about 35 minutes), long (the
shipped model continued to a 4,608-token context: `make world-model-long`). Every setting is
a field below and `--config.FIELD=VALUE` overrides it; the values are checked when the run starts
(`lwm_jax.recipe.reproduce.resolve`), each error naming its field.
"""
from __future__ import annotations

import os

import ml_collections

from configs import ConfigError, close_matches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What differs between the budgets; every other field has one value for all of them (_common).
VARIANTS: dict[str, dict] = {
    # End to end in a few minutes on 2 CPU cores: proves the plumbing, not the recipe. Compiling
    # dominates such a run, so it compiles with XLA's cheap settings (fast_compile) and skips the
    # training runs' validation pass.
    "tiny": dict(preset="tiny", vocab=1024, seq_len=512, batch=4, sft_seq_len=0, sft_batch=0,
                 cpt_steps=8, sft_steps=4, thinking="on", ablations="", eval_max_turns=1,
                 eval_max_new_tokens=16, eval_batch=8, rl_steps=4, validate=False,
                 fast_compile=True),
    # The 60-minute reproduction on 2 CPU cores (docs/reproduce.md says why these shapes). CPT
    # rows of 2048 tokens carry each trajectory's system prompt about half as often as rows of
    # 1024, so 42% of their tokens are in the loss against 24%; SFT rows stay at 1024, where its
    # one target turn is twice the share of the row. The ablations are their own budget
    # (`ablation`), so this one spends the hour on the main pipeline: 850 CPT steps and the
    # thinking ablation ran 64 minutes (experiments/reproduce_full).
    # CPT takes 1600 steps: on idle cores (1.5-1.7 s a step) the whole run took 51 minutes and its
    # SFT model beat copy-previous in 5 of 7 domains (+8.4 points), where 1000 steps took 40
    # minutes and were ahead in 4 of 7 (-0.7) and 2000 took 66 minutes, over the hour (7 of 7,
    # +12.7; experiments/reproduce_cpt1600, reproduce_cpt2000).
    # SFT takes 300 steps: from the same CPT, 150 left the reply format half learned and scored
    # 35.9 token F1 against 42.2 for 300 (docs/reproduce.md); the run with 300 took 101 minutes
    # on a slow, partly shared host (CPT at 4.1 s a step), so this budget fits the hour only on a
    # quiet, fast one.
    # SFT targets without the (empty) thinking block: from the same CPT, 44.5 token F1 against
    # 42.2 with it on the 140 test turns, 44.2 against 41.8 on 420
    # (experiments/reproduce_thinking_full); thinking="on" trains the paper's thinking mode.
    "full": dict(preset="demo", vocab=2048, seq_len=2048, batch=4, sft_seq_len=1024,
                 sft_batch=8, cpt_steps=1600, sft_steps=300, thinking="off", ablations="",
                 eval_max_turns=20, eval_max_new_tokens=320, eval_batch=32, rl_steps=24,
                 validate=True, fast_compile=False),
    # The ablations at equal compute, smaller than `full` (about 35 minutes): CPT with and without
    # information-theoretic masking and an SFT on each, and an SFT without thinking from the main
    # CPT; the same shapes as `full`.
    "ablation": dict(preset="demo", vocab=2048, seq_len=2048, batch=4, sft_seq_len=1024,
                     sft_batch=8, cpt_steps=200, sft_steps=60, thinking="on",
                     ablations="masking,thinking", eval_max_turns=10, eval_max_new_tokens=320,
                     eval_batch=32, rl_steps=24, validate=True, fast_compile=False),
    # The long-context companion of the shipped model (`make world-model-long`,
    # data/world_model_long/: 4,608 positions, so every bundled AgentWorldBench record fits; the
    # longest prompt is 4,165 tokens): this recipe's CPT and SFT continued from data/world_model
    # in rows of 4,608 tokens, 2 a batch (about the tokens of `full`'s 4 x 2,048), RoPE
    # unchanged, with far copy rows in CPT as the shipped model's last stage had. About 50 minutes
    # on 2 idle cores; it scored 65.5 token F1 against the shipped model's 66.6 on the same 140
    # test turns and copies made-up names less well (experiments/long_context).
    "long": dict(preset="demo", vocab=2048, seq_len=4608, batch=2, sft_seq_len=4608,
                 sft_batch=2, cpt_steps=400, sft_steps=300, cpt_lr=5e-4, sft_lr=3e-4,
                 thinking="off", ablations="", drill_share=0.125, drill_rows="far1024",
                 cpt_from=os.path.join(ROOT, "data", "world_model"), eval_max_turns=20,
                 eval_max_new_tokens=320, eval_batch=32, rl_steps=24, validate=True,
                 fast_compile=False),
}

# The fields that say where the run reads and writes, not what it trains: they stay out of the
# settings recorded in plan.json, the report and a shipped model's provenance.json.
RUN_FIELDS = ("workdir", "overwrite", "corpus", "reuse_from", "ship")


def _common() -> dict:
  return dict(
      # --- where the run reads and writes (RUN_FIELDS) ---
      # The run folder: replaced when launch/reproduce.py made it, else refused unless overwrite.
      workdir=os.path.join(ROOT, "runs", "reproduce"),
      # Replace `workdir` (and `ship`'s folder) even when this program did not make them.
      overwrite=False,
      # The corpus folder whose splits are trained on and evaluated (the bundled one).
      corpus=os.path.join(ROOT, "data", "corpus"),
      # An earlier run folder of this program: its tokenizer and every run whose config (and
      # starting point) equals this plan's are copied instead of trained (e.g. an ablation or SFT
      # variant from the same CPT); the report marks them. "": train everything.
      reuse_from="",
      # Copy the final main model (its Hugging Face export) to this folder with provenance.json
      # (command, settings, corpus sha256, results); `make world-model` ships data/world_model/
      # this way. "": no copy.
      ship="",
      # --- the recipe ---
      # The variant these values came from: written into plan.json and the report's title. A
      # label set by get_config, not a switch: pick another budget with configs/reproduce.py:NAME.
      budget="",
      # Model preset of configs/common.py (demo, tiny, small).
      preset="",
      # SentencePiece vocabulary size.
      vocab=0,
      # CPT rows: tokens per packed row, and rows per batch.
      seq_len=0,
      batch=0,
      # SFT rows: tokens per row and rows per batch (0: the CPT's seq_len / batch).
      sft_seq_len=0,
      sft_batch=0,
      # Steps of each CPT run and of each SFT run.
      cpt_steps=0,
      sft_steps=0,
      # Peak learning rates of CPT and SFT: the one place a stage's rate is set for this run
      # (0: the stage config's own, configs/cpt.py 3e-3 and configs/sft.py 1e-3).
      cpt_lr=0.0,
      sft_lr=0.0,
      # CPT loss: information-theoretic masking (it) or full loss on every observation (full).
      masking="it",
      # SFT targets with (on) or without (off) a <think> block.
      thinking="on",
      # SFT loss on the sample's target observation only (target: the recipe) or on every
      # observation of its kept history too (history; thinking="off" only, where the history
      # replies are written like the target).
      sft_loss="target",
      # Knowledge text mixed into CPT, a comma list: search (the search environment's pages),
      # actions (action spaces), copy (copy drills), lookup (file-tree lookup drills; both
      # lwm_jax/data/drills.py); "" for none.
      knowledge="search,actions",
      # Share of CPT tokens from the knowledge text (0 when `knowledge` is "").
      knowledge_share=0.1,
      # Share of CPT tokens from the copy drill (induction rows of random ids,
      # lwm_jax/data/drills.py), mixed into the same batches as the trajectories; 0: none.
      drill_share=0.0,
      # Row lengths of the copy drill in ids, a comma list (e.g. 64,512: half its tokens in rows
      # of each; far1536: far rows of 1536 ids, copies up to 1536 ids from their sources).
      drill_rows="64",
      # A comma list of masking, thinking, sft_loss: also train the other setting of each at
      # equal compute (same model, steps, batch and sequence length) and report it as a row.
      ablations="",
      # Add the GSPO stage after SFT (needs the RL stage's rollouts), with rl_steps steps.
      rl=False,
      rl_steps=0,
      # A trained model's Hugging Face folder with its tokenizer.model (e.g. an earlier shipped
      # world model): every CPT run continues from it, with its tokenizer, instead of starting
      # from random initialisation. "": random initialisation.
      cpt_from="",
      # Corpus folders of more worlds, comma separated (e.g. `make more-worlds`:
      # tools/make_corpus.py with another seed): their episodes, every split, are added to CPT
      # and SFT training; an episode whose world is in `corpus`'s validation or test split is
      # dropped and counted. "": none.
      more_worlds="",
      # Free-running evaluation: test-split turns per domain (0: all), generated tokens per turn
      # at most, and turns generated together.
      eval_max_turns=0,
      eval_max_new_tokens=0,
      eval_batch=0,
      # Seed of the evaluated turn sample.
      seed=0,
      # A validation loss at the end of each training run.
      validate=True,
      # Compile with XLA's cheap settings (about 3x cheaper compiles, slower steps).
      fast_compile=False,
  )


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """The settings of budget `variant` (tiny, full, ablation or long; default full)."""
  variant = variant or "full"
  if variant not in VARIANTS:
    raise ConfigError(f"no variant '{variant}'{close_matches(variant, list(VARIANTS))}; "
                      f"variants: {', '.join(VARIANTS)}")
  values = _common()
  values.update(VARIANTS[variant], budget=variant)
  return ml_collections.ConfigDict(values)
