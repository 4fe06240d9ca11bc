"""lwm_jax.data."""
