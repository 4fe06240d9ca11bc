"""The terminal domain: a sandboxed bash session over a generated file tree (`worlds.py`).

`env.py` holds the environment, its scripted agent and `generate_world`; `text.py` the domain's
prompt, guidance, agent and judge text. Importing this package only registers `DOMAIN`; the
environment is imported when first built (`lwm_jax.domains`)."""
from lwm_jax import domains
from lwm_jax.envs.terminal import text

DOMAIN = domains.register_domain(domains.Domain(
    name="terminal", display="Term.",
    env="lwm_jax.envs.terminal.env:TerminalEnv", agent="lwm_jax.envs.terminal.env:TerminalAgent",
    world="lwm_jax.envs.terminal.env:generate_world",
    verifier="lwm_jax.envs.terminal.verify:check",
    transcript_verifier="lwm_jax.envs.terminal.verify:check_transcript",
    error="lwm_jax.envs.terminal.env:error",
    prompt=text.PROMPT, guidance=text.GUIDANCE, agent_world=text.AGENT_WORLD,
    judge_guidance=text.JUDGE_GUIDANCE,
    content="output", gui=False, tool_calls=False,
    finish_actions=("exit", "logout")))
