"""lwm_jax.model: the decoder-only MoE transformer of the Qwen3-MoE and Qwen3.5-MoE families.

Configuration and presets, layers, attention, Gated DeltaNet, the mixture-of-experts layer, the
transformer, its decode-time weight layout and its parameter and FLOP counts. May import
lwm_jax.sharding only; nothing above it (data, train, sampling, eval, sim, rl).
"""
