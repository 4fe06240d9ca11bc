"""The swe domain: a generated Python package with a bug and its test suite, worked on through developer tools.

`env.py` holds the environment, its scripted agent and `generate_world`; `text.py` the domain's
prompt, guidance, agent and judge text. Importing this package only registers `DOMAIN`; the
environment is imported when first built (`lwm_jax.domains`)."""
from lwm_jax import domains
from lwm_jax.envs.swe import text

DOMAIN = domains.register_domain(domains.Domain(
    name="swe", display="SWE",
    env="lwm_jax.envs.swe.env:SweEnv", agent="lwm_jax.envs.swe.env:SweAgent",
    world="lwm_jax.envs.swe.env:generate_world",
    verifier="lwm_jax.envs.swe.verify:check",
    transcript_verifier="lwm_jax.envs.swe.verify:check_transcript",
    error="lwm_jax.envs.swe.env:error",
    prompt=text.PROMPT, guidance=text.GUIDANCE, agent_world=text.AGENT_WORLD,
    judge_guidance=text.JUDGE_GUIDANCE,
    corpus_check="lwm_jax.envs.swe.env:corpus_problem",
    content="output", gui=False, tool_calls=True))
