"""Agents trained inside the world model, scored in the real environment (docs/agents.md): the
settings of `launch/agent_experiment.py` (the logic: lwm_jax/recipe/agent_experiment.py), one
variant per budget:

  python launch/agent_experiment.py --config=configs/agent_experiment.py:tiny
  python launch/agent_experiment.py --config=configs/agent_experiment.py:full \
      --config.world_model=WM_HF --config.tokenizer=WM_HF/tokenizer.model --config.episodes=256

Variants (budgets): tiny (minutes on a CPU, trains its own tokenizer and a stand-in world model;
its numbers only show the machinery; the default) and full (the experiment). Every setting is a
field below and `--config.FIELD=VALUE` overrides it; the values are checked before the run folder
is touched (`lwm_jax.recipe.agent_experiment.resolve`), each error naming its field.
"""
from __future__ import annotations

import os

import ml_collections

from configs import ConfigError, close_matches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ARMS = ("bc", "real", "sim", "warmup", "bc_from_wm")

# The budget: what differs between the variants. These fields (in this order, then `bc_data`,
# the BC files the run chose) are the budget record each run keeps under "settings" and
# results.json keeps under meta.budget.
BUDGET_FIELDS = ("preset", "vocab", "bc_steps", "wm_steps", "episodes", "seeds", "eval_tasks",
                 "train_tasks", "max_turns", "max_new_tokens", "seq_len", "bc_seq_len",
                 "bc_tasks", "wm_max_new_tokens", "eval_every", "rl_lr", "wm_rl_steps",
                 "wm_rl_lr", "wm_rl_max_new_tokens", "wm_rl_domains")

VARIANTS: dict[str, dict] = {
    # End to end in minutes on a CPU: proves the plumbing, not the method.
    "tiny": dict(preset="tiny", vocab=1024, bc_steps=30, wm_steps=30, episodes=16, seeds=1,
                 eval_tasks=6, train_tasks=8, max_turns=3, max_new_tokens=32, seq_len=2048,
                 bc_seq_len=1024, bc_tasks=0, wm_max_new_tokens=48, eval_every=1, rl_lr=1e-4,
                 wm_rl_steps=4, wm_rl_lr=1e-4, wm_rl_max_new_tokens=32, wm_rl_domains="domain"),
    # The experiment (experiments/agent_rl_search, agent_rl_android).
    "full": dict(preset="demo", vocab=2048, bc_steps=400, wm_steps=300, episodes=512, seeds=3,
                 eval_tasks=64, train_tasks=256, max_turns=6, max_new_tokens=48, seq_len=2048,
                 bc_seq_len=2048, bc_tasks=0, wm_max_new_tokens=384, eval_every=8, rl_lr=3e-5,
                 wm_rl_steps=48, wm_rl_lr=1e-4, wm_rl_max_new_tokens=160, wm_rl_domains="all"),
}


def _common() -> dict:
  return dict(
      # --- where the run reads and writes ---
      # The run folder: replaced when this program made it, else refused unless overwrite.
      # get_config sets runs/agent_<budget>.
      out="",
      # Replace `out` even when this program did not make it.
      overwrite=False,
      # --- what runs ---
      # The variant these values came from (the report's title). A label set by get_config, not
      # a switch: pick another budget with configs/agent_experiment.py:NAME.
      budget="",
      # The environment domain (search and android measured so far; docs/agents.md says why).
      domain="search",
      # Arms to run, a comma list of bc, real, sim, warmup, bc_from_wm ("": none, only the
      # report of the `merge` folders).
      arms="bc,real,sim,warmup",
      # The world model's Hugging Face folder for sim, warmup's world-model arm and bc_from_wm
      # ("": on the tiny budget a stand-in is trained; the other budgets need one for sim and
      # bc_from_wm).
      world_model="",
      # The agent's tokenizer.model (the world model's for the warm-up); "": SentencePiece
      # trained on the domain's corpus.
      tokenizer="",
      # The agent's base checkpoint (Hugging Face folder); "": a fresh model of `preset`.
      base="",
      # The agent RL of the warmup and bc_from_wm arms: real or sim episodes.
      warmup_rl="real",
      # Processes stepping the real environments (0: in this process).
      workers=2,
      # An earlier `out` of this program whose BC runs (bc_SEED, and bc_warm_SEED when there) are
      # copied instead of trained again, with their recorded BC time; "": train them.
      bc_from="",
      # The seeds run are first_seed .. first_seed + seeds - 1.
      first_seed=0,
      # Every seed's RL starts from the BC (and BC from the world model) of this seed, made or
      # reused once, so the seeds differ in the RL only; -1: each seed has its own BC.
      bc_seed=-1,
      # Earlier `out` folders of this program, a comma list of DIR or DIR:ARM+ARM (some arms),
      # whose runs join this one's in the report (an arm's seed may appear once); "": none.
      merge="",
      # BC sample layout (data.pipeline.agent_layout: turns or trajectory; "": the one of
      # configs/agent_bc.py).
      bc_layout="",
      # --- the budget (BUDGET_FIELDS; values per variant) ---
      # Model and shape preset of configs/agent_bc.py and configs/agent_rl.py.
      preset="",
      # SentencePiece vocabulary size (when `tokenizer` is "").
      vocab=0,
      # Behaviour-cloning steps.
      bc_steps=0,
      # SFT steps of the tiny budget's stand-in world model.
      wm_steps=0,
      # Agent-RL episodes per arm, the same for every agent-RL arm.
      episodes=0,
      # Seeds per arm.
      seeds=0,
      # Held-out tasks of every evaluation.
      eval_tasks=0,
      # Training tasks of the agent RL.
      train_tasks=0,
      # Turns per episode, and reply tokens per turn.
      max_turns=0,
      max_new_tokens=0,
      # Tokens per row of the agent RL and the world-model RL.
      seq_len=0,
      # Tokens per row of BC and of the stand-in world model's SFT.
      bc_seq_len=0,
      # Scripted-agent demonstrations on this many training tasks (seeds after the RL's), cloned
      # with the corpus; 0: the corpus alone.
      bc_tasks=0,
      # Tokens per simulated observation of the world model (sim episodes).
      wm_max_new_tokens=0,
      # The simulator's guard against looping observations: off | cut | resample (lwm_jax.sim.env).
      wm_loop_guard="off",
      # Agent-RL trainer steps between held-out evaluations. A rollout of 8 episodes is 4 steps
      # (4 updates per rollout since issue 64), so 64 steps are 128 episodes; runs written with
      # one update per rollout evaluated every eval_every rollouts instead.
      eval_every=0,
      # Agent-RL learning rate, the same for every arm.
      rl_lr=0.0,
      # warmup: world-model GSPO steps (4 per rollout), learning rate and reply tokens.
      wm_rl_steps=0,
      wm_rl_lr=0.0,
      wm_rl_max_new_tokens=0,
      # warmup: the world-model RL pool's domains: "domain" (the agent's) or "all".
      wm_rl_domains="",
  )


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """The settings of budget `variant` (tiny or full; default tiny)."""
  variant = variant or "tiny"
  if variant not in VARIANTS:
    raise ConfigError(f"no variant '{variant}'{close_matches(variant, list(VARIANTS))}; "
                      f"variants: {', '.join(VARIANTS)}")
  values = _common()
  values.update(VARIANTS[variant], budget=variant,
                out=os.path.join(ROOT, "runs", f"agent_{variant}"))
  return ml_collections.ConfigDict(values)
