"""Simulated environments over HTTP: a world model serves episodes to agents in any language.

  python launch/sim_serve.py --checkpoint=runs/demo/sft --port=8100

DIR is a training workdir, a checkpoint step folder or a Hugging Face folder (as for serve.py).
Create an episode, step it, close it:

  curl -s localhost:8100/v1/episodes -d '{"world": {"domain": "terminal", "task": "Count the
    lines of notes.txt", "action_space": "bash commands", "initial_state": "user@box:~$ "},
    "perturb": "errors:rate=0.2,kind=timeout"}'
  curl -s localhost:8100/v1/episodes/EPISODE_ID/step -d '{"action": "wc -l notes.txt"}'
  curl -s -X DELETE localhost:8100/v1/episodes/EPISODE_ID

Steps of concurrent episodes are decoded together on one engine (`lwm_jax/sim/server.py` lists
the endpoints and errors; `lwm_jax/sim/client.py` is the Python client).
"""
import logging
import sys

from absl import app, flags


flags.DEFINE_string("checkpoint", None, "workdir, step folder or Hugging Face folder")
flags.DEFINE_string("tokenizer", None, "tokenizer file/folder (default: what the checkpoint names)")
flags.DEFINE_string("host", "127.0.0.1", "address to listen on")
flags.DEFINE_integer("port", 8100, "port")
flags.DEFINE_integer("max_batch", 32, "most episode steps decoded together")
flags.DEFINE_float("window_ms", 20.0, "how long the batcher waits for steps to arrive together")
flags.DEFINE_integer("max_tokens", 256, "default token budget of one observation (with thinking)")
flags.DEFINE_integer("max_turns", 50, "default turn limit of an episode")
flags.DEFINE_integer("max_episodes", 1024, "most episodes open at once")
flags.DEFINE_string("trajectory_root", "", "folder whose trajectory files requests may name "
                    "(default: the working directory)")
flags.DEFINE_string("decode_layout", "auto", "rows, model or auto (as for serve.py)")
flags.DEFINE_string("decode_dtype", "", "dtype of the rows copy, e.g. bfloat16")
flags.mark_flags_as_required(["checkpoint"])


def main(argv):
  del argv
  import uvicorn  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.sampler import Sampler  # pylint: disable=import-outside-toplevel
  from lwm_jax.sim.server import create_app  # pylint: disable=import-outside-toplevel
  logging.getLogger().setLevel(logging.INFO)
  f = flags.FLAGS
  bad = [f"--{n} must be at least 1, got {getattr(f, n)}" for n in
         ("max_batch", "max_tokens", "max_turns", "max_episodes") if getattr(f, n) < 1]
  if not 1 <= f.port <= 65535:
    bad.append(f"--port must be in 1..65535, got {f.port}")
  if bad:
    print(f"error: {bad[0]}", file=sys.stderr)
    sys.exit(2)
  try:
    sampler = Sampler.from_checkpoint(f.checkpoint, tokenizer=f.tokenizer,
                                      max_batch=max(f.max_batch, 1),
                                      decode_layout=f.decode_layout,
                                      decode_dtype=f.decode_dtype or None)
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  api = create_app(sampler, max_batch=f.max_batch, window_ms=f.window_ms,
                   max_tokens=f.max_tokens, max_turns=f.max_turns, max_episodes=f.max_episodes,
                   trajectory_root=f.trajectory_root or None)
  logging.info("simulated environments on http://%s:%d (checkpoint %s)", f.host, f.port,
               f.checkpoint)
  uvicorn.run(api, host=f.host, port=f.port, log_level="warning")


if __name__ == "__main__":
  app.run(main)
