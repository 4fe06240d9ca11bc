"""The search domain: a full-text search engine (SQLite FTS) over generated document collections (`worlds.py`).

`env.py` holds the environment, its scripted agent and `generate_world`; `text.py` the domain's
prompt, guidance, agent and judge text. Importing this package only registers `DOMAIN`; the
environment is imported when first built (`lwm_jax.domains`)."""
from lwm_jax import domains
from lwm_jax.envs.search import text

DOMAIN = domains.register_domain(domains.Domain(
    name="search", display="Search",
    env="lwm_jax.envs.search.env:SearchEnv", agent="lwm_jax.envs.search.env:SearchAgent",
    world="lwm_jax.envs.search.env:generate_world",
    verifier="lwm_jax.envs.search.verify:check",
    transcript_verifier="lwm_jax.envs.search.verify:check_transcript",
    error="lwm_jax.envs.search.env:error",
    prompt=text.PROMPT, guidance=text.GUIDANCE, agent_world=text.AGENT_WORLD,
    judge_guidance=text.JUDGE_GUIDANCE,
    content="free", gui=False, tool_calls=False,
    real_perturbations=("errors", "page_size", "withhold", "rate_limit"),
    withhold_fields=("title", "snippet", "score"),
    corpus_perturbations=("errors:rate=0.2,kind=server_error", "page_size:size=2", "withhold:fields=snippet",
                           "withhold:fields=score+snippet", "rate_limit:limit=5,retry_after=20")))
