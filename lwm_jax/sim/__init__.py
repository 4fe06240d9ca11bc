"""lwm_jax.sim: a trained world model used as an environment.

- `env`: `World` (what is simulated), `SimulatedEnv` (a `base.Env` with episode state: finish
  action, turn limit, verifier reward, info), `step_many` / `SimulatedBatch` (many episodes per
  engine call);
- `gymnasium_env`: the `gymnasium.Env` face;
- `perturb`: the catalogue of simulation instructions (errors, pages, withheld fields, ...);
- `server` + `client`: the HTTP environment server (`launch/sim_serve.py`) and its Python client;
- `mcp_sim`: an MCP server whose tools are answered by the world model.

Offers the same reset/step/describe/close API as lwm_jax.envs, so an agent, or RL on simulated
environments, cannot tell it from a real one. May import data, envs (the Env interface) and
sampling; never train, eval or rl.
"""
