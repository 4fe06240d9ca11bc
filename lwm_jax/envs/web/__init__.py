"""The web domain: a real web shop (`app.py`, http.server on loopback) seen as the browser's accessibility tree.

`env.py` holds the environment, its scripted agent and `generate_world`; `text.py` the domain's
prompt, guidance, agent and judge text. Importing this package only registers `DOMAIN`; the
environment is imported when first built (`lwm_jax.domains`)."""
from lwm_jax import domains
from lwm_jax.envs.web import text

DOMAIN = domains.register_domain(domains.Domain(
    name="web", display="Web",
    env="lwm_jax.envs.web.env:WebEnv", agent="lwm_jax.envs.web.env:WebAgent",
    world="lwm_jax.envs.web.env:generate_world",
    verifier="lwm_jax.envs.web.verify:check",
    transcript_verifier="lwm_jax.envs.web.verify:check_transcript",
    screen="lwm_jax.envs.web.env:screen", error="lwm_jax.envs.web.env:error",
    prompt=text.PROMPT, guidance=text.GUIDANCE, agent_world=text.AGENT_WORLD,
    judge_guidance=text.JUDGE_GUIDANCE,
    content="tree", gui=True, tool_calls=False,
    real_perturbations=("errors", "page_size", "partial", "rate_limit"),
    corpus_perturbations=("errors:rate=0.15,kind=unavailable", "partial:rate=0.4", "page_size:size=2",
                           "errors:rate=0.1,kind=timeout; partial:rate=0.3")))
