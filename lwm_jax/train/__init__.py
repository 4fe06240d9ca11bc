"""lwm_jax.train."""
