"""lwm_jax.sampling."""
