"""lwm_jax.envs."""
