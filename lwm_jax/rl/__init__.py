"""lwm_jax.rl: reinforcement learning of world models and of agents.

Rewards (rule-based, the judge's rubric, their mix), rollout sources that feed the trainer, and
rejection sampling. May import train, sampling, data and lwm_jax.judge; meets sim only through
the Env interface. Nothing imports rl.
"""
