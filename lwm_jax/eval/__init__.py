"""lwm_jax.eval: evaluating world models on AgentWorldBench.

Reading benchmark records, resumable inference and judging runs (the judge itself is
`lwm_jax.judge`, the model backends `lwm_jax.sampling.backends`), scoring, judge-free metrics,
reports, held-out teacher-forced accuracy, and free-running evaluation of held-out trajectories
(`free_running`). May import data, model, sampling and the judge;
never train, sim or rl.
"""
