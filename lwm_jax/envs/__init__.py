"""lwm_jax.envs: real local environments that produce genuine trajectories.

One per domain (terminal, mcp, search, swe, android, web, os) behind the `base.Env` API, the
scripted agents that drive them, and the recorder and parallel collector that write trajectory
JSONL. May import lwm_jax.data (the schema); not model, train, sampling, eval, sim or rl.
"""
