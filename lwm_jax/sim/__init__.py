"""lwm_jax.sim."""
