"""The mcp domain: a business database behind the tools of a real MCP server (`server.py`, run over stdio by `env.py`).

`env.py` holds the environment, its scripted agent and `generate_world`; `text.py` the domain's
prompt, guidance, agent and judge text. Importing this package only registers `DOMAIN`; the
environment is imported when first built (`lwm_jax.domains`)."""
from lwm_jax import domains
from lwm_jax.envs.mcp import text

DOMAIN = domains.register_domain(domains.Domain(
    name="mcp", display="MCP",
    env="lwm_jax.envs.mcp.env:McpEnv", agent="lwm_jax.envs.mcp.env:McpAgent",
    world="lwm_jax.envs.mcp.env:generate_world",
    verifier="lwm_jax.envs.mcp.verify:check",
    transcript_verifier="lwm_jax.envs.mcp.verify:check_transcript",
    error="lwm_jax.envs.mcp.env:error",
    prompt=text.PROMPT, guidance=text.GUIDANCE, agent_world=text.AGENT_WORLD,
    judge_guidance=text.JUDGE_GUIDANCE,
    corpus_check="lwm_jax.envs.mcp.env:corpus_problem",
    content="json", gui=False, tool_calls=True,
    real_perturbations=("errors", "page_size", "withhold", "partial", "rate_limit", "stale"),
    corpus_perturbations=("errors:rate=0.2,kind=timeout", "page_size:size=3", "withhold:fields=email",
                           "rate_limit:limit=4,retry_after=30", "stale:refresh=0",
                           "errors:rate=0.3,kind=unavailable; page_size:size=5")))
