"""lwm_jax.sampling: KV-cache decoding engine, the Python sampling API and the OpenAI server."""
from lwm_jax.sampling.params import Generation, SamplingParams
from lwm_jax.sampling.parsing import parse_prediction, split_reasoning
from lwm_jax.sampling.sampler import Sampler

__all__ = ["Generation", "SamplingParams", "Sampler", "parse_prediction", "split_reasoning"]
