"""OpenAI-compatible server for a checkpoint.

  python launch/serve.py --checkpoint=DIR --port=8000

DIR is a training workdir (its latest checkpoint is served), a checkpoint step folder, or a Hugging
Face folder (config.json + *.safetensors + tokenizer.json). Try it with
`curl localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "hi"}]}'`.

Start-up: compiled shapes are kept in JAX's persistent compilation cache (--compilation_cache:
auto = ~/.cache/lwm_jax/jax_cache, a folder, or off), so a restart reads them instead of compiling.
The server listens at once and compiles the engine's shapes for prompts up to --warmup_prompt_len
tokens, the default max_tokens and the whole context (--warmup_max_tokens adds other budgets): a
lone request's shapes
first, after which /health (and /ping) answer 200 and requests are served, then the larger batch
buckets up to --max_batch in the background, beside the batches being served. Before it is ready, /health answers
503 with what is compiling, and generation requests get 503 (as a vLLM server that is not up yet
cannot serve them). --nowarmup_background compiles everything before listening (the old way);
--nowarmup skips the warm-up (the first requests of each new shape then wait for their
compilation).

Engines (--engine): "continuous" (default) keeps --num_slots decode slots (default --max_batch) of
--cache_len positions that requests enter as soon as a slot frees and leave as soon as they finish,
and reuses prompt prefixes through a cache bounded by --prefix_cache_mb; "static" collects the
requests that arrive within --window_ms and decodes them as one batch to its longest reply.
"""
import logging
import os
import sys

from absl import app, flags


flags.DEFINE_string("checkpoint", None, "workdir, step folder or Hugging Face folder")
flags.DEFINE_string("tokenizer", None, "tokenizer file/folder (default: what the checkpoint names)")
flags.DEFINE_string("host", "127.0.0.1", "address to listen on")
flags.DEFINE_integer("port", 8000, "port", lower_bound=1, upper_bound=65535)
flags.DEFINE_string("model_name", None, "model id reported by /v1/models (default: folder name)")
flags.DEFINE_integer("max_batch", 32, "most rows decoded together", lower_bound=1)
flags.DEFINE_float("window_ms", 10.0, "how long the batcher waits for requests to arrive together")
flags.DEFINE_integer("max_tokens", None, "default max_tokens when a request gives none "
                     "(default: generation_config.json's max_new_tokens, else 1024)")
flags.DEFINE_string("compilation_cache", "auto",
                    "JAX persistent compilation cache: auto (~/.cache/lwm_jax/jax_cache), a "
                    "folder, or off")
flags.DEFINE_boolean("warmup_background", True,
                     "listen at once; compile a lone request's shapes, then report ready and "
                     "compile the rest while serving")
flags.DEFINE_integer("max_rows_per_request", 0,
                     "most sequences one request may ask for (n x prompts); 0: --max_batch")
flags.DEFINE_boolean("warmup", True, "compile the engine's shapes before serving")
flags.DEFINE_integer("warmup_prompt_len", 512, "longest prompt (tokens) the warm-up covers")
flags.DEFINE_list("warmup_max_tokens", [], "token budgets the warm-up covers besides --max_tokens")
flags.DEFINE_enum("engine", "continuous", ["continuous", "static"],
                  "continuous: decode slots that requests enter and leave, shared prefixes; "
                  "static: batches collected for --window_ms run to their longest reply")
flags.DEFINE_integer("num_slots", 0, "continuous engine: rows decoded together (0: --max_batch)",
                     lower_bound=0)
flags.DEFINE_integer("cache_len", 0, "continuous engine: positions per slot, the longest prompt "
                     "plus reply served (0: the model's context)", lower_bound=0)
flags.DEFINE_integer("prefill_batch_tokens", 512, "continuous engine: the most padded prompt "
                     "tokens prefilled together in one call (prompts of similar length that wait "
                     "for slots share a call; longer ones go alone)")
flags.DEFINE_float("prefix_cache_mb", 256.0, "continuous engine: memory bound of the prefix "
                   "cache in MiB (0: off)", lower_bound=0.0)
flags.DEFINE_integer("chunk_steps", 16, "decode steps per jit call (streaming granularity)")
flags.DEFINE_string("mesh", "", "mesh axis sizes, e.g. 'tensor=4,expert=2' (default: one device)")
flags.DEFINE_string("decode_layout", "auto",
                    "weights for decode steps: rows (a copy laid out for CPU decoding), model (the "
                    "model itself), or auto (rows on CPU without --mesh)")
flags.DEFINE_string("decode_dtype", "",
                    "dtype of the rows copy, e.g. bfloat16 (half the bytes per step; logits within "
                    "bfloat16 rounding); '' keeps the checkpoint's")
