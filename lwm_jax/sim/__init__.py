"""lwm_jax.sim: a trained world model used as an environment (`SimulatedEnv`).

Offers the same reset/step/describe/close API as lwm_jax.envs, so an agent, or RL on simulated
environments, cannot tell it from a real one. May import data, envs (the Env interface) and
sampling; never train, eval or rl.
"""
