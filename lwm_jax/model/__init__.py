"""lwm_jax.model."""