flags.DEFINE_string("decode_moe_backend", "auto",
                    "with --decode_layout=model: MoE backend for decode steps: auto (capacity on "
                    "CPU), capacity, blocked, ragged_dot, dense, or '' for the model's own")
flags.mark_flags_as_required(["checkpoint"])


def parse_mesh(spec: str):
  from lwm_jax import sharding  # pylint: disable=import-outside-toplevel
  if not spec:
    return None
  sizes = {}
  for part in spec.split(","):
    k, _, v = part.partition("=")
    if k.strip() not in sharding.MESH_AXES or not v.strip().lstrip("-").isdigit():
      raise ValueError(f"--mesh: bad entry '{part}' (expected axis=size, axes "
                       f"{sharding.MESH_AXES})")
    sizes[k.strip()] = int(v)
  return sharding.make_mesh(**sizes)


def main(argv):
  del argv
  import uvicorn  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.sampler import Sampler  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling import compile_cache  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.server import (BackgroundWarmup, create_app,  # pylint: disable=import-outside-toplevel
                                       default_max_tokens_for, warmup)
  logging.getLogger().setLevel(logging.INFO)
  f = flags.FLAGS
  compile_cache.enable(f.compilation_cache)
  try:
    extra = {} if f.engine == "static" else dict(
        num_slots=f.num_slots or None, cache_len=f.cache_len or None,
        prefix_cache_mb=f.prefix_cache_mb, prefill_batch_tokens=f.prefill_batch_tokens)
    sampler = Sampler.from_checkpoint(f.checkpoint, tokenizer=f.tokenizer, mesh=parse_mesh(f.mesh),
                                      engine=f.engine, **extra,
                                      chunk_steps=f.chunk_steps, max_batch=max(f.max_batch, 1),
                                      decode_layout=f.decode_layout,
                                      decode_dtype=f.decode_dtype or None,
                                      decode_moe_backend=f.decode_moe_backend or None)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  name = f.model_name or os.path.basename(os.path.abspath(f.checkpoint).rstrip("/"))
  max_tokens = default_max_tokens_for(sampler, f.max_tokens)
  ready = None
  if f.warmup:
    try:
      # The default budget, and the whole context: what a client asking for more than the
      # context leaves gets (the official client asks for 32768).
      budgets = sorted({max_tokens, sampler.engine.context} |
                       {int(x) for x in f.warmup_max_tokens})
    except ValueError:
      print(f"error: --warmup_max_tokens: expected integers, got {f.warmup_max_tokens}",
            file=sys.stderr)
      sys.exit(2)
    if f.warmup_background:
      engine = sampler.engine
      sizes, x = [], engine.min_batch_bucket
      while x < min(f.max_batch, engine.max_batch):
        sizes.append(x)
        x *= 2
      sizes.append(x)
      plans = engine.warmup_plans(f.warmup_prompt_len, budgets, batch_sizes=sizes)
      # a lone request's shapes first: the smallest batch. The continuous engine: the largest
      # prefill shape of one prompt and the largest decode window of the smallest slot bucket,
      # which hold every lone request (until the rest is compiled the engine runs a call in the
      # smallest compiled shape that holds it: more padding instead of a wait); it compiles the
      # rest without holding up requests, in order, and a request that needs a shape nothing
      # compiled holds (more rows) compiles it on the spot.
      if getattr(engine, "compile_plan", None):
        whole = (1, "prefill", min(engine.prefill_chunk, engine.cache_len),
                 engine.cache_len)  # any prompt, in chunks
        decodes = [p for p in plans if p[1] == "decode" and p[0] == sizes[0]]
        first = [whole, max(decodes, key=lambda p: p[2])]
        # then one slot's smaller windows (a lone reply decodes many steps, its prefill is one
        # call), then the rest in order
        plans = first + sorted(decodes, key=lambda p: p[2])[:-1] + [
            p for p in plans if p not in first and p not in decodes]
        lone = [p in first for p in plans]
      else:
        lone = [p[0] == sizes[0] for p in plans]
      ready = BackgroundWarmup(sampler, [p for p, o in zip(plans, lone) if o],
                               [p for p, o in zip(plans, lone) if not o]).start()
      ready = ready.state
    else:
      warmup(sampler, f.max_batch, f.warmup_prompt_len, budgets)
  uvicorn.run(create_app(sampler, name, max_batch=f.max_batch, window_ms=f.window_ms,
                         default_max_tokens=max_tokens,
                         max_rows_per_request=f.max_rows_per_request or None, ready=ready),
              host=f.host, port=f.port)


if __name__ == "__main__":
  app.run(main)
