"""The android domain: a simulated phone's apps (contacts, clock, settings, notes) seen as a view hierarchy.

`env.py` holds the environment, its scripted agent and `generate_world`; `text.py` the domain's
prompt, guidance, agent and judge text. Importing this package only registers `DOMAIN`; the
environment is imported when first built (`lwm_jax.domains`)."""
from lwm_jax import domains
from lwm_jax.envs.android import text

DOMAIN = domains.register_domain(domains.Domain(
    name="android", display="Android",
    env="lwm_jax.envs.android.env:AndroidEnv", agent="lwm_jax.envs.android.env:AndroidAgent",
    world="lwm_jax.envs.android.env:generate_world",
    verifier="lwm_jax.envs.android.verify:check",
    transcript_verifier="lwm_jax.envs.android.verify:check_transcript",
    screen="lwm_jax.envs.android.env:screen", error="lwm_jax.envs.android.env:error",
    prompt=text.PROMPT, guidance=text.GUIDANCE, agent_world=text.AGENT_WORLD,
    judge_guidance=text.JUDGE_GUIDANCE,
    content="tree", gui=True, tool_calls=False))
