"""The os domain: a desktop (file manager, text editor, settings) seen as an accessibility tree; its domain name is "os", the folder's is `desktop` so that it never shadows the standard library's `os`.

`env.py` holds the environment, its scripted agent and `generate_world`; `text.py` the domain's
prompt, guidance, agent and judge text. Importing this package only registers `DOMAIN`; the
environment is imported when first built (`lwm_jax.domains`)."""
from lwm_jax import domains
from lwm_jax.envs.desktop import text

DOMAIN = domains.register_domain(domains.Domain(
    name="os", display="OS",
    env="lwm_jax.envs.desktop.env:DesktopEnv", agent="lwm_jax.envs.desktop.env:DesktopAgent",
    world="lwm_jax.envs.desktop.env:generate_world",
    verifier="lwm_jax.envs.desktop.verify:check",
    transcript_verifier="lwm_jax.envs.desktop.verify:check_transcript",
    screen="lwm_jax.envs.desktop.env:screen", error="lwm_jax.envs.desktop.env:error",
    prompt=text.PROMPT, guidance=text.GUIDANCE, agent_world=text.AGENT_WORLD,
    judge_guidance=text.JUDGE_GUIDANCE,
    content="tree", gui=True, tool_calls=False))
