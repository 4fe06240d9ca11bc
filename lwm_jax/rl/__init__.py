"""lwm_jax.rl: reinforcement learning of world models and of agents.

Rewards (`rewards`: rule verifiers, the judge's rubric, judge-free similarity, their mix; `replay`:
actions re-run in the real environment) and the anti-hacking guard (`guard`); the RL prompt pool
and the CPT/SFT/RL split (`pool`); the rollout worker both RL kinds share (`worker`: sampler,
live-parameter sync, group credit, KL reference, mini-batches, the reward protocol) and the
world-model rollout source on it (`rollout`), built from a config (`stage`), with held-out
evaluation (`heldout`); rejection sampling of SFT reasoning traces (`rejection`); agents trained
by behaviour cloning and multi-turn GSPO (a second source on the same worker) against real or
simulated environments (`agent_episodes`, `agent_envs`, `agent_stage`). May import train,
sampling, data, envs (replay, verifiers), sim (simulated episodes for Sim RL), lwm_jax.judge and
lwm_jax.textsim (the judge-free similarities). Nothing imports rl.
"""
