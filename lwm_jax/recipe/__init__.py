"""lwm_jax.recipe: the recipe run end to end (`reproduce`: tokenizer, CPT, SFT, optional GSPO,
free-running evaluation, report and ship) over a config of configs/reproduce.py. It sits above
train, eval and rl, and reads the stage presets of `configs`; nothing below it imports it."""
