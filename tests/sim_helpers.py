"""Shared by the simulated-environment tests: a tiny random world model behind the real Sampler.

Batches of up to 4 episodes with prompts under 512 tokens share one compiled shape, so a test file
compiles the model about once (larger batches add a shape per power of two)."""
from __future__ import annotations

from flax import nnx

from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.params import SamplingParams
from lwm_jax.sampling.sampler import Sampler
from lwm_jax.sim.env import World
from tests.test_sampling import qwen_tokenizer_path

ENGINE = dict(max_batch=16, min_batch_bucket=4, min_prompt_bucket=512, prefill_chunk=512,
              min_cache_len=768, chunk_steps=8, decode_layout="model")
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)


def tiny_model():
  return Transformer(get_preset("tiny", vocab_size=151936), rngs=nnx.Rngs(0))


def tiny_sampler() -> Sampler:
  return Sampler(tiny_model(), load_tokenizer(qwen_tokenizer_path()), **ENGINE)


def save_tiny_checkpoint(directory: str) -> str:
  """A Hugging Face folder (config, safetensors, the Qwen tokenizer) of the tiny random model."""
  from lwm_jax import hf
  hf.save_pretrained(tiny_model(), directory, tokenizer=qwen_tokenizer_path())
  return directory


def terminal_world(**kw) -> World:
  fields = dict(domain="terminal", task="Count the lines of notes.txt.",
                action_space="One bash command per turn.", initial_state="user@box:~$ ")
  return World(**(fields | kw))
