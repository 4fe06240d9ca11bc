"""lwm_jax.sampling: generating text with a trained model.

The KV-cache decoding engine, the Python `Sampler` API, the OpenAI-compatible server, and model
backends (our Sampler, an OpenAI-compatible endpoint, a function) that eval, the judge and RL call.
May import lwm_jax.model, lwm_jax.data (tokenizer, reply format) and lwm_jax.sharding; never train,
eval, sim or rl.
"""
from lwm_jax.sampling.params import Generation, SamplingParams
from lwm_jax.sampling.sampler import Sampler

__all__ = ["Generation", "SamplingParams", "Sampler"]
