"""Samples from a checkpoint on the command line.

  python launch/sample.py --checkpoint=DIR --prompt="ls -la" --max_tokens=128
  python launch/sample.py --checkpoint=DIR --messages=chat.json --temperature=0.6 --n=3

--prompt is sent as one user message (or raw text with --raw); --messages is a JSON file with a list
of {"role", "content"} messages. Prints each choice, its reasoning and the parsed prediction.
"""
import json
import sys

from absl import app, flags


flags.DEFINE_string("checkpoint", None, "workdir, step folder or Hugging Face folder")
flags.DEFINE_string("tokenizer", None, "tokenizer file/folder (default: what the checkpoint names)")
flags.DEFINE_string("prompt", None, "the user message (or raw text with --raw)")
flags.DEFINE_string("messages", None, "JSON file with a list of chat messages")
flags.DEFINE_bool("raw", False, "send --prompt as raw text, without the chat template")
flags.DEFINE_float("temperature", 0.6, "0 = greedy")
flags.DEFINE_float("top_p", 1.0, "nucleus sampling")
flags.DEFINE_integer("top_k", 0, "top-k sampling (0 = off)")
flags.DEFINE_integer("max_tokens", 256, "new tokens at most")
flags.DEFINE_integer("n", 1, "choices")
flags.DEFINE_integer("seed", 0, "random seed")
flags.DEFINE_bool("json", False, "print one JSON object per choice")
flags.DEFINE_string("decode_dtype", "", "decode weight dtype, e.g. bfloat16 (faster on CPU; logits "
                    "within bfloat16 rounding); '' keeps the checkpoint's")
flags.mark_flags_as_required(["checkpoint"])


def main(argv):
  del argv
  from lwm_jax.sampling.params import SamplingParams  # pylint: disable=import-outside-toplevel
  from lwm_jax.data.reply import parse_prediction  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.sampler import Sampler  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  if f.messages:
    with open(f.messages) as fh:
      prompt = json.load(fh)
  elif f.prompt is not None:
    prompt = f.prompt if f.raw else [{"role": "user", "content": f.prompt}]
  else:
    print("error: give --prompt or --messages", file=sys.stderr)
    sys.exit(2)
  try:
    sampler = Sampler.from_checkpoint(f.checkpoint, tokenizer=f.tokenizer,
                                      decode_dtype=f.decode_dtype or None)
    gens = sampler.generate([prompt], SamplingParams(
        temperature=f.temperature, top_p=f.top_p, top_k=f.top_k, max_new_tokens=f.max_tokens,
        n=f.n, seed=f.seed))
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  for i, g in enumerate(gens):
    if f.json:
      print(json.dumps({"index": i, "text": g.text, "finish_reason": g.finish_reason,
                        "completion_tokens": g.completion_tokens,
                        "prediction": parse_prediction(g.text)}, ensure_ascii=False))
    else:
      print(f"=== choice {i} ({g.completion_tokens} tokens, {g.finish_reason})")
      if g.reasoning:
        print(f"--- reasoning\n{g.reasoning}")
      print(f"--- prediction\n{parse_prediction(g.text)}")


if __name__ == "__main__":
  app.run(main)
