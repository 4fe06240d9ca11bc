"""lwm_jax: train, serve and evaluate Language World Models for AI agents in JAX."""

__version__ = "0.1.0"
