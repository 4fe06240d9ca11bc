"""lwm_jax.recipe: experiments run end to end over a config of `configs`: `reproduce` (the recipe:
tokenizer, CPT, SFT, optional GSPO, free-running evaluation, report and ship; configs/reproduce.py),
`agent_experiment` (agents trained inside the world model, scored in the real environment;
configs/agent_experiment.py), `rl_experiment` (GSPO against a keep-doing-SFT control;
configs/rl_experiment.py) and `perturb_experiment` (fine-tuning on perturbed trajectories against
plain; configs/perturb_experiment.py). It sits above train, eval and rl, and reads the stage presets of
`configs`; nothing below it imports it."""
