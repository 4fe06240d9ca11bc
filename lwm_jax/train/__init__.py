"""lwm_jax.train: training a world model (CPT, SFT and GSPO).

The train state and optimizer, losses, pure jit-compiled train steps, the trainer loop, Orbax
checkpoints of a run, metrics and synthetic batches. May import lwm_jax.model, lwm_jax.data and
lwm_jax.sharding; never sampling, eval, sim or rl.
"""
