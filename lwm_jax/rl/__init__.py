"""lwm_jax.rl."""
