"""lwm_jax.eval."""
