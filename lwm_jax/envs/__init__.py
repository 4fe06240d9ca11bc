"""lwm_jax.envs: the real environments, one folder per domain, and what they share.

Each domain's folder (`terminal`, `swe`, `search`, `mcp`, `web`, `android`, `desktop` for the os
domain) holds its environment, scripted agent and world generator (`env.py`, with helpers such as
`worlds.py`), its task verifiers (`verify.py`), its text (`text.py`) and, in `__init__.py`, the
`lwm_jax.domains.Domain` record it registers. Shared here: `base` (the Env/Agent API and
`make_env` / `make_agent` through the registry), `sandbox`, `seccomp`, `confined` and
`sandbox_limits` (isolating the domains that run real commands), `recorder` and `collect` (episodes
into `data.schema.Trajectory` records), `perturb` (the perturbation catalogue), `verify` and
`verify_transcript` (verdicts, dispatching to each domain's checks), `worlds` (world census),
`ui` (the widget trees of the android and os screens) and `knowledge` (the environments'
documentation as plain documents for CPT). May import lwm_jax.data and lwm_jax.domains.
"""
