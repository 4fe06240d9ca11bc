"""lwm_jax.rl: reinforcement learning of world models and of agents.

Rewards (`rewards`: rule verifiers, the judge's rubric, judge-free similarity, their mix; `replay`:
actions re-run in the real environment) and the anti-hacking guard (`guard`); the RL prompt pool
and the CPT/SFT/RL split (`pool`); the rollout source that feeds the trainer (`rollout`), built
from a config (`stage`), with held-out evaluation (`heldout`); rejection sampling of SFT
reasoning traces (`rejection`). May import train, sampling, data, envs (replay), lwm_jax.judge
and lwm_jax.eval.metrics (the judge-free similarities); meets sim only through the Env
interface. Nothing imports rl.
"""
