"""lwm_jax.envs: the seven real environments, their scripted agents and corpus collection.

`base` holds the Env/Agent API, the plan-following scripted agent and the registry; one module per
domain (terminal, swe, mcp_env + mcp_server, search, web + web_app, android, desktop + ui);
`sandbox` isolates the domains that run real commands (bubblewrap); `recorder` and `collect` turn
episodes into `data.schema.Trajectory` records; `knowledge` gathers the environments' documentation
(the search collection, action spaces) as plain documents for CPT. May import lwm_jax.data; nothing above it.
"""
